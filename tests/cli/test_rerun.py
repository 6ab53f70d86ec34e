"""Infrastructure failures during a run are never final (issue 18 items 1 and 4): episodes
stored as `env_error` or `storage_error` make `epiflow collect` exit 3 with a last line
saying how many need a re-run and why; re-running the key redoes exactly them; the
summary counts the whole run. Real CLI, real nsjail, the shared local Prefect server.

The full-disk case mounts a small tmpfs and needs root; it skips with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.cli.local import (
    cli_env,
    epiflow,
    last_line,
)

pytestmark = pytest.mark.slow

TEMPLATES = "csv_to_json,log_errors,dir_tree,fix_script,merge_csv,sales_rollup"


@pytest.fixture
def env(tmp_path: Path, prefect_home: Path, state_dir: Path) -> dict[str, str]:
    env = cli_env(tmp_path, prefect_home, state_dir)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    return env


def sql(url: str, query: str) -> int:
    engine = make_engine(DatabaseSettings(url=url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def collect(
    env: dict[str, str], cwd: Path, key: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return epiflow(
        env, "collect", "--tasks", "1", "--templates", TEMPLATES, "--run-key", key, "--json",
        *extra, cwd=cwd,
    )  # fmt: skip


def test_env_errors_need_a_rerun_and_get_one(env: dict[str, str], tmp_path: Path) -> None:
    # A host-side cap the preflight's probe jail does not exercise: every workspace of
    # these templates holds more than 64 bytes, so no episode's sandbox can be populated
    # -> env_error ("sandbox unavailable").
    templates = "csv_to_json,log_errors,fix_script,merge_csv,sales_rollup"
    capped = {**env, "EPIFLOW_SANDBOX_POPULATE_MAX_BYTES": "64"}
    args = ["collect", "--tasks", "1", "--templates", templates, "--run-key", "env", "--json"]
    first = epiflow(capped, *args, cwd=tmp_path)
    assert first.returncode == 3, first.stderr[-3000:]
    result = json.loads(first.stdout)
    assert result["by_status"] == {"env_error": 5}
    line = last_line(first.stderr)
    assert line.startswith("5 of 5 episodes need a re-run: 5 env_error (sandbox unavailable"), line
    assert "--run-key env" in line

    again = epiflow(env, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout)
    assert result["by_status"] == {"success": 5} and result["executed"] == 5
    assert "need a re-run" not in again.stderr
    url = env["EPIFLOW_DATABASE_URL"]
    assert result["steps"] == sql(url, "SELECT COUNT(*) FROM step") == result["executed_steps"]


def test_a_run_spoiled_by_a_missing_nsjail_completes_once_fixed(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's scenario without the CLI's preflight (a deployment's flow, a library
    call): every episode is `env_error`; once the path is fixed, re-running the key
    through the CLI runs them all again."""
    import asyncio

    from collection.request import CollectRequest
    from collection.runner import collect_in_process
    from config.settings import load_settings
    from storage.objects import LocalObjectStore

    for name in ("EPIFLOW_DATABASE_URL", "EPIFLOW_OBJECTS_URL", "EPIFLOW_SANDBOX_STATE_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("EPIFLOW_SANDBOX_NSJAIL_PATH", "/nonexistent")
    request = CollectRequest(templates=TEMPLATES.split(","), run_key="nojail")
    engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))
    try:
        spoiled = asyncio.run(
            collect_in_process(
                request,
                engine=engine,
                store=LocalObjectStore(Path(env["EPIFLOW_OBJECTS_URL"])),
                settings=load_settings(),
            )
        )
    finally:
        engine.dispose()
    assert spoiled.by_status == {"env_error": 6}

    fixed = collect(env, tmp_path, "nojail")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    result = json.loads(fixed.stdout)
    assert result["by_status"] == {"success": 6} and result["executed"] == 6
    assert "1 planned, 0 to run" not in fixed.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs as a disk that fills up")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_storage_errors_of_a_full_disk_need_a_rerun(
    env: dict[str, str], tmp_path: Path, small_disk: Path
) -> None:
    env = {**env, "EPIFLOW_OBJECTS_URL": str(small_disk)}
    # 18 episodes' objects (~260 KiB) do not fit in 200 KiB; the preflight's 64 KiB do.
    args = ["--tasks", "3"]
    first = epiflow(
        env, "collect", *args, "--templates", TEMPLATES, "--run-key", "full", "--json", cwd=tmp_path
    )
    assert first.returncode == 3, first.stderr[-3000:]
    result = json.loads(first.stdout)
    failed = result["by_status"].get("storage_error", 0)
    assert failed > 0 and result["episodes"] == 18, result
    line = last_line(first.stderr)
    assert line.startswith(f"{failed} of 18 episodes need a re-run: {failed} storage_error"), line
    assert "No space left on device" in line and "--run-key full" in line, line

    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    again = epiflow(
        env, "collect", *args, "--templates", TEMPLATES, "--run-key", "full", "--json", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout)
    assert result["by_status"] == {"success": 18} and result["executed"] == failed
    # The resumed call reports the whole run's steps, and its own separately.
    url = env["EPIFLOW_DATABASE_URL"]
    assert result["steps"] == sql(url, "SELECT COUNT(*) FROM step")
    assert 0 < result["executed_steps"] < result["steps"]


