"""Scale-out with nothing shared but the Prefect API, PostgreSQL and S3 (issue 13 item 2).

A collection split into shard flow runs of the `collect-shard/shard-process` deployment
(deployed from `prefect.yaml`, from a directory of its own) on a process work pool, two
workers that each have their own PREFECT_HOME, home, working, temporary and epiflow home
directory, as two machines would. One worker is killed mid-shard with SIGKILL (itself and
every process below it). The heartbeat automation marks its shard Crashed (also when its
process was killed before its first heartbeat: the silence counts from Pending), the parent
starts the shard again, the other worker resumes it, and the run completes with the right
totals read from SQL: every episode exactly once, every object in S3, nothing orphaned,
and no Prefect result file written on any worker. Real Prefect server, workers, nsjail.

The kill comes at a known point, however fast the machine: the policy is a model behind the
test model server, which answers the first tasks' turns at once and holds the last task's
(`oracle_until`); shards take every other episode in plan order, so each shard holds its last
episode, and the worker is killed once both are held, then the turns are released.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from storage import migrate
from storage.db import make_engine
from storage.objects import make_object_store
from storage.orphans import list_orphans
from storage.settings import DatabaseSettings, ObjectStoreSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import ChatServer, oracle_until
from tests.services.prefect_api import Api, wait_for
from tests.services.prefect_server import BIN, PrefectServer
from tests.services.processes import descendants, kill_tree

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EPIFLOW = str(BIN / "epiflow")
POOL = "epiflow-process"
HEARTBEAT_S = 30
ZOMBIE_AFTER_S = 75
TEMPLATES = ["csv_to_json", "dir_tree", "log_errors", "config_update"]
PLANNED = 8  # 4 templates x 1 task x 2 rollouts, 4 per shard
ANSWERED = 3
"""Tasks (in plan order) whose turns the model answers at once; the last task's two episodes
(one per shard: shards take every other episode) are held until the worker is killed."""
# Its own deadlines, inside pytest-timeout's 600 s so that a hang fails with the shards'
# states, the automations' trail and the logs instead of a stack of `poll()`. Measured:
# 151 s in all (under pytest-xdist, load 2.3), the kill-to-end part ~2 min (75 s of
# silence, the automation, the shard's second run).
BUSY_WITHIN_S = 200
END_WITHIN_S = 300


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    """The test's engine, disposed whatever happens (an open connection left to the
    garbage collector warns in the next test on this worker)."""
    made = make_engine(DatabaseSettings(url=pg_url))
    yield made
    made.dispose()


@pytest.fixture
def model() -> Iterator[ChatServer]:
    tasks = builtin_suite().instances(1, templates=TEMPLATES)
    with ChatServer([oracle_until(tasks, ANSWERED)]) as server:
        yield server


@pytest.fixture
def prefect_server() -> Iterator[PrefectServer]:
    server = PrefectServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def machines() -> Iterator[list[Path]]:
    """Three "machines" (the parent's and two workers'): directories of their own, world-
    searchable because jails bind-mount files from the sandbox state under TMPDIR."""
    roots = [Path(tempfile.mkdtemp(prefix=f"epiflow-machine-{i}-")) for i in range(3)]
    for root in roots:
        root.chmod(0o755)
        for sub in ("home", "prefect", "work", "tmp", "epiflow"):
            (root / sub).mkdir(mode=0o755)
    yield roots
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def machine_env(server: PrefectServer, root: Path, shared: dict[str, str]) -> dict[str, str]:
    """The environment of a process on machine `root`: nothing of the others' disks."""
    return server.env(
        **shared,
        HOME=str(root / "home"),
        PREFECT_HOME=str(root / "prefect"),
        TMPDIR=str(root / "tmp"),
        EPIFLOW_HOME=str(root / "epiflow"),
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY=str(HEARTBEAT_S),
    )


