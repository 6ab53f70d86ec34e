"""Crashes are seen and recovered, failures announced (issue 13 item 3), against a real
`prefect server` and `epiflow serve` (which sets up epiflow's automations at start).

- A nightly run whose `epiflow serve` is killed with SIGKILL mid-collection (serve and
  every process below it, as a lost machine would end them) is marked Crashed by the
  heartbeat automation, scheduled again by the recovery automation, picked up by the
  restarted `serve`, and completes on the same run key, named by its night: every
  planned episode stored exactly once, nothing orphaned.
- A nightly run that fails is retried (the flow run's retries), then announced with a
  POST to a webhook server on loopback; so is the crash above.

Short heartbeats (30 s, Prefect's minimum) and a 75 s silence window keep it within a
few minutes; every wait polls with a deadline. Real nsjail, SQLite, the local object
directory. A run is cancelled or killed at a known point: its policy is a model behind the
test model server, which answers the first task's turns and holds the later ones
(`oracle_until`) until the test releases them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from collection.request import CollectRequest, fresh_run_key
from orchestration.automations import LATE, NOTIFY, RECOVER, STUCK_CANCEL, ZOMBIE
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.orphans import list_orphans
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.agent.chat_server import ChatServer, oracle_until
from tests.services.prefect_api import Api, wait_for
from tests.services.prefect_server import PrefectServer
from tests.services.processes import WebhookServer, kill_tree

pytestmark = pytest.mark.slow

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
HEARTBEAT_S = 30
ZOMBIE_AFTER_S = 75
LATE_AFTER_S = 60  # the setting's minimum
TEMPLATES = ["csv_to_json", "dir_tree"]
PLANNED = 8  # 2 templates x 2 tasks x 2 rollouts
ANSWERED = 1
"""Tasks (in plan order) whose turns the model of a cancelled or killed run answers at once
(2 episodes, each stored as it ends); the later tasks' turns are held."""


