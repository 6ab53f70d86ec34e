"""`epiflow dataset export`: a snapshot as a Hugging Face `datasets` directory that
`load_from_disk` reads back, its parquet file byte for byte, or JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import polars as pl
import pytest
from sqlalchemy import Engine

from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.training.factory import call_step, episode, final_step
from training.dataset_export import METADATA_FILE, export_snapshot
from training.errors import DatasetExportError
from training.snapshots import DatasetInfo, build_snapshot, read_snapshot

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


@pytest.fixture
def snapshot(tmp_path: Path) -> Iterator[tuple[Engine, LocalObjectStore, DatasetInfo]]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'ds.db'}"))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    wins = [
        episode(
            task=1, rollout=0, steps=[call_step(0, "ls"), call_step(1, "cat a"), final_step(2)]
        ),
        episode(task=2, rollout=0),
    ]
    persist_episodes(engine, store, wins)
    info = build_snapshot(engine, store, kind="sft")
    yield engine, store, info
    engine.dispose()


def test_hf_export_round_trips_through_load_from_disk(
    snapshot: tuple[Engine, LocalObjectStore, DatasetInfo], tmp_path: Path
) -> None:
    engine, store, info = snapshot
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        EPIFLOW_DATABASE_URL=str(engine.url.render_as_string(hide_password=False)),
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )
    out = tmp_path / "hf"
    done = subprocess.run(
        [EPIFLOW, "dataset", "export", str(info.id), "--format", "hf", "--out", str(out), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == info.n_rows == 2
    loaded = datasets.load_from_disk(str(out))
    assert isinstance(loaded, datasets.Dataset)
    expected = read_snapshot(store, info)
    assert loaded.column_names == expected.columns
    assert loaded.to_list() == expected.to_dicts()
    assert loaded[0]["messages"][0]["role"] == "system"
    metadata = json.loads((out / METADATA_FILE).read_text())
    assert (metadata["id"], metadata["sha256"], metadata["format"]) == (
        str(info.id),
        info.sha256,
        "hf",
    )

    again = subprocess.run(
        [EPIFLOW, "dataset", "export", str(info.id), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert again.returncode == 2 and len(lines) == 1 and "is not empty" in lines[0]


def test_parquet_and_jsonl_exports(
    snapshot: tuple[Engine, LocalObjectStore, DatasetInfo], tmp_path: Path
) -> None:
    _, store, info = snapshot
    files = export_snapshot(store, info, "parquet", tmp_path / "pq")
    assert files[0].read_bytes() == store.get(info.object_key)  # byte for byte
    files = export_snapshot(store, info, "jsonl", tmp_path / "jsonl")
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert rows == read_snapshot(store, info).to_dicts()
    assert files[-1].name == METADATA_FILE
    with pytest.raises(DatasetExportError, match="--format"):
        export_snapshot(store, info, "csv", tmp_path / "csv")
    frame = pl.read_parquet(tmp_path / "pq" / "sft.parquet")
    assert frame.height == info.n_rows


def test_tool_calling_export_is_trl_native(
    snapshot: tuple[Engine, LocalObjectStore, DatasetInfo], tmp_path: Path
) -> None:
    """`--messages tool-calls`: assistant `tool_calls` with object arguments, `tool`
    messages answering their call ids, the tools' schemas in `tools`; JSON lines alike."""
    _, store, info = snapshot
    export_snapshot(store, info, "hf", tmp_path / "hf", messages="tool-calls")
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    first = next(r for r in loaded if len(r["messages"]) == 7)
    roles = [m["role"] for m in first["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    call = first["messages"][2]["tool_calls"][0]
    assert call["type"] == "function"
    assert call["function"] == {"name": "execute_shell", "arguments": {"command": "ls"}}
    assert first["messages"][3]["tool_call_id"] == call["id"] == "c1"
    assert first["messages"][2]["content"] == "Running it.\n"
    assert "<tool_call" not in first["messages"][0]["content"]
    assert first["messages"][-1]["content"].startswith("<final>")
    assert {t["function"]["name"] for t in first["tools"]} >= {"execute_shell", "read_file"}
    assert "weight" in loaded.column_names
    metadata = json.loads((tmp_path / "hf" / METADATA_FILE).read_text())
    assert metadata["messages"] == "tool-calls"

    files = export_snapshot(store, info, "jsonl", tmp_path / "jsonl", messages="tool-calls")
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [r["messages"] for r in rows] == [r["messages"] for r in loaded.to_list()]
    with pytest.raises(DatasetExportError, match="--messages"):
        export_snapshot(store, info, "parquet", tmp_path / "pq", messages="tool-calls")
    with pytest.raises(DatasetExportError, match="--messages"):
        export_snapshot(store, info, "hf", tmp_path / "other", messages="xml")


def test_tool_calling_export_trains_with_a_plain_trl_sft_trainer(
    snapshot: tuple[Engine, LocalObjectStore, DatasetInfo], tmp_path: Path, tiny_base_model: Path
) -> None:
    """What a user does with the export: load it, hand it to TRL's own `SFTTrainer` (no
    epiflow code), train a few steps. The chat template renders the calls natively and
    the loss covers the assistant turns only."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    _, store, info = snapshot
    export_snapshot(store, info, "hf", tmp_path / "hf", messages="tool-calls")
    dataset = datasets.load_from_disk(str(tmp_path / "hf")).select_columns(["messages", "tools"])
    trainer: Any = SFTTrainer(
        model=str(tiny_base_model),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(str(tiny_base_model)),
        args=SFTConfig(
            output_dir=str(tmp_path / "out"),
            max_steps=2,
            per_device_train_batch_size=2,
            assistant_only_loss=True,
            max_length=1024,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            dataset_num_proc=None,
            # SFTConfig's own default sets the deprecated alias (a FutureWarning, an
            # error under this suite's filterwarnings): say it with the new name.
            activation_checkpointing=False,
            disable_tqdm=True,
        ),
    )
    rendered = trainer.processing_class.decode(trainer.train_dataset[0]["input_ids"])
    assert '{"name": "execute_shell", "arguments": {"command": "' in rendered
    assert "<tool_response>" in rendered
    labels = trainer.train_dataset[0]["labels"]
    trained = sum(1 for t in labels if t != -100)
    assert 0 < trained < len(labels)
    result = trainer.train()
    assert result.global_step == 2