def test_an_endpoint_outage_exits_3_and_stops_early(env: dict[str, str], tmp_path: Path) -> None:
    # A real HTTP server that answers the preflight's probe, then only HTTP 500: the first
    # two episodes are endpoint_error after their retries, the rest never start. Once a
    # working model answers on the same port, re-running the key redoes exactly those six.
    from collection.plan import plan_collection
    from collection.request import CollectRequest
    from config.settings import load_settings
    from tests.agent.chat_server import ChatServer, oracle, reply

    fast = {
        **env,
        "EPIFLOW_AGENT_POLICY_MAX_RETRIES": "1",
        "EPIFLOW_AGENT_POLICY_BACKOFF_INITIAL_S": "0.01",
        "EPIFLOW_AGENT_POLICY_OUTAGE_EPISODES": "2",
    }
    with ChatServer([reply("pong"), {"kind": "status", "status": 500}]) as server:
        port, policy = server.port, f"openai:{server.base_url}#m"
        first = collect(fast, tmp_path, "down", "--concurrency", "1", "--policy", policy)
    assert first.returncode == 3, first.stderr[-3000:]
    assert json.loads(first.stdout)["by_status"] == {"endpoint_error": 2}
    line = last_line(first.stderr)
    assert line.startswith("6 of 6 episodes need a re-run: 2 endpoint_error (EndpointHTTPError"), (
        line
    )
    assert "4 not started (the run stopped early)" in line and "--run-key down" in line
    assert "retrying in" in first.stderr and server.base_url in first.stderr
    url = env["EPIFLOW_DATABASE_URL"]
    # No reward for an outage: it says nothing about the agent.
    assert sql(url, "SELECT COUNT(*) FROM episode WHERE final_reward IS NOT NULL") == 0

    planned = CollectRequest(tasks=1, templates=TEMPLATES.split(","), run_key="down")
    settings = load_settings()
    tasks = [
        p.task for p in plan_collection(planned, settings.suites, sandbox=settings.sandbox).episodes
    ]
    with ChatServer([reply("pong"), oracle(tasks)], port=port):
        again = collect(fast, tmp_path, "down", "--concurrency", "1", "--policy", policy)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout)
    assert result["by_status"] == {"success": 6} and result["executed"] == 6
    assert result["success_rate"] == 1.0
    assert "need a re-run" not in again.stderr
    assert sql(url, "SELECT COUNT(*) FROM episode WHERE status = 'endpoint_error'") == 0