@dataclass
class Served:
    server: PrefectServer
    api: Api
    webhook: WebhookServer
    env: dict[str, str]
    workdir: Path
    db_url: str
    objects: Path
    serving: subprocess.Popen[bytes] | None = None

    def start_serve(self) -> None:
        log = (self.workdir / "serve.log").open("ab")
        self.serving = subprocess.Popen(
            [EPIFLOW, "serve"],
            env=self.env,
            cwd=self.workdir,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        wait_for("epiflow serve to register its deployments", self._deployed, 180)

    def _deployed(self) -> bool:
        assert self.serving is not None and self.serving.poll() is None, self.log_tail()
        found = self.api.post("/deployments/filter", {})
        return {"nightly-collect", "shard"} <= {d["name"] for d in found}

    def kill_serve(self) -> None:
        assert self.serving is not None
        kill_tree(self.serving.pid)
        self.serving.wait()
        self.serving = None

    def stop_serve(self) -> None:
        if self.serving is not None and self.serving.poll() is None:
            kill_tree(self.serving.pid)
            self.serving.wait()
        self.serving = None

    def log_tail(self) -> str:
        path = self.workdir / "serve.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("recovery")
    # Jails bind-mount files from the state dir: it must be world-searchable.
    state_dir = Path(tempfile.mkdtemp(prefix="epiflow-recovery-state-"))
    state_dir.chmod(0o755)
    server = PrefectServer()
    server.start()
    webhook = WebhookServer()
    webhook.start()
    db_url = f"sqlite:///{workdir / 'epiflow.db'}"
    engine = make_engine(DatabaseSettings(url=db_url))
    migrate.upgrade(engine)
    engine.dispose()
    env = server.env(
        EPIFLOW_PREFECT_API_URL=server.api_url,
        EPIFLOW_DATABASE_URL=db_url,
        EPIFLOW_OBJECTS_URL=str(workdir / "objects"),
        EPIFLOW_SANDBOX_STATE_DIR=str(state_dir),
        EPIFLOW_PREFECT_HEARTBEAT_S=str(HEARTBEAT_S),
        EPIFLOW_PREFECT_ZOMBIE_AFTER_S=str(ZOMBIE_AFTER_S),
        EPIFLOW_PREFECT_LATE_AFTER_S=str(LATE_AFTER_S),
        EPIFLOW_PREFECT_NOTIFY_WEBHOOK_URL=webhook.url,
        # A turn held by the test is the test's gate, not a slow endpoint.
        EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S="900",
    )
    state = Served(server, Api(server.api_url), webhook, env, workdir, db_url, workdir / "objects")
    try:
        state.start_serve()
        yield state
    finally:
        state.stop_serve()
        webhook.stop()
        server.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def _wait_final(api: Api, run_id: str, timeout: float) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        run = api.flow_run(run_id)
        return run if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    return wait_for(f"flow run {run_id} to end", ended, timeout, every=2)


def _notifications_for(webhook: WebhookServer, name: str, state: str) -> list[dict[str, Any]]:
    return [
        n
        for n in webhook.received
        if name in str(n.get("subject")) and state in str(n.get("subject"))
    ]


def test_serve_sets_up_the_automations(served: Served) -> None:
    names = {a["name"] for a in served.api.post("/automations/filter", {})}
    assert {ZOMBIE, STUCK_CANCEL, RECOVER, NOTIFY, LATE} <= names
    # Idempotent: a second setup updates the same five, creates none.
    again = subprocess.run(
        [EPIFLOW, "prefect", "setup"],
        env=served.env,
        cwd=served.workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "created" not in again.stdout and "updated" in again.stdout, again.stdout
    automations = served.api.post("/automations/filter", {})
    assert sorted(a["name"] for a in automations if a["name"].startswith("epiflow:")) == sorted(
        [ZOMBIE, STUCK_CANCEL, RECOVER, NOTIFY, LATE]
    )
    zombie = next(a for a in automations if a["name"] == ZOMBIE)
    assert zombie["trigger"]["posture"] == "Proactive"
    assert zombie["trigger"]["within"] == ZOMBIE_AFTER_S


def test_a_run_whose_worker_died_before_its_first_heartbeat_is_crashed(served: Served) -> None:
    """A worker took a run (Pending) and died before its process started; another run
    went Running and its process died before its first heartbeat. Neither sent a heartbeat
    to miss: the silence counts from Pending and Running, so both are marked Crashed
    instead of waiting forever (a sharded run's parent waits on such a run)."""
    api = served.api
    flow = api.post("/flows/", {"name": "epiflow-worker-died-early"})
    runs = []
    for states in (["PENDING"], ["PENDING", "RUNNING"]):
        run = api.post(
            "/flow_runs/",
            {
                "flow_id": flow["id"],
                "name": "-".join(states).lower(),
                "state": {"type": "SCHEDULED"},
            },
        )
        for state in states:
            taken = api.post(f"/flow_runs/{run['id']}/set_state", {"state": {"type": state}})
            assert taken["status"] == "ACCEPT", taken
        runs.append(run["id"])
    for run_id in runs:
        ended = _wait_final(api, run_id, ZOMBIE_AFTER_S + 180)
        assert ended["state_type"] == "CRASHED", (ended["state"], api.automation_trail())
        assert "no heartbeat" in ended["state"]["message"], ended["state"]
        api.call("DELETE", f"/flow_runs/{run_id}")


def _logs(api: Api, run_id: str) -> list[dict[str, Any]]:
    return list(
        api.post(
            "/logs/filter",
            {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200},
        )
    )


def _task_runs(api: Api, run_id: str) -> list[dict[str, Any]]:
    return list(api.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}}))


