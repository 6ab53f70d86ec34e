"""`epiflow dataset export`: a snapshot as a Hugging Face `datasets` directory that
`load_from_disk` reads back, its parquet file byte for byte, or JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
