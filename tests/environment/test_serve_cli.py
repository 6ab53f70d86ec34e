"""`epiflow env serve` as a user runs it: real processes, a real client, SIGTERM. The
open session's episode is stored, the run ended, and no jail is left; a run key another
live server holds is refused in one line, touching nothing; two servers (two machines
in small) share one PostgreSQL and one S3 bucket, each with its own run key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from websockets.asyncio.client import connect

from storage.db import make_engine
from storage.episodes import load_trajectory
from storage.objects import make_object_store
from storage.settings import DatabaseSettings, ObjectStoreSettings
from suites.builtin import builtin_suite
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


def _start(env: dict[str, str], port: int, *args: str) -> subprocess.Popen[str]:
    """`epiflow env serve --port PORT ARGS…`, once it answers /health."""
    server = subprocess.Popen(
        [EPIFLOW, "env", "serve", "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while True:
        if server.poll() is not None:
            raise AssertionError(server.communicate())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise AssertionError(("the server did not come up", server.communicate()))
        # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
        time.sleep(0.2)


def _stop(server: subprocess.Popen[str]) -> str:
    """SIGTERM `server`; its stderr once it exited (killed if it would not)."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        _, stderr = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    return stderr


def _upgrade(env: dict[str, str]) -> None:
    upgrade = subprocess.run(
        [EPIFLOW, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=300
    )
    assert upgrade.returncode == 0, upgrade.stderr


def _sigterm(tmp_path: Path, state: Path) -> None:
    env = _env(tmp_path, state)
    _upgrade(env)
    port = free_port()
    server = _start(
        env, port, "--templates", "csv_to_json", "--run-key", "sigterm", "--max-sessions", "2"
    )
    try:

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
            server.communicate()
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


def test_a_run_key_held_by_another_server_is_one_line_naming_it(tmp_path: Path) -> None:
    """A second `epiflow env serve` on a run key a live server holds: one line naming the
    key and the holder (the first server's pid), exit 2, no traceback, no jail of its own
    started, the first server and its run untouched."""
    with sandbox_state_dir() as state, sandbox_state_dir() as refused_state:
        env = _env(tmp_path, state)
        _upgrade(env)
        port = free_port()
        first = _start(env, port, "--templates", "csv_to_json", "--run-key", "busy")
        try:
            refused = subprocess.run(
                [EPIFLOW, "env", "serve", "--port", str(free_port()), "--run-key", "busy"],
                env=_env(tmp_path, refused_state),
                capture_output=True,
                text=True,
                timeout=300,
            )
            line = one_error_line(refused)
            assert "run key 'busy' is being collected right now" in line, line
            assert f"pid {first.pid} " in line and "--run-key" in line, line
            assert list(refused_state.iterdir()) == []  # no jail was started
            assert httpx.get(f"http://127.0.0.1:{port}/metadata").json()["run_key"] == "busy"
            engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))
            try:
                with engine.connect() as conn:
                    runs = conn.execute(text("SELECT run_key, status FROM collection_run")).all()
            finally:
                engine.dispose()
            assert [tuple(r) for r in runs] == [("busy", "running")]
        finally:
            stderr = _stop(first)
    assert first.returncode == 0 and "Traceback" not in stderr, stderr


TRAINER_SQL = """
SELECT r.run_key, e.template, e.rollout_index, e.status, e.verifier_score, e.final_reward,
       e.n_steps, e.id
FROM episode e JOIN collection_run r ON e.run_id = r.id
WHERE r.run_key LIKE 'grpo-1-%'
ORDER BY r.run_key, e.started_at
"""
"""docs/trainers.md's query of a run's sessions, over every server's run key."""


