"""The `monitor` flow on Prefect's test harness (issue 45 item 4): production traces
imported the way `epiflow import` imports them (`storage.exchange.import_file`, an ATIF
file) whose tool-failure rate is worse than the champion's evaluation baseline are a
breach: stored with the champion, the flow run ends Failed with the verdict (what the
`epiflow-notify` automation announces for runs tagged with it), the
`epiflow.monitor.breach` event is emitted on the alias, the alias rolls back (one row),
and the `monitor-champion` artifact shows it. A window of only infrastructure failures is
no breach: the run completes and only the environment alert is emitted.

Events are captured with Prefect's own `AssertingPassthroughEventsClient` (it records
each event and still sends it to the harness's server). Everything else is real: SQL, the
object store, GX, the flow and its tasks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agent.atif_convert import to_atif
from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from storage.exchange import import_file
from storage.objects import LocalObjectStore
from tests.training.factory import call_step, episode, final_step
from tests.training.test_aliases import _checkpoint
from training.aliases import alias_history, alias_target, point_alias
from training.registry import get_checkpoint, record_evaluation


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Prefect's asserting events worker (as its `asserting_and_emitting_events_worker`
    fixture): every event the flow emits, recorded and sent on."""
    from prefect.events.clients import AssertingPassthroughEventsClient
    from prefect.events.worker import EventsWorker

    AssertingPassthroughEventsClient.reset()
    worker = EventsWorker.instance(AssertingPassthroughEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)
    try:
        yield worker
    finally:
        worker.drain()


def _emitted(worker: Any, prefix: str) -> list[Any]:
    from prefect.events.clients import AssertingPassthroughEventsClient

    worker.wait_until_empty()
    return [
        e
        for client in AssertingPassthroughEventsClient.all
        for e in client.events
        if e.event.startswith(prefix)
    ]


def _failing(i: int, run_key: str) -> Trajectory:
    """Every acting turn fails (exit code 1)."""
    return episode(
        run_key=run_key,
        task=i,
        success=False,
        steps=[call_step(0, "cat nope", output="", exit_code=1), final_step(1)],
    )


def _infrastructure(i: int, run_key: str) -> Trajectory:
    return _failing(i, run_key).model_copy(
        update={"status": EpisodeStatus.ENV_ERROR, "failure_category": FailureCategory.ENV_ERROR}
    )


def _traces(path: Path, episodes: list[Trajectory]) -> Path:
    path.write_text("".join(json.dumps(to_atif(t)) + "\n" for t in episodes), encoding="utf-8")
    return path


async def _run(**parameters: Any) -> Any:
    from prefect import tags
    from prefect.client.orchestration import get_client

    from flows.monitor import monitor
    from orchestration.automations import NOTIFY_TAG

    with tags(NOTIFY_TAG):
        state = await monitor(return_state=True, **parameters)
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    async with get_client() as client:
        flow_run = await client.read_flow_run(run_id)
        artifacts = await client.read_latest_artifacts()
    artifact = next((str(a.data) for a in artifacts if a.key == "monitor-champion"), "")
    return state, await state.aresult(raise_on_failure=False), flow_run, artifact


@pytest.mark.slow
def test_a_regressed_production_window_is_stored_announced_and_rolled_back(
    prefect_harness: None,
    gated_env: tuple[Engine, LocalObjectStore],
    events: Any,
    tmp_path: Path,
) -> None:
    from flows.monitor import ALERT_EVENT, BREACH_EVENT

    engine, store = gated_env
    previous, champion = _checkpoint(engine, store), _checkpoint(engine, store)
    point_alias(engine, store, "champion", previous, reason="first", actor="t")
    point_alias(engine, store, "champion", champion, reason="promoted", actor="t")
    record_evaluation(
        engine,
        champion,
        {
            "completion_rate": 0.0,
            "avg_steps": 2.0,
            "tool_failure_rate": 0.0,
            "parse_error_rate": 0.0,
        },
    )

    # Only infrastructure failures: no breach, the run completes, the alias stays.
    infra = import_file(
        engine,
        store,
        _traces(tmp_path / "infra.jsonl", [_infrastructure(i, "prod-infra") for i in range(6)]),
        "atif",
        run_key="prod-infra",
    )
    assert len(infra.inserted) == 6
    state, verdict, flow_run, _ = asyncio.run(
        _run(alias="champion", run="prod-infra", rollback=True, min_episodes=4)
    )
    assert state.is_completed() and not verdict.breach
    assert "0 episodes of the model's own (6 infrastructure" in verdict.reason
    assert [e.event for e in _emitted(events, "epiflow.monitor")] == [ALERT_EVENT]
    current = alias_target(engine, "champion")
    assert current is not None and current.checkpoint_id == champion

    # Tool failures above the baseline (and one infrastructure outcome, left out).
    window = [_failing(i, "prod-night") for i in range(4)] + [_infrastructure(9, "prod-night")]
    imported = import_file(
        engine, store, _traces(tmp_path / "night.jsonl", window), "atif", run_key="prod-night"
    )
    assert len(imported.inserted) == 5
    state, verdict, flow_run, artifact = asyncio.run(
        _run(alias="champion", run="prod-night", rollback=True, min_episodes=4)
    )
    assert state.is_failed() and flow_run.state.is_failed()
    assert "epiflow-notify" in flow_run.tags
    assert verdict.breach and verdict.rolled_back_to == f"hf:checkpoint/{previous}"
    assert "logic.tool_failure_rate 1.000 > 0.100 (baseline 0.000)" in state.message
    assert "on 4 episodes (1 infrastructure outcomes left out)" in verdict.reason

    [breach] = _emitted(events, BREACH_EVENT)
    assert breach.resource.id == "epiflow.model-alias.champion"
    assert f"epiflow.checkpoint.{champion}" in {r.id for r in breach.related}
    assert breach.payload["rolled_back_to"] == f"hf:checkpoint/{previous}"
    assert str(flow_run.id) in {r.id.removeprefix("prefect.flow-run.") for r in breach.related}

    history = alias_history(engine, "champion")
    assert [c.action for c in history] == ["promote", "promote", "rollback"]
    assert history[-1].checkpoint_id == previous and history[-1].actor == "monitor"
    assert history[-1].evidence["checks"]["logic.tool_failure_rate"]["status"] == "failed"
    [stored] = get_checkpoint(engine, champion).evaluation["monitor_breaches"]
    assert stored["reason"] == verdict.reason
    assert "BREACH" in artifact and f"hf:checkpoint/{previous}" in artifact