def test_form_run_with_an_unknown_template_fails_once_then_notifies(served: Served) -> None:
    """What the run form sends for a typo'd template: the nightly deployment (two retries,
    ten minutes apart) fails it on its first attempt, in one line per record, no traceback."""
    nightly = served.api.deployment("collect-episodes", "nightly-collect")
    # One night at a time (the deployment's concurrency limit).
    assert (nightly.get("global_concurrency_limit") or {}).get("limit") == 1, nightly
    run = served.api.post(
        f"/deployments/{nightly['id']}/create_flow_run",
        {"parameters": {"request": {"templates": ["csv_to_jsn"]}, "gate": False}},
    )
    final = _wait_final(served.api, run["id"], 600)
    assert final["state_type"] == "FAILED", final["state"]
    # The attempts, not the clock: one run, no retry scheduled (a retry would wait 600 s).
    assert final["run_count"] == 1
    assert final["empirical_policy"]["retries"] == 0  # the remaining retries were dropped
    assert "AwaitingRetry" not in served.api.states(run["id"])
    assert "csv_to_jsn" in final["state"]["message"]

    def ended_log() -> list[dict[str, Any]] | None:
        # Records reach the API in batches, after the state: wait for the last one.
        found = _logs(served.api, run["id"])
        done = [
            e for e in found if e["task_run_id"] is None and "Finished in state" in e["message"]
        ]
        return found if done else None

    logs = wait_for("the failed run's log", ended_log, 120)
    assert not [entry for entry in logs if "Traceback" in entry["message"]], logs
    errors = [entry["message"] for entry in logs if entry["level"] >= 40]
    assert errors and all("\n" not in line for line in errors), errors
    assert any("csv_to_jsn" in line and "not retried" in line for line in errors), errors
    [plan] = [t for t in _task_runs(served.api, run["id"]) if t["name"].startswith("plan-")]
    assert plan["state_type"] == "FAILED" and plan["run_count"] == 1

    posted = wait_for(
        "the webhook to be told",
        lambda: _notifications_for(served.webhook, final["name"], "Failed") or None,
        180,
    )
    assert len(posted) == 1
    assert "csv_to_jsn" in posted[0]["body"] and "nightly-collect" in posted[0]["body"]
    assert posted[0]["text"].startswith(posted[0]["subject"])


def test_failed_nightly_run_that_may_pass_is_retried_then_notified(served: Served) -> None:
    """A failure that is no input error (here a shard deployment that does not exist) may
    pass on the next attempt: it is retried, on the same flow run, then announced."""
    nightly = served.api.deployment("collect-episodes", "nightly-collect")
    run = served.api.post(
        f"/deployments/{nightly['id']}/create_flow_run",
        {
            "parameters": {
                "request": {"templates": TEMPLATES[:1]},
                "shards": 2,
                "shard_deployment": "collect-shard/no-such-deployment",
                "gate": False,
            },
            # One quick retry instead of the nightly's two ten minutes apart.
            "empirical_policy": {"retries": 1, "retry_delay": 1},
        },
    )
    final = _wait_final(served.api, run["id"], 600)
    assert final["state_type"] == "FAILED", final["state"]
    assert final["run_count"] == 2  # the retry ran, on the same flow run
    assert "AwaitingRetry" in served.api.states(run["id"])
    # Named after its run key: a manual run's key is its flow run's own.
    assert final["name"] == f"builtin-scripted-oracle-{uuid.UUID(run['id']).hex[:8]}"
    posted = wait_for(
        "the webhook to be told",
        lambda: _notifications_for(served.webhook, final["name"], "Failed") or None,
        180,
    )
    assert len(posted) == 1


@pytest.fixture
def model() -> Iterator[ChatServer]:
    """The model of `_held_nightly_run`'s request: the first `ANSWERED` tasks' turns
    answered with their reference solutions, the later ones held until `release()`."""
    tasks = builtin_suite().instances(2, templates=TEMPLATES)
    with ChatServer([oracle_until(tasks, ANSWERED)]) as server:
        yield server