async def _oracle_session(url: str, seed: int) -> dict[str, Any]:
    """One session with the oracle's calls on `csv_to_json` seed `seed`: the final answer."""
    task = builtin_suite().generate("csv_to_json", seed)
    async with connect(url) as ws:

        async def ask(kind: str, data: dict[str, Any]) -> dict[str, Any]:
            await ws.send(json.dumps({"type": kind, "data": data}))
            answer: dict[str, Any] = json.loads(await ws.recv())
            assert answer["type"] == "observation", answer
            return dict(answer["data"])

        first = await ask("reset", {"template": "csv_to_json", "instance_seed": seed})
        assert first["observation"]["task_id"] == task.task_id
        for call in task.reference_solution:
            assert (await ask("step", {"tool": call.tool, "arguments": call.args}))["done"] is False
        return await ask("step", {"final": task.reference_final or ""})


def test_two_servers_share_one_postgres_and_s3(
    pg_url: str, s3_settings: ObjectStoreSettings, tmp_path: Path
) -> None:
    """The production shape in small: two `epiflow env serve` processes (two machines:
    each its own home and jails) on one PostgreSQL database and one S3 bucket, each with
    its own run key; a trainer spreads four sessions over them round-robin (the same two
    tasks on both: GRPO's generations). Every session is stored once, in its server's
    run, its trajectory in the shared bucket, and docs/trainers.md's SQL finds them all."""
    assert s3_settings.access_key and s3_settings.secret_key
    shared = {
        "EPIFLOW_DATABASE_URL": pg_url,
        "EPIFLOW_OBJECTS_URL": s3_settings.url,
        "EPIFLOW_OBJECTS_ENDPOINT": str(s3_settings.endpoint),
        "EPIFLOW_OBJECTS_ACCESS_KEY": s3_settings.access_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECRET_KEY": s3_settings.secret_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECURE": "false",
    }
    with sandbox_state_dir() as jails_a, sandbox_state_dir() as jails_b:
        machines = {"grpo-1-a": (tmp_path / "a", jails_a), "grpo-1-b": (tmp_path / "b", jails_b)}
        envs = {key: _env(home, jails) | shared for key, (home, jails) in machines.items()}
        _upgrade(envs["grpo-1-a"])
        ports = {key: free_port() for key in machines}
        servers = {}
        try:
            for key, env in envs.items():
                servers[key] = _start(
                    env, ports[key], "--templates", "csv_to_json", "--run-key", key,
                    "--max-sessions", "2",
                )  # fmt: skip
            urls = [f"ws://127.0.0.1:{ports[key]}/ws" for key in machines]
            plan = [(urls[i % 2], seed) for i, seed in enumerate([0, 0, 1, 1])]

            async def trainer() -> list[dict[str, Any]]:
                return list(await asyncio.gather(*(_oracle_session(u, s) for u, s in plan)))

            finals = asyncio.run(trainer())
        finally:
            stderrs = {key: _stop(server) for key, server in servers.items()}
        for key, server in servers.items():
            assert server.returncode == 0 and "Traceback" not in stderrs[key], stderrs[key]
        assert processes_mentioning(str(jails_a)) == processes_mentioning(str(jails_b)) == []

    assert all(final["done"] and final["observation"]["success"] for final in finals), finals
    engine = make_engine(DatabaseSettings(url=pg_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(TRAINER_SQL)).all()
            runs = conn.execute(
                text("SELECT run_key, status FROM collection_run ORDER BY run_key")
            ).all()
        store = make_object_store(s3_settings)
        stored = {
            str(row[7]): load_trajectory(engine, store, uuid.UUID(str(row[7]))) for row in rows
        }
    finally:
        engine.dispose()
    assert [tuple(r) for r in runs] == [("grpo-1-a", "completed"), ("grpo-1-b", "completed")]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (key, "csv_to_json", 0, "success", 1.0) for key in machines for _ in (0, 1)
    ]
    # Each client's final reward is the one stored, trajectory and all, in the shared bucket.
    by_episode = {final["observation"]["episode_id"]: final["reward"] for final in finals}
    assert set(by_episode) == set(stored)
    for episode, trajectory in stored.items():
        assert trajectory.final_reward == by_episode[episode]
        assert trajectory.run_key in machines
