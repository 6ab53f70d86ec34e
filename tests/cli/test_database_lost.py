"""The database lost mid-collection: PostgreSQL (a real throwaway cluster) is reached
through a loopback proxy that is cut while `epiflow collect` runs. The command ends with
exit 3 and one line naming the failure and the resume command — no thread traceback, not
the "bad input" exit 2 — the episodes stored before the loss stay, and re-running the
key, with the database back, completes the run exactly (no duplicate, no half-written
episode)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlmodel import col

from models import Episode
from storage.db import make_engine
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import BY_PROMPT_TEMPLATES, ChatServer, oracle_until
from tests.cli.local import EPIFLOW, bare_env, last_line, stored_episodes, wait_until
from tests.services.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TASKS = 2
ANSWERED = 8
"""Tasks (in plan order) whose turns the model answers at once (16 episodes: one batch
stored); the later tasks' turns are held until the database is cut, so it is cut mid-run
however fast the machine."""


def test_a_database_lost_mid_run_is_exit_3_and_the_key_resumes(
    tmp_path: Path, pg_url: str, prefect_api_url: str
) -> None:
    direct = make_url(pg_url)
    proxy = TcpProxy(int(direct.port or 5432))
    proxy.start()
    state_dir = Path(tempfile.mkdtemp(prefix="epiflow-dblost-state-"))
    state_dir.chmod(0o755)  # jails bind-mount from it: world-searchable
    engine = make_engine(DatabaseSettings(url=pg_url))  # the test's own, not through the proxy
    tasks = builtin_suite().instances(TASKS, templates=BY_PROMPT_TEMPLATES)
    with ChatServer([oracle_until(tasks, ANSWERED)]) as model:
        try:
            env = bare_env(
                EPIFLOW_DATABASE_URL=direct.set(port=proxy.port).render_as_string(
                    hide_password=False
                ),
                EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
                EPIFLOW_PREFECT_API_URL=prefect_api_url,
                EPIFLOW_SANDBOX_STATE_DIR=str(state_dir),
                # A turn held by the test is the test's gate, not a slow endpoint.
                EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S="900",
            )
            upgraded = subprocess.run(
                [EPIFLOW, "db", "upgrade"], env=env, cwd=tmp_path, capture_output=True, text=True
            )
            assert upgraded.returncode == 0, upgraded.stderr
            args = [
                EPIFLOW, "collect", "--templates", ",".join(BY_PROMPT_TEMPLATES),
                "--tasks", str(TASKS), "--rollouts", "2", "--concurrency", "4",
                "--policy", f"openai:{model.base_url}#m", "--run-key", "lost",
            ]  # fmt: skip

            def stored() -> int:
                return stored_episodes(engine)

            log = tmp_path / "victim.log"
            with log.open("wb") as sink:
                victim = subprocess.Popen(
                    args, env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT
                )
                try:
                    landed = wait_until(lambda: stored() >= 8 or victim.poll() is not None, 300)
                    assert landed and victim.poll() is None, log.read_text()[-3000:]
                    model.wait_held(4, timeout_s=300)  # every worker mid-episode
                    proxy.stop()  # the database is gone: open connections dropped, new refused
                    model.release()  # the held episodes finish and find it gone
                    code = victim.wait(timeout=300)
                finally:
                    if victim.poll() is None:
                        victim.kill()
                        victim.wait()
            output = log.read_text()
            assert code == 3, output[-3000:]
            assert "Traceback" not in output and "Exception in thread" not in output, output[-3000:]
            line = last_line(output)
            assert line.startswith("the database failed mid-run"), output[-3000:]
            assert "resume with: epiflow collect" in line and "--run-key lost" in line
            before = stored()
            planned = len(BY_PROMPT_TEMPLATES) * TASKS * 2
            assert 8 <= before < planned

            # The database restarts: the sessions of the dead run end with it. (The proxy
            # alone cannot promise that: a connection accepted in the instant it was cut can
            # keep a server session, and the victim's lock, alive behind it for as long as
            # the proxy's own socket answers the keepalives.)
            with engine.connect() as conn:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )

            def lock_released() -> bool:
                with engine.connect() as conn:
                    held = conn.execute(
                        text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
                    ).scalar_one()
                return int(held) == 0

            assert wait_until(lock_released, 60), "the dead run's lock outlived its sessions"
            proxy.start()  # the database answers again
            rerun = subprocess.run(
                [*args, "--json"],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert rerun.returncode == 0, rerun.stderr[-3000:]
            result = json.loads(rerun.stdout)
            assert result["episodes"] == planned and result["by_status"] == {"success": planned}
            with engine.connect() as conn:
                ids = list(conn.execute(select(col(Episode.id))).scalars())
                mismatched = conn.execute(
                    text(
                        "SELECT COUNT(*) FROM episode e WHERE e.n_steps <> "
                        "(SELECT COUNT(*) FROM step s WHERE s.episode_id = e.id)"
                    )
                ).scalar_one()
            assert len(ids) == len(set(ids)) == planned
            assert mismatched == 0
        finally:
            proxy.stop()
            engine.dispose()
            shutil.rmtree(state_dir, ignore_errors=True)
