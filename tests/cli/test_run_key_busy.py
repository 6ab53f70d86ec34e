"""One run key, one run at a time (issue 13 item 4): while `epiflow collect --run-key K`
runs, a second `epiflow collect --run-key K` is refused with one line naming the key and
`--run-key`, writes nothing, and leaves the first alone; the first collects every episode
exactly once. Afterwards the key runs again and finds nothing missing. SQLite and
PostgreSQL; real CLI, real nsjail, the shared local Prefect server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from storage.db import make_engine
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import ChatServer, held, is_episode_turn, oracle
from tests.cli.local import (
    EPIFLOW,
    cli_env,
    epiflow,
    last_line,
    wait_until,
)

pytestmark = pytest.mark.slow

TEMPLATES = ["csv_to_json", "dir_tree", "config_update"]
"""Templates whose instances' prompts differ by seed (the model server answers by prompt)."""
PLANNED = 12


def collect_args(server: ChatServer) -> list[str]:
    """The collection, its policy a model behind `server`: the test holds its turns until
    the second run was refused, so the first is still collecting then, however fast the
    machine (no latency used as a clock)."""
    return [
        "collect", "--templates", ",".join(TEMPLATES), "--tasks", "2", "--rollouts", "2",
        "--concurrency", "1", "--policy", f"openai:{server.base_url}#m",
        "--run-key", "twice", "--json",
    ]  # fmt: skip


def test_second_run_of_a_running_key_is_refused(
    db_url: str, tmp_path: Path, prefect_home: Path, state_dir: Path
) -> None:
    env = cli_env(
        tmp_path,
        prefect_home,
        state_dir,
        EPIFLOW_DATABASE_URL=db_url,
        # A turn held by the test is the test's gate, not a slow endpoint.
        EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S="900",
    )
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    engine = make_engine(DatabaseSettings(url=db_url))
    tasks = builtin_suite().instances(2, templates=TEMPLATES)
    with ChatServer([held(oracle(tasks), when=is_episode_turn)]) as model:
        _first_refuses_the_second(model, env, tmp_path, engine)
    engine.dispose()


def _first_refuses_the_second(
    model: ChatServer, env: dict[str, str], tmp_path: Path, engine: Engine
) -> None:
    args = collect_args(model)

    def run_status() -> str | None:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = 'twice'")
            ).scalar_one_or_none()
        return None if found is None else str(found)

    first = subprocess.Popen(
        [EPIFLOW, *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # `running` is written after the first took the key's lock; its first turn is then
        # held by the model server until the second run was refused.
        started = wait_until(lambda: run_status() == "running" or first.poll() is not None, 300)
        assert started and first.poll() is None, first.communicate()[1][-3000:]
        model.wait_held(1, timeout_s=300)

        second = epiflow(env, *args, cwd=tmp_path)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr, second.stderr[-3000:]
        line = last_line(second.stderr)
        assert "run key 'twice' is being collected right now" in line, line
        assert "--run-key" in line and "pid " in line, line
        assert second.stdout == ""
        assert run_status() == "running"  # the refused run did not touch the first's row

        model.release()
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
    again = epiflow(env, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads(again.stdout)
    assert rerun["executed"] == 0 and rerun["episodes"] == PLANNED


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
