"""PostgreSQL frozen mid-collection: a throwaway cluster of the test's own (never the
shared one) has its postmaster and every backend stopped with SIGSTOP while `epiflow
collect` runs; then Ctrl-C (SIGINT). A frozen server answers nothing and drops nothing
(its sockets stay open and the kernel still acknowledges keepalives), so the clean stop
cannot save the finished episodes: past `EPIFLOW_PREFECT_STOP_TIMEOUT_S` the stop is
abandoned, the run's status is given 5 s (the line says whether it was written), and the
command exits 130 with the resume command. After SIGCONT the dead command's sessions end
(their half-sent transactions roll back), the run row holds what the line said, and
re-running the key completes the run exactly: every planned episode once, each whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlmodel import col

from models import CollectionRun, Episode, run_id_for
from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import BY_PROMPT_TEMPLATES, ChatServer, oracle_until
from tests.cli.local import EPIFLOW, bare_env, last_line, stored_episodes, wait_until
from tests.services.postgres import PostgresCluster, pg_bin_or_skip, running_cluster
from tests.services.processes import descendants

STOP_TIMEOUT_S = 5
TASKS = 3
ANSWERED = 8
"""Tasks (in plan order) whose turns the model answers at once (16 episodes: one batch
stored); the later tasks' turns are held, so the run is still going when the database
freezes, however fast the machine."""

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A cluster for this test alone: it is frozen, so no other test may share it."""
    with running_cluster(pg_bin_or_skip()) as cluster:
        yield cluster


def _signal_server(cluster: PostgresCluster, sig: signal.Signals) -> None:
    for pid in descendants(cluster.postmaster_pid()):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # a backend that just ended
            pass


def _other_sessions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def test_ctrl_c_with_postgres_frozen_ends_bounded_and_the_key_resumes(
    tmp_path: Path, own_cluster: PostgresCluster, prefect_api_url: str
) -> None:
    url = own_cluster.url(own_cluster.create_database())
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    state_dir = Path(tempfile.mkdtemp(prefix="epiflow-dbfrozen-state-"))
    state_dir.chmod(0o755)  # jails bind-mount from it: world-searchable
    frozen = False
    tasks = builtin_suite().instances(TASKS, templates=BY_PROMPT_TEMPLATES)
    with ChatServer([oracle_until(tasks, ANSWERED)]) as model:
        try:
            env = bare_env(
                EPIFLOW_DATABASE_URL=url,
                EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
                EPIFLOW_PREFECT_API_URL=prefect_api_url,
                EPIFLOW_PREFECT_STOP_TIMEOUT_S=str(STOP_TIMEOUT_S),
                EPIFLOW_SANDBOX_STATE_DIR=str(state_dir),
                # A turn held by the test is the test's gate, not a slow endpoint.
                EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S="900",
            )
            args = [
                EPIFLOW, "collect", "--templates", ",".join(BY_PROMPT_TEMPLATES),
                "--tasks", str(TASKS), "--rollouts", "2", "--concurrency", "4",
                "--policy", f"openai:{model.base_url}#m", "--run-key", "frozen",
            ]  # fmt: skip
            planned = len(BY_PROMPT_TEMPLATES) * TASKS * 2

            def stored() -> int:
                return stored_episodes(engine)

            log = tmp_path / "victim.log"
            with log.open("wb") as sink:
                victim = subprocess.Popen(
                    args, env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT
                )
                try:
                    landed = wait_until(lambda: stored() >= 2 or victim.poll() is not None, 300)
                    assert landed and victim.poll() is None, log.read_text()[-3000:]
                    model.wait_held(4, timeout_s=300)  # every worker mid-episode: still going
                    engine.dispose()  # the test's own connections would freeze with the server
                    _signal_server(own_cluster, signal.SIGSTOP)
                    frozen = True
                    victim.send_signal(signal.SIGINT)
                    # Bounded: the stop timeout, then 5 s for each last write. Waited on
                    # generously (two cores, heavy load): a hang is what fails here.
                    code = victim.wait(timeout=300)
                finally:
                    if victim.poll() is None:
                        victim.kill()
                        victim.wait()
                    if frozen:
                        _signal_server(own_cluster, signal.SIGCONT)
            output = log.read_text()
            assert code == 128 + signal.SIGINT, output[-3000:]
            assert "Exception in thread" not in output, output[-3000:]
            line = last_line(output)
            assert line.startswith("SIGINT: stop abandoned"), output[-3000:]
            assert "Resume with: epiflow collect" in line and "--run-key frozen" in line, line

            # Thawed: the dead command's sessions read their closed sockets and end, their
            # open transactions rolled back and its run-key lock released.
            assert wait_until(lambda: _other_sessions(engine) == 0, 120), "sessions outlived it"
            with engine.connect() as conn:
                status = conn.execute(
                    select(col(CollectionRun.status)).where(
                        col(CollectionRun.id) == run_id_for("frozen")
                    )
                ).scalar_one()
            assert status == ("interrupted" if "marked interrupted" in line else "running"), line
            before = stored()
            assert 2 <= before < planned

            model.release()  # the re-run's turns are answered
            rerun = subprocess.run(
                [*args, "--json"],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert rerun.returncode == 0, rerun.stderr[-3000:]
            result = json.loads(rerun.stdout)
            assert result["episodes"] == planned and result["by_status"] == {"success": planned}
            assert result["executed"] == planned - before
            with engine.connect() as conn:
                ids = list(conn.execute(select(col(Episode.id))).scalars())
                mismatched = conn.execute(
                    text(
                        "SELECT COUNT(*) FROM episode e WHERE e.n_steps <> "
                        "(SELECT COUNT(*) FROM step s WHERE s.episode_id = e.id)"
                    )
                ).scalar_one()
                final = conn.execute(
                    select(col(CollectionRun.status)).where(
                        col(CollectionRun.id) == run_id_for("frozen")
                    )
                ).scalar_one()
            assert len(ids) == len(set(ids)) == planned
            assert mismatched == 0 and final == "completed"
        finally:
            if frozen:
                _signal_server(own_cluster, signal.SIGCONT)
            engine.dispose()
            shutil.rmtree(state_dir, ignore_errors=True)
