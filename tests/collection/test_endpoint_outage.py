"""A model endpoint that fails is infrastructure, never the agent's (issue 22 item 3).

A real HTTP server on 127.0.0.1 (`tests/agent/chat_server.py`) that misbehaves — 500s,
HTML bodies, stalls, or nothing listening — behind the real `openai:` policy, real
sandboxes, real SQLite and a local object store: the episodes are stored as
`endpoint_error` with no reward, the run stops starting episodes after
`outage_episodes` of them in a row, and once the server is back a re-run of the key
redoes exactly the spoiled and the unstarted episodes, which then succeed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from agent.settings import PolicySettings
from collection.plan import plan_collection
from collection.request import CollectRequest
from collection.runner import collect_in_process
from config.settings import Settings, load_settings
from models import run_id_for
from storage.objects import LocalObjectStore
from storage.run_reads import rerun_needed
from tests.agent.chat_server import Action, ChatServer, held, oracle
from tests.services.postgres import free_port

TEMPLATES = ["csv_to_json", "dir_tree", "log_errors"]
FAST = PolicySettings(
    backoff_initial_s=0.01,
    backoff_max_s=0.02,
    max_retries=1,
    request_timeout_s=0.5,
    outage_episodes=2,
)


def settings_with(policy: PolicySettings) -> Settings:
    return dataclasses.replace(load_settings(), policy=policy)


def request_for(port: int) -> CollectRequest:
    return CollectRequest(
        run_key="endpoint-outage",
        policy=f"openai:http://127.0.0.1:{port}/v1#loop-model",
        tasks=1,
        concurrency=1,
        batch_size=1,
        templates=TEMPLATES,
    )


def oracle_for(request: CollectRequest, settings: Settings) -> Action:
    """Answers every planned task with its reference solution, turn by turn."""
    return oracle(
        p.task for p in plan_collection(request, settings.suites, sandbox=settings.sandbox).episodes
    )


def collect(request: CollectRequest, engine: Engine, store: LocalObjectStore, settings: Settings):
    return asyncio.run(collect_in_process(request, engine=engine, store=store, settings=settings))


def statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(
            conn.execute(text("SELECT status, COUNT(*) FROM episode GROUP BY status")).all()
        )


FAILURES: dict[str, list[Action] | None] = {
    "http_500": [{"kind": "status", "status": 500}],
    "html_body": [{"kind": "garbage"}],
    "hang": [held()],  # never answered while the run lasts: its requests time out
    "nothing_listening": None,
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failing_endpoint_is_stored_as_infrastructure_and_stops_the_run(
    failure: str, migrated_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    request = request_for(port)
    settings = settings_with(FAST)
    store = LocalObjectStore(tmp_path / "objects")
    actions = FAILURES[failure]
    caplog.set_level(logging.WARNING)
    if actions is None:
        result = collect(request, migrated_engine, store, settings)
    else:
        with ChatServer(actions, port=port):
            result = collect(request, migrated_engine, store, settings)
    # Two endpoint failures in a row stop the run: the third episode never starts.
    assert result.by_status == {"endpoint_error": 2} and result.planned == 3
    assert result.success_rate == 0.0
    with migrated_engine.connect() as conn:
        rows = conn.execute(
            text("SELECT failure_category, final_reward, total_reward, failure_reason FROM episode")
        ).all()
    for category, final, total, reason in rows:
        assert (category, final, total) == ("endpoint_error", None, None)
        assert f"127.0.0.1:{port}" in reason
    needed = rerun_needed(migrated_engine, run_id_for(request.run_key or ""))
    assert needed["endpoint_error"].count == 2
    # Every retry is one WARNING line naming the endpoint and the attempt.
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 2 * FAST.max_retries
    assert all(
        f"endpoint http://127.0.0.1:{port}/v1" in r and "attempt 1 of 2" in r for r in retries
    )
    assert any("starting no more episodes" in r.getMessage() for r in caplog.records)


def test_a_rerun_redoes_exactly_the_spoiled_and_unstarted_episodes(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    port = free_port()
    request = request_for(port)
    settings = settings_with(FAST)
    store = LocalObjectStore(tmp_path / "objects")
    with ChatServer([{"kind": "status", "status": 503}], port=port):
        first = collect(request, migrated_engine, store, settings)
    assert first.by_status == {"endpoint_error": 2}
    patient = settings_with(FAST.model_copy(update={"request_timeout_s": 60.0}))
    with ChatServer([oracle_for(request, patient)], port=port) as server:
        second = collect(request, migrated_engine, store, patient)
    assert second.executed == 3 and statuses(migrated_engine) == {"success": 3}
    assert second.success_rate == 1.0
    # Only the three redone episodes asked the endpoint (one request per turn).
    assert {r["messages"][1]["content"] for r in server.requests} == {
        p.task.prompt
        for p in plan_collection(request, patient.suites, sandbox=patient.sandbox).episodes
    }
    with migrated_engine.connect() as conn:
        models = set(conn.execute(text("SELECT DISTINCT response_model FROM step")).scalars())
        retried = conn.execute(text("SELECT SUM(endpoint_retries) FROM step")).scalar_one()
    assert models == {"loop-model"} and retried == 0
