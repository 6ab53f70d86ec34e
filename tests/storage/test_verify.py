"""`verify_artifacts` / `epiflow db verify`: every artifact row against its object (real
SQLite and PostgreSQL, a real local object directory, the real CLI in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, select
from sqlmodel import col

from models import Artifact
from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from storage.verify import verify_artifacts
from tests.interop import ATIF_NAMES, atif_file
from tests.storage.builders import make_trajectory

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


def _keys(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(col(Artifact.key)).order_by(col(Artifact.key))).scalars())


def test_verify_finds_missing_resized_and_altered_objects(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    trajectories = [make_trajectory(task=f"t{i}") for i in range(4)]
    persist_episodes(migrated_engine, store, trajectories)
    clean = verify_artifacts(migrated_engine, store)
    keys = _keys(migrated_engine)
    assert clean.checked == len(keys) >= 4 and clean.problems == []

    missing, resized, altered = keys[:3]
    store.delete(missing)
    store.put(resized, store.get(resized) + b" ")
    data = bytearray(store.get(altered))
    data[-2] ^= 0x01  # same size, other content
    store.put(altered, bytes(data))
    report = verify_artifacts(migrated_engine, store)
    assert report.checked == len(keys)
    assert [(p.key, p.problem) for p in report.problems] == [
        (missing, "missing"),
        (resized, "size"),
        (altered, "sha256"),
    ]
    assert "the object has" in report.problems[1].detail


def test_db_verify_cli_exits_1_naming_the_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )
    engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))
    migrate.upgrade(engine)

    def epiflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EPIFLOW, *args], env=env, capture_output=True, text=True, timeout=300
        )

    imported = epiflow("import", str(atif_file(ATIF_NAMES[0])))
    assert imported.returncode == 0, imported.stderr
    ok = epiflow("db", "verify", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["problems"] == [] and json.loads(ok.stdout)["checked"] >= 1
    [key] = _keys(engine)
    engine.dispose()
    (tmp_path / "objects" / key).write_bytes(b"{}")
    bad = epiflow("db", "verify")
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        f"{key}: size: " + bad.stdout.split(": size: ", 1)[1].strip()
    ]
    assert "1 disagree" in bad.stderr