def test_isolated_workers_survive_a_killed_worker(
    prefect_server: PrefectServer,
    pg_url: str,
    engine: Engine,
    s3_settings: ObjectStoreSettings,
    machines: list[Path],
    model: ChatServer,
) -> None:
    migrate.upgrade(engine)
    assert s3_settings.access_key and s3_settings.secret_key
    shared = {
        "EPIFLOW_DATABASE_URL": pg_url,
        "EPIFLOW_OBJECTS_URL": s3_settings.url,
        "EPIFLOW_OBJECTS_ENDPOINT": str(s3_settings.endpoint),
        "EPIFLOW_OBJECTS_ACCESS_KEY": s3_settings.access_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECRET_KEY": s3_settings.secret_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECURE": "false",
        "EPIFLOW_PREFECT_API_URL": prefect_server.api_url,
        "EPIFLOW_PREFECT_HEARTBEAT_S": str(HEARTBEAT_S),
        "EPIFLOW_PREFECT_ZOMBIE_AFTER_S": str(ZOMBIE_AFTER_S),
        # A turn held by the test is the test's gate, not a slow endpoint.
        "EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S": "900",
    }
    parent, *workers_roots = machines
    parent_env = machine_env(prefect_server, parent, shared)
    api = Api(prefect_server.api_url)

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args), env=parent_env, cwd=cwd, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done

    work = parent / "work"
    run(EPIFLOW, "prefect", "setup", cwd=work)
    run(str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process", cwd=work)
    # From a directory that is not the checkout: the deployment must not depend on it.
    run(
        str(BIN / "prefect"),
        "--no-prompt",
        "deploy",
        "--prefect-file",
        str(REPO / "prefect.yaml"),
        "--name",
        "shard-process",
        cwd=work,
    )
    deployment = api.deployment("collect-shard", "shard-process")
    assert deployment["entrypoint"] == "flows.shard.collect_shard"
    assert not deployment["pull_steps"]

    workers = []
    for root in workers_roots:
        with (root / "worker.log").open("wb") as log:
            workers.append(
                subprocess.Popen(
                    [
                        *(str(BIN / "prefect"), "worker", "start", "--pool", POOL),
                        *("--name", root.name, "--limit", "1"),
                    ],
                    env=machine_env(prefect_server, root, shared),
                    cwd=root / "work",
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    collect = subprocess.Popen(
        [
            EPIFLOW,
            "collect",
            "--tasks",
            "1",
            "--rollouts",
            "2",
            "--templates",
            ",".join(TEMPLATES),
            "--concurrency",
            "1",
            "--policy",
            f"openai:{model.base_url}#m",
            "--shards",
            "2",
            "--shard-deployment",
            "collect-shard/shard-process",
            "--run-key",
            "sharded",
            "--json",
        ],
        env=parent_env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def stored() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one())

    def both_busy() -> bool:
        assert collect.poll() is None, collect.communicate()[1][-3000:]
        # A worker running a shard has a flow-run process below it.
        return all(len(descendants(w.pid)) > 1 for w in workers) and stored() >= 2

    try:
        wait_for("both workers mid-shard", both_busy, BUSY_WITHIN_S, every=0.5)
        # Each shard's last episode is held: both workers stay mid-shard until the release.
        model.wait_held(2, timeout_s=BUSY_WITHIN_S)
        killed = workers[0]
        kill_tree(killed.pid)
        killed.wait()
        before = stored()
        assert before < PLANNED, "the shards finished before a worker could be killed"
        model.release()  # the other shard, and the killed one's second run, go on
        try:
            out, err = collect.communicate(timeout=END_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the sharded run did not end {END_WITHIN_S} s after the kill: "
                + _hang_report(api, workers_roots)
            ) from None
    finally:
        if collect.poll() is None:
            collect.kill()
            collect.communicate()
        for worker in workers:
            if worker.poll() is None:
                kill_tree(worker.pid)
                worker.wait()
    assert collect.returncode == 0, (
        err[-4000:] + (workers_roots[1] / "worker.log").read_text()[-3000:]
    )

    result = json.loads(out)
    assert result["planned"] == result["episodes"] == result["executed"] == PLANNED, result
    assert result["by_status"] == {"success": PLANNED}

    with engine.connect() as conn:
        count, distinct, steps = conn.execute(
            text("SELECT COUNT(*), COUNT(DISTINCT id), COALESCE(SUM(n_steps), 0) FROM episode")
        ).one()
        stored_steps = conn.execute(text("SELECT COUNT(*) FROM step")).scalar_one()
        keys = list(conn.execute(text("SELECT trajectory_key FROM episode")).scalars())
        status = conn.execute(
            text("SELECT status FROM collection_run WHERE run_key = 'sharded'")
        ).scalar_one()
    assert (count, distinct) == (PLANNED, PLANNED)  # none lost, none twice
    assert steps == stored_steps == result["steps"]
    assert status == "completed"
    store = make_object_store(s3_settings)
    assert all(store.exists(k) for k in keys)
    assert list_orphans(engine, store).keys == []

    shards = api.post("/flow_runs/filter", {"flows": {"name": {"any_": ["collect-shard"]}}})
    states = sorted(r["state_name"] for r in shards)
    # The killed worker's shard crashed (seen by its silence), and ran again to completion.
    assert states.count("Crashed") == 1 and states.count("Completed") == 2, states
    # The parent read its totals from SQL: no worker wrote a Prefect result file.
    for root in workers_roots:
        results = [p for p in (root / "prefect").rglob("*") if "storage" in p.parts and p.is_file()]
        assert results == [], results


def _hang_report(api: Api, workers_roots: list[Path]) -> str:
    """The shards' state histories, what the automations did, the workers' log tails."""
    shards = api.post("/flow_runs/filter", {"flows": {"name": {"any_": ["collect-shard"]}}})
    histories = {r["name"]: api.states(r["id"]) for r in shards}
    logs = "\n".join(
        f"--- {root.name}:\n" + (root / "worker.log").read_text(errors="replace")[-1500:]
        for root in workers_roots
    )
    return f"shards {histories}; automations {api.automation_trail()}\n{logs}"
