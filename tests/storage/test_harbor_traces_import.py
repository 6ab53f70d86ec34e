"""Harbor's `*.traces.json` (`shared/interop/traces/`, read in place): one episode per
trial from its last row, a no-op re-import, bad rows refused in one line with nothing
written (real SQLite and PostgreSQL, a real local object directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agent.harbor_traces import HARBOR_TRACES_RUN_KEY, from_harbor_traces
from models import Episode
from storage.episodes import load_trajectory
from storage.errors import ImportFormatError
from storage.exchange import import_file
from storage.objects import LocalObjectStore
from tests.interop import interop_dir


def traces_file() -> Path:
    path = interop_dir() / "traces" / "openhands__hello-world.traces.json"
    assert path.is_file(), f"{path} is listed in shared/interop/README.md but missing"
    return path


def _episodes(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Episode)).scalar_one())


def test_a_trial_is_its_last_row() -> None:
    rows = json.loads(traces_file().read_text(encoding="utf-8"))
    assert len({r["trial_name"] for r in rows}) == 1 and len(rows) == 2
    [(n, t)] = from_harbor_traces(rows)
    last = rows[-1]
    assert n == len(rows)
    assert t.run_key == HARBOR_TRACES_RUN_KEY and t.task_id == f"harbor/{last['task']}"
    assert t.policy == f"harbor:{last['agent']}#{last['model']}"
    assistant = [m["content"] for m in last["conversations"] if m["role"] == "assistant"]
    assert [s.raw_output for s in t.steps] == assistant
    assert t.prompt == last["conversations"][0]["content"]


def test_traces_import_and_reimport_as_a_no_op(migrated_engine: Engine, tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    report = import_file(migrated_engine, store, traces_file(), "harbor-traces")
    assert len(report.inserted) == 1 and report.run_keys == [HARBOR_TRACES_RUN_KEY]
    stored = load_trajectory(migrated_engine, store, report.inserted[0])
    assert stored is not None and stored.task_id == "harbor/hello-world"
    again = import_file(migrated_engine, store, traces_file(), "harbor-traces")
    assert again.inserted == [] and again.skipped_existing == report.inserted
    assert _episodes(migrated_engine) == 1


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda rows: rows[1].pop("trial_name"), "row 2: trial_name: Field required"),
        (lambda rows: rows[0].update(conversations="x"), "row 1: conversations: a list"),
        (
            lambda rows: rows[1]["conversations"][0].update(content=7),
            "row 2: conversations.0.content: expected a string",
        ),
    ],
)
def test_bad_rows_are_refused_in_one_line_writing_nothing(
    migrated_engine: Engine, tmp_path: Path, mutate: object, expected: str
) -> None:
    rows = json.loads(traces_file().read_text(encoding="utf-8"))
    assert callable(mutate)
    mutate(rows)
    path = tmp_path / "bad.traces.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    with pytest.raises(ImportFormatError) as info:
        import_file(migrated_engine, store, path, "harbor-traces")
    message = str(info.value)
    assert "not valid harbor-traces" in message and expected in message and "\n" not in message
    assert _episodes(migrated_engine) == 0
