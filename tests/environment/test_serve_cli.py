"""`epiflow env serve` as a user runs it: a real process, a real client, SIGTERM. The
open session's episode is stored, the run ended, and no jail is left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from sqlalchemy import text
from websockets.asyncio.client import connect

from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.cli.local import EPIFLOW, one_error_line, processes_mentioning, sandbox_state_dir
from tests.services.postgres import free_port

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, state: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        PYTHONPATH=str(ROOT),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'serve.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )
    if state is not None:
        env["EPIFLOW_SANDBOX_STATE_DIR"] = str(state)
    return env


def test_a_bind_beyond_loopback_needs_the_flag_and_a_token(tmp_path: Path) -> None:
    env = _env(tmp_path)
    for extra in ([], ["--allow-remote"]):
        result = subprocess.run(
            [EPIFLOW, "env", "serve", "--host", "0.0.0.0", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        line = one_error_line(result)
        assert ("--allow-remote" if not extra else "EPIFLOW_ENV_TOKEN") in line, line


def test_sigterm_stores_the_open_session_and_leaves_no_jail(tmp_path: Path) -> None:
    with sandbox_state_dir() as state:
        _sigterm(tmp_path, state)


def _sigterm(tmp_path: Path, state: Path) -> None:
    env = _env(tmp_path, state)
    upgrade = subprocess.run(
        [EPIFLOW, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=300
    )
    assert upgrade.returncode == 0, upgrade.stderr
    port = free_port()
    server = subprocess.Popen(
        [
            EPIFLOW,
            "env",
            "serve",
            "--port",
            str(port),
            "--templates",
            "csv_to_json",
            "--run-key",
            "sigterm",
            "--max-sessions",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, server.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(0.2)

        async def session() -> None:
            async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                first = json.loads(await ws.recv())
                assert first["type"] == "observation", first
                step = {"tool": "list_dir", "arguments": {"path": "."}}
                await ws.send(json.dumps({"type": "step", "data": step}))
                assert json.loads(await ws.recv())["data"]["done"] is False
                assert processes_mentioning(str(state))  # its jail runs
                server.send_signal(signal.SIGTERM)
                await asyncio.wait_for(ws.wait_closed(), timeout=120)

        asyncio.run(session())
        _, stderr = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert processes_mentioning(str(state)) == []
    engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))
    try:
        with engine.connect() as conn:
            status, reason, steps = conn.execute(
                text("SELECT status, failure_reason, n_steps FROM episode")
            ).one()
            run = conn.execute(text("SELECT status FROM collection_run")).scalar_one()
    finally:
        engine.dispose()
    assert status == "policy_error" and steps == 1, (status, reason)
    assert run == "completed"
