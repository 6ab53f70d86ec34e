"""Concurrent collections on one machine (issue 18 item 2): four `epiflow collect` at once,
with different run keys, on one SQLite file and on PostgreSQL, all succeed. They share one
local Prefect server, which the first of them starts (the others wait on its lock) —
no per-process temporary server to time out. Real CLI, real nsjail.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestration.prefect_server import server_dir
from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.cli.local import (
    EPIFLOW,
    cli_env,
    epiflow,
    processes_mentioning,
)

pytestmark = pytest.mark.slow

RUNS = 4
PER_RUN = 13  # one task instance of each built-in template


def test_four_collections_at_once(
    db_url: str, tmp_path: Path, prefect_home: Path, state_dir: Path
) -> None:
    env = cli_env(tmp_path, prefect_home, state_dir, EPIFLOW_DATABASE_URL=db_url)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    procs = []
    for i in range(RUNS):
        args = ["collect", "--concurrency", "2", "--run-key", f"together-{i}", "--json"]
        procs.append(
            subprocess.Popen(
                [EPIFLOW, *args],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err[-3000:]
            assert "Traceback" not in err, err[-3000:]
            results.append(json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert sorted(r["run_key"] for r in results) == [f"together-{i}" for i in range(RUNS)]
    for result in results:
        assert result["episodes"] == result["executed"] == PER_RUN, result
        assert sum(result["by_status"].values()) == PER_RUN

    engine = make_engine(DatabaseSettings(url=db_url))
    try:
        with engine.connect() as conn:
            episodes = conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one()
            runs = conn.execute(
                text("SELECT status, prefect_flow_run_id FROM collection_run")
            ).all()
    finally:
        engine.dispose()
    assert episodes == RUNS * PER_RUN
    assert [status for status, _ in runs] == ["completed"] * RUNS
    assert len({flow_run for _, flow_run in runs}) == RUNS
    # One shared server for all of them.
    assert len(processes_mentioning(f"serve --dir {server_dir(prefect_home)}")) == 1


def test_prefect_start_status_stop(tmp_path: Path, prefect_home: Path) -> None:
    env = cli_env(tmp_path, prefect_home)
    started = epiflow(env, "prefect", "start", cwd=tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "local Prefect server" in started.stdout and "UI http://127.0.0.1:" in started.stdout
    shown = json.loads(epiflow(env, "prefect", "status", "--json", cwd=tmp_path).stdout)
    assert shown["running"] and shown["healthy"] and shown["leases"] == 0, shown
    assert shown["api_url"] in started.stdout
    # With EPIFLOW_PREFECT_API_URL set (another Prefect home: no local server of its own),
    # the status is that API's: answering, then not.
    remote_env = cli_env(
        tmp_path / "remote", tmp_path / "remote-home", EPIFLOW_PREFECT_API_URL=shown["api_url"]
    )
    remote = json.loads(epiflow(remote_env, "prefect", "status", "--json", cwd=tmp_path).stdout)
    assert remote["remote"] and remote["running"] and remote["healthy"], remote
    assert remote["api_url"] == shown["api_url"] and remote["pid"] is None
    stopped = epiflow(env, "prefect", "stop", cwd=tmp_path)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    shown = json.loads(epiflow(env, "prefect", "status", "--json", cwd=tmp_path).stdout)
    assert not shown["running"] and shown["api_url"] is None
    remote = json.loads(epiflow(remote_env, "prefect", "status", "--json", cwd=tmp_path).stdout)
    assert remote["remote"] and not remote["running"] and not remote["healthy"], remote
    assert not processes_mentioning(f"serve --dir {server_dir(prefect_home)}")
