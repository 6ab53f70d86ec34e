"""One run key, one run at a time (issue 13 item 4): while `epiflow collect --run-key K`
runs, a second `epiflow collect --run-key K` is refused with one line naming the key and
`--run-key`, writes nothing, and leaves the first alone; the first collects every episode
exactly once. Afterwards the key runs again and finds nothing missing. SQLite and
PostgreSQL; real CLI, real nsjail, the shared local Prefect server."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.cli.local import (
    EPIFLOW,
    cli_env,
    epiflow,
    last_line,
)

pytestmark = pytest.mark.slow

ARGS = [
    "collect",
    "--templates",
    "csv_to_json,dir_tree,log_errors",
    "--tasks",
    "2",
    "--rollouts",
    "2",
    "--concurrency",
    "1",
    # Every tool call waits a second: the first run is still collecting when the second
    # one starts, however fast the machine.
    "--faults",
    '{"latency_p": 1.0, "latency_ms": [1000, 1000]}',
    "--run-key",
    "twice",
    "--json",
]
PLANNED = 12


def test_second_run_of_a_running_key_is_refused(
    db_url: str, tmp_path: Path, prefect_home: Path, state_dir: Path
) -> None:
    env = cli_env(tmp_path, prefect_home, state_dir, EPIFLOW_DATABASE_URL=db_url)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    engine = make_engine(DatabaseSettings(url=db_url))

    def run_status() -> str | None:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = 'twice'")
            ).scalar_one_or_none()
        return None if found is None else str(found)

    first = subprocess.Popen(
        [EPIFLOW, *ARGS],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # `running` is written after the first took the key's lock.
        deadline = time.monotonic() + 300
        while run_status() != "running":
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first run never started"
            time.sleep(0.2)

        second = epiflow(env, *ARGS, cwd=tmp_path)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr, second.stderr[-3000:]
        line = last_line(second.stderr)
        assert "run key 'twice' is being collected right now" in line, line
        assert "--run-key" in line and "pid " in line, line
        assert second.stdout == ""
        assert run_status() == "running"  # the refused run did not touch the first's row

        out, err = first.communicate(timeout=900)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["planned"] == result["episodes"] == result["executed"] == PLANNED, result

    with engine.connect() as conn:
        episodes = conn.execute(text("SELECT COUNT(*), COUNT(DISTINCT id) FROM episode")).one()
        steps = conn.execute(text("SELECT COALESCE(SUM(n_steps), 0) FROM episode")).scalar_one()
        stored_steps = conn.execute(text("SELECT COUNT(*) FROM step")).scalar_one()
    assert tuple(episodes) == (PLANNED, PLANNED)
    assert steps == stored_steps == result["steps"]
    assert run_status() == "completed"

    # The key is free again: a re-run finds nothing missing.
    again = epiflow(env, *ARGS, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads(again.stdout)
    assert rerun["executed"] == 0 and rerun["episodes"] == PLANNED
    engine.dispose()


def test_manual_runs_get_a_fresh_key_each_printed_first(
    tmp_path: Path, prefect_home: Path, state_dir: Path
) -> None:
    """Without `--run-key`, a manual run never joins another one (not even the same day's
    nightly run): it gets a key of its own, printed before it starts."""
    env = cli_env(tmp_path, prefect_home, state_dir)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    keys = []
    for _ in range(2):
        done = epiflow(env, "collect", "--templates", "csv_to_json", "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["executed"] == result["episodes"] == 1  # nothing resumed
        key = result["run_key"]
        assert key.startswith("builtin-scripted-oracle-") and len(key.rsplit("-", 1)[1]) == 8
        assert f"run key {key} (new; resume it with --run-key {key})" in done.stderr
        keys.append(key)
    assert keys[0] != keys[1]
