"""`epiflow import` refuses hostile files with one line and exit code 2, writing nothing
(the real CLI in a subprocess, SQLite and a local object directory)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def nothing_written(tmp_path: Path) -> bool:
    """No episode, no run row, no object: a refused import leaves no trace."""
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        rows = sum(
            int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("episode", "step", "collection_run", "artifact")
        )
    objects = tmp_path / "objects"
    return rows == 0 and not (objects.exists() and any(p.is_file() for p in objects.rglob("*")))


def _invalid(change: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(atif_file(ATIF_NAMES[0]).read_text())
    steps = document["steps"]
    if change == "dangling-call-id":
        steps[4]["observation"]["results"][0]["source_call_id"] = "call_nobody_made"
    elif change == "duplicate-step-id":
        steps[3]["step_id"] = steps[2]["step_id"]
    elif change == "zero-based-step-ids":
        for step in steps:
            step["step_id"] -= 1
    elif change == "unknown-version":
        document["schema_version"] = "ATIF-v1.9"
    return document


INVALID = {
    "dangling-call-id": "steps.4.observation.results.0.source_call_id",
    "duplicate-step-id": "steps.3.step_id: expected 4",
    "zero-based-step-ids": "steps.0.step_id: expected 1",
    "unknown-version": "schema_version",
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_atif_is_refused_naming_document_and_field(
    env: dict[str, str], tmp_path: Path, case: str
) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(_invalid(case)))
    done = epiflow_import(env, path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-2000:]
    assert f"{path}: document 1 is not valid atif" in lines[0], lines[0]
    assert INVALID[case] in lines[0], lines[0]
    assert "Traceback" not in done.stderr and nothing_written(tmp_path)


def test_a_truncated_file_is_refused_and_nothing_written(
    env: dict[str, str], tmp_path: Path
) -> None:
    whole = atif_file(ATIF_NAMES[1]).read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(whole[: len(whole) // 2])
    done = epiflow_import(env, path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert str(path) in lines[0] and "not JSON" in lines[0], lines[0]
    assert nothing_written(tmp_path)


def test_an_id_twice_in_one_file_is_one_episode_sql_and_object_agree(
    env: dict[str, str], tmp_path: Path
) -> None:
    line = atif_file(ATIF_NAMES[0]).read_text().replace("\n", "")
    path = tmp_path / "twice.jsonl"
    path.write_text(line + "\n" + line + "\n")
    done = epiflow_import(env, path, "--json")
    assert done.returncode == 0, done.stderr
    (episode_id,) = json.loads(done.stdout)["inserted"]
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        n_steps, rows = conn.execute(
            "SELECT e.n_steps, (SELECT COUNT(*) FROM step s WHERE s.episode_id = e.id) "
            "FROM episode e"
        ).fetchone()
        key, sha, size = conn.execute(
            "SELECT key, sha256, size FROM artifact WHERE kind = 'trajectory'"
        ).fetchone()
    body = (tmp_path / "objects" / key).read_bytes()
    assert (hashlib.sha256(body).hexdigest(), len(body)) == (sha, size)
    shown = subprocess.run(
        [EPIFLOW, "show", episode_id, "--raw"], env=env, capture_output=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert n_steps == rows == len(json.loads(shown.stdout)["steps"]) == 2


_MIB = 1 << 20
_PEAK = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(done.stderr)\n"
)


def _peak_kib(env: dict[str, str], path: Path) -> tuple[int, int, str]:
    """Exit code and peak RSS (KiB) of `epiflow import PATH`, measured by a small parent
    process of its own (the test process is large; its peak is not the import's)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, EPIFLOW, "import", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    code, kib = (int(x) for x in done.stdout.split())
    return code, kib, done.stderr


def test_a_100_mb_file_of_one_string_imports_within_the_memory_bound(
    env: dict[str, str], tmp_path: Path
) -> None:
    # The constant of the bound: the same command on a small file (interpreter, modules,
    # database setup).
    code, small_kib, err = _peak_kib(env, atif_file(ATIF_NAMES[2]))
    assert code == 0, err
    document = json.loads(atif_file(ATIF_NAMES[0]).read_text())
    marker = "@@BODY@@"
    document["steps"][4]["observation"]["results"][0]["content"] = marker
    head, tail = json.dumps(document).split(json.dumps(marker))
    path = tmp_path / "one-string.json"
    with path.open("w", encoding="utf-8") as fh:  # written in pieces: never held whole
        fh.write(head + '"')
        unit = r"log line with \"quotes\" and [brackets] {x}\n"  # JSON escapes, as written
        chunk = unit * (_MIB // len(unit) + 1)
        for _ in range(100):
            fh.write(chunk)
        fh.write('"' + tail)
    size = path.stat().st_size
    assert size > 100 * _MIB
    code, kib, err = _peak_kib(env, path)
    assert code == 0, err
    # ≤ 3× the file + the constant, with 32 MiB of allocator slack.
    assert kib * 1024 <= 3 * size + small_kib * 1024 + 32 * _MIB, (kib, small_kib, size)
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        observation, key = conn.execute(
            "SELECT observation, observation_key FROM step WHERE observation IS NOT NULL "
            "ORDER BY LENGTH(observation) DESC"
        ).fetchone()
        stored = conn.execute("SELECT size FROM artifact WHERE key = ?", (key,)).fetchone()
    assert len(observation) < 70_000  # capped in SQL; the whole is an object, like stdout
    whole = (tmp_path / "objects" / key).stat().st_size
    assert stored == (whole,) and 90 * _MIB < whole < size  # the escapes decoded