def _held_nightly_run(
    served: Served, model: ChatServer
) -> tuple[str, str, Engine, Callable[[], int]]:
    """A run of the nightly deployment with a small request, its policy `model` (which
    holds the later tasks' turns), each episode stored as it ends. (A run the schedule
    created would be keyed by its night instead: tests/flows/test_parameters.py.) Returns
    its flow-run id, its run key, an engine on the database (the caller disposes of it)
    and a count of the episodes it has stored."""
    api = served.api
    nightly = api.deployment("collect-episodes", "nightly-collect")
    request = {
        "suite": "builtin",
        "policy": f"openai:{model.base_url}#m",
        "tasks": 2,
        "rollouts": 2,
        "concurrency": 1,
        "templates": TEMPLATES,
        "batch_size": 1,
    }
    run = api.post(
        f"/deployments/{nightly['id']}/create_flow_run",
        {"parameters": {"request": request, "gate": False}},
    )
    run_id = run["id"]
    key = fresh_run_key(CollectRequest.model_validate(request), uuid.UUID(run_id))
    engine = make_engine(DatabaseSettings(url=served.db_url))

    def stored() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT COUNT(*) FROM episode e JOIN collection_run r ON r.id = e.run_id "
                        "WHERE r.run_key = :k"
                    ),
                    {"k": key},
                ).scalar_one()
            )

    return run_id, key, engine, stored


def test_ui_cancel_stores_the_run_interrupted(served: Served, model: ChatServer) -> None:
    """The UI's Cancel (the flow run set Cancelling): the run row is `interrupted` (as the
    CLI stores it), the log says how to resume, no task run crashed or stays running."""
    api = served.api
    run_id, key, engine, stored = _held_nightly_run(served, model)

    try:
        wait_for("an episode stored", lambda: stored() >= 1, 600, every=0.5)
        model.wait_held(1, timeout_s=600)  # mid-episode: the cancel finds it running
        api.post(
            f"/flow_runs/{run_id}/set_state",
            {"state": {"type": "CANCELLING", "message": "cancelled from the UI"}, "force": True},
        )
        final = _wait_final(api, run_id, 600)
        assert final["state_type"] == "CANCELLED", final["state"]
        with engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = :k"), {"k": key}
            ).scalar_one()
        assert status == "interrupted"
        assert stored() < PLANNED, "the run finished before it could be cancelled"
    finally:
        engine.dispose()

    # Its last records may still be on their way to the API.
    def with_hint() -> list[dict[str, Any]] | None:
        found = _logs(api, run_id)
        return found if any("Resume:" in e["message"] for e in found) else None

    logs = wait_for("the resume hint in the run's log", with_hint, 120)
    assert not [e for e in logs if "Crash detected" in e["message"]], logs
    hint = next(e["message"] for e in logs if "Resume:" in e["message"])
    assert key in hint and f"of {PLANNED} episodes stored" in hint
    states = {t["name"].rsplit("-", 1)[0]: t["state_type"] for t in _task_runs(api, run_id)}
    assert states["run-episodes"] == "CANCELLED", states
    assert not {"RUNNING", "PENDING", "CRASHED"} & set(states.values()), states


def test_late_nightly_run_notifies(served: Served) -> None:
    """Nothing serves the deployments (`serve` is down): a night's run and a shard (whose
    parent would wait on it in silence) stay Scheduled, and the late automation tells the
    webhook of each, EPIFLOW_PREFECT_LATE_AFTER_S after Prefect marked it Late."""
    api = served.api
    late = {
        "late-night": (
            api.deployment("collect-episodes", "nightly-collect"),
            {"request": {"templates": TEMPLATES[:1]}, "gate": False},
        ),
        "late-shard": (
            api.deployment("collect-shard", "shard"),
            {"request": {"templates": TEMPLATES[:1]}, "shard_index": 0, "shard_count": 2},
        ),
    }
    served.stop_serve()
    try:
        scheduled = datetime.now(UTC) - timedelta(minutes=1)
        runs = {
            name: api.post(
                f"/deployments/{deployment['id']}/create_flow_run",
                {
                    "name": name,
                    "parameters": parameters,
                    "state": {
                        "type": "SCHEDULED",
                        "state_details": {"scheduled_time": scheduled.isoformat()},
                    },
                },
            )
            for name, (deployment, parameters) in late.items()
        }
        for name, run in runs.items():
            run_id = run["id"]
            wait_for(f"Prefect to mark {name} Late", lambda: "Late" in api.states(run_id), 180)  # noqa: B023 (called in this iteration)
        for name, run in runs.items():
            posted = wait_for(
                lambda: f"the late notification of {name} ({api.automation_trail()})",  # noqa: B023
                lambda: _notifications_for(served.webhook, name, "late") or None,  # noqa: B023
                LATE_AFTER_S + 240,
                every=2,
            )
            assert len(posted) == 1
            deployment = late[name][0]["name"]
            assert deployment in posted[0]["body"] and "serve" in posted[0]["body"]
            assert api.flow_run(run["id"])["state_type"] == "SCHEDULED"  # it never started
            api.call("DELETE", f"/flow_runs/{run['id']}")
    finally:
        served.start_serve()


