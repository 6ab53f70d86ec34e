"""Every file in `shared/interop/atif/`, `atif-linked/` and `traces/` (read in place), one
by one through the real import on SQLite and PostgreSQL: it imports, importing it again
changes no row of the episode tables, and an ATIF file exports back from the database as
it was, but for epiflow's documented `extra.epiflow` entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from storage.exchange import export_run, import_file
from storage.objects import LocalObjectStore
from tests.agent.test_atif_interop import without_epiflow
from tests.interop import atif_files, interop_dir, linked_files, load

TABLES = ("task", "policy", "episode", "step", "artifact", "atif_document", "episode_link")
"""What an import writes. (`collection_run` too: its `ended_at` on a re-import is the
honest-outcomes work of issue 25, item 3, tested there.)"""


def _files() -> list[tuple[str, Path]]:
    traces = sorted((interop_dir() / "traces").glob("*.json"))
    assert traces, "shared/interop/traces/ holds no file"
    return [
        *(("atif", p) for p in [*atif_files(), *linked_files()]),
        *(("harbor-traces", p) for p in traces),
    ]


def _rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return {
            t: [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1, 2"))]
            for t in TABLES
        }


@pytest.mark.parametrize(("fmt", "path"), _files(), ids=lambda v: getattr(v, "name", v))
def test_imports_reimports_as_a_no_op_and_exports_back(
    migrated_engine: Engine, tmp_path: Path, fmt: str, path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    report = import_file(migrated_engine, store, path, fmt)
    assert len(report.inserted) == 1 and report.steps > 0, report
    before = _rows(migrated_engine)
    again = import_file(migrated_engine, store, path, fmt)
    assert again.inserted == [] and again.skipped_existing == report.inserted
    assert _rows(migrated_engine) == before
    if fmt != "atif":
        return
    out = tmp_path / "out.jsonl"
    assert export_run(migrated_engine, store, report.run_keys[0], "atif", out) == 1
    [line] = out.read_text(encoding="utf-8").splitlines()
    exported = json.loads(line)
    assert set(exported.get("extra") or {}) - set(load(path).get("extra") or {}) == {"epiflow"}
    assert without_epiflow(exported) == load(path)
