"""`epiflow import` refuses hostile files with one line and exit code 2, writing nothing
(the real CLI in a subprocess, SQLite and a local object directory)."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.interop import ATIF_NAMES, atif_file

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )
    engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))
    migrate.upgrade(engine)
    engine.dispose()
    return env


def epiflow_import(env: dict[str, str], path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EPIFLOW, "import", str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def episodes(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM episode").fetchone()[0])


def nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


HOSTILE: dict[str, tuple[bytes, str]] = {
    "invalid-utf8": (b'{"schema_version": "ATIF-v1.5", "session_id": "\xff\xfe"}', "not UTF-8"),
    "gzip-junk": (gzip.compress(b'{"steps": []}' * 50), "not UTF-8"),
    "nul-junk": (b"\x00\x01\x02\x03 binary \x00 junk", "binary data"),
    "deep-array": (nested(10_000), "nested deeper than 100"),
    "deep-object": (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "nested deeper than 100"),
    "empty": (b"", "no trajectories found in"),
    "blank": (b"  \n\n \t\n", "no trajectories found in"),
    "empty-list": (b"[]", "no trajectories found in"),
    "not-json": (b"hello, this is not json\n", "not JSON"),
    "not-an-object": (b'"just a string"', "document 1 is not valid atif"),
    "huge-integer": (b'{"schema_version": "ATIF-v1.5", "n": ' + b"9" * 100_000 + b"}", "digits"),
    "huge-integer-lines": (b'{"a": 1}\n{"n": -' + b"1" * 100_000 + b"}\n", "digits"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_gets_one_line_and_exit_2(
    env: dict[str, str], tmp_path: Path, case: str
) -> None:
    content, needle = HOSTILE[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(content)
    done = epiflow_import(env, path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-2000:]
    assert needle in lines[0] and str(path) in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert episodes(tmp_path) == 0


def test_invalid_atif_names_the_field_path(env: dict[str, str], tmp_path: Path) -> None:
    document = json.loads(atif_file(ATIF_NAMES[0]).read_text())
    document["agent"]["tool_definition"] = document["agent"].pop("tool_definitions")
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(document))
    done = epiflow_import(env, path)
    assert done.returncode == 2
    first, *details = done.stderr.splitlines()
    assert str(path) in first and "agent.tool_definition" in first, done.stderr
    assert "Traceback" not in done.stderr and episodes(tmp_path) == 0
    # A document with several problems lists the others below the one line, indented.
    path.write_text(json.dumps({"hello": "world"}))
    done = epiflow_import(env, path)
    first, *details = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "document 1 is not valid atif" in first
    assert "schema_version: Field required" in first
    assert details and all(line.startswith("  ") for line in details), done.stderr


def test_real_files_import_and_say_when_nothing_is_new(env: dict[str, str], tmp_path: Path) -> None:
    path = atif_file(ATIF_NAMES[2])
    first = epiflow_import(env, path, "--json")
    assert first.returncode == 0, first.stderr
    assert len(json.loads(first.stdout)["inserted"]) == 1
    again = epiflow_import(env, path)
    assert again.returncode == 0
    assert "0 episode(s)" in again.stdout and "already imported, unchanged" in again.stdout
    assert episodes(tmp_path) == 1