def test_killed_nightly_run_is_crashed_recovered_and_completes(
    served: Served, model: ChatServer
) -> None:
    api = served.api
    run_id, key, engine, stored = _held_nightly_run(served, model)

    try:
        wait_for("two episodes stored", lambda: stored() >= 2, 600, every=0.5)
        model.wait_held(1, timeout_s=600)  # mid-episode: the kill finds it running
        assert api.flow_run(run_id)["state_type"] == "RUNNING"
        served.kill_serve()
        before = stored()
        assert before < PLANNED, "the run finished before it could be killed"
        model.release()  # the recovered run's turns are answered

        # Nothing ended the run: the heartbeat automation notices the silence.
        crashed = wait_for(
            "the run to be marked Crashed",
            lambda: "Crashed" in api.states(run_id),
            ZOMBIE_AFTER_S + HEARTBEAT_S + 180,
            every=2,
        )
        assert crashed
        wait_for(
            lambda: f"the recovery automation to schedule it again ({api.automation_trail()})",
            # AwaitingRetry, which turns Late while no `serve` is there to start it.
            lambda: (
                "AwaitingRetry" in api.states(run_id)
                and api.flow_run(run_id)["state_type"] == "SCHEDULED"
            ),
            180,
            every=2,
        )
        served.start_serve()
        final = _wait_final(api, run_id, 600)
        assert final["state_type"] == "COMPLETED", (final["state"], served.log_tail())
        assert final["name"] == key  # named after its key, which the recovery kept
        assert final["run_count"] == 2
        history = api.states(run_id)
        assert history.index("Crashed") < history.index("AwaitingRetry") < len(history) - 1

        with engine.connect() as conn:
            episodes = conn.execute(
                text(
                    "SELECT COUNT(*), COUNT(DISTINCT e.id), COALESCE(SUM(e.n_steps), 0) "
                    "FROM episode e JOIN collection_run r ON r.id = e.run_id "
                    "WHERE r.run_key = :k"
                ),
                {"k": key},
            ).one()
            steps = conn.execute(
                text(
                    "SELECT COUNT(*) FROM step s JOIN episode e ON e.id = s.episode_id "
                    "JOIN collection_run r ON r.id = e.run_id WHERE r.run_key = :k"
                ),
                {"k": key},
            ).scalar_one()
            status = conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = :k"), {"k": key}
            ).scalar_one()
        assert tuple(episodes[:2]) == (PLANNED, PLANNED)  # none lost, none twice
        assert episodes[2] == steps
        assert status == "completed"
        # The killed attempt's task runs were closed when the recovered attempt started.
        left = [
            t["name"] for t in _task_runs(api, run_id) if t["state_type"] in ("RUNNING", "PENDING")
        ]
        assert not left, left
        assert list_orphans(engine, LocalObjectStore(served.objects)).keys == []

        # The crash was announced too.
        wait_for(
            "the crash notification",
            lambda: _notifications_for(served.webhook, key, "Crashed") or None,
            180,
        )
    finally:
        engine.dispose()
        if served.serving is None:
            served.start_serve()
