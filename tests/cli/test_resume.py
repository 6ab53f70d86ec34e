"""Crash and resume: SIGKILL the collecting process mid-run, re-run the same run key, and
check that only the missing episodes ran, nothing is duplicated or half-written, and no
jail, process, cgroup or temp dir of the killed run is left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlmodel import col

from models import Episode, Step
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.orphans import list_orphans
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import BY_PROMPT_TEMPLATES, ChatServer, oracle_until
from tests.cli.local import (
    EPIFLOW,
    cgroups,
    private_cgroup_parent,
    processes_mentioning,
    wait_until,
)

TEMPLATES = BY_PROMPT_TEMPLATES
TASKS = 3
ANSWERED = 9
"""Tasks (in plan order) whose turns the model answers; later tasks' turns are held until the
victim is killed, so it dies mid-run with jails open, however fast the machine."""


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path: Path, prefect_api_url: str) -> None:
    # Jails bind-mount files from the state dir, so it must sit under world-searchable
    # directories (pytest's tmp root is 0700).
    state_dir = Path(tempfile.mkdtemp(prefix="epiflow-resume-state-"))
    state_dir.chmod(0o755)
    # A cgroup parent of its own: under pytest-xdist the other worker's jails come and go
    # under the shared one while this test checks that the killed run left none behind.
    try:
        with private_cgroup_parent() as cgroup_parent, _model() as model:
            _scenario(tmp_path, state_dir, prefect_api_url, cgroup_parent, model)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _model() -> ChatServer:
    tasks = builtin_suite().instances(TASKS, templates=TEMPLATES)
    return ChatServer([oracle_until(tasks, ANSWERED)])


def _scenario(
    tmp_path: Path, state_dir: Path, prefect_api_url: str, cgroup_parent: str, model: ChatServer
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'resume.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
        EPIFLOW_SANDBOX_STATE_DIR=str(state_dir),
        EPIFLOW_SANDBOX_CGROUP_PARENT=cgroup_parent,
        # A turn held by the test is the test's gate, not a slow endpoint.
        EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S="900",
    )
    args = [
        EPIFLOW, "collect", "--templates", ",".join(TEMPLATES), "--tasks", str(TASKS),
        "--rollouts", "2", "--concurrency", "4", "--policy", f"openai:{model.base_url}#m",
        "--run-key", "crash", "--json",
    ]  # fmt: skip
    assert (
        subprocess.run(
            [EPIFLOW, "db", "upgrade"], env=env, cwd=tmp_path, capture_output=True
        ).returncode
        == 0
    )
    engine = make_engine(DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"]))

    def stored() -> int:
        with engine.connect() as conn:
            try:
                return int(conn.execute(select(func.count()).select_from(Episode)).scalar_one())
            except Exception:  # the first run may not have created its rows yet
                return 0

    log = tmp_path / "victim.log"
    with log.open("wb") as sink:
        victim = subprocess.Popen(
            args, env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            landed = wait_until(lambda: stored() >= 16 or victim.poll() is not None, timeout=300)
            assert landed and victim.poll() is None, (
                "collector ended or stalled early:\n" + log.read_text()[-3000:]
            )
            model.wait_held(4, timeout_s=300)  # every worker is mid-episode, its jail open
            assert processes_mentioning(str(state_dir)), "no jail was running"
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
    before = stored()
    planned = len(TEMPLATES) * TASKS * 2
    assert 16 <= before < planned
    model.release()  # the re-run's turns are answered

    # The killed collector's jails notice their closed pipe and go away by themselves.
    assert wait_until(lambda: not processes_mentioning(str(state_dir)), timeout=30), (
        processes_mentioning(str(state_dir))
    )
    assert wait_until(lambda: not cgroups(cgroup_parent), timeout=30), cgroups(cgroup_parent)

    rerun = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads(rerun.stdout)
    assert result["episodes"] == planned and result["by_status"] == {"success": planned}

    with engine.connect() as conn:
        ids = list(conn.execute(select(col(Episode.id))).scalars())
        assert len(ids) == len(set(ids)) == planned
        mismatched = conn.execute(
            text(
                "SELECT COUNT(*) FROM episode e WHERE e.n_steps <> "
                "(SELECT COUNT(*) FROM step s WHERE s.episode_id = e.id)"
            )
        ).scalar_one()
        assert mismatched == 0  # no half-written episode
        keys = list(conn.execute(select(col(Episode.trajectory_key))).scalars())
        assert conn.execute(select(func.count()).select_from(Step)).scalar_one() > planned
    store = LocalObjectStore(tmp_path / "objects")
    assert all(k and store.exists(k) for k in keys)
    # Objects the killed batch wrote before its rows could commit are orphans: listed, collectable.
    orphans = list_orphans(engine, store).keys
    assert all(k.startswith("episodes/crash/") for k in orphans)
    assert not any(
        uuid.UUID(k.split("/")[2]) in set(ids) and k.endswith("trajectory.json") for k in orphans
    )

    assert not processes_mentioning(str(state_dir))
    assert not cgroups(cgroup_parent)
    leftovers = [p.name for p in state_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # only the shared executor and /etc remain, no per-run temp files
    engine.dispose()
