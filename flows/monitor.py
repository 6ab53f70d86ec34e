"""The `monitor` flow: a window of production trajectories through the monitor suite
against an alias's champion (`training.monitor`), the breach stored and announced, the
alias rolled back when asked.

Stages as Prefect tasks: `load-window` (the episodes of a stored run, e.g. one imported
from production traces or collected against the serving endpoint; or a file of ATIF /
OpenAI / Harbor traces, read without writing anything), `champion-baseline` (the alias's
checkpoint and its evaluation figures), `monitor-suite` (Great Expectations, off the
event loop) and `record-breach` (stored with the champion's evaluation; with `rollback`,
one `model_alias_change` row and one log line). The markdown artifact `monitor-<alias>`
shows every check.

How a breach is announced: the flow emits the Prefect event `epiflow.monitor.breach`
(resource `epiflow.model-alias.<alias>`, the champion checkpoint related, the figures as
payload; the UI's event feed shows it and an automation may trigger on it) and the flow
run ends **Failed** with the verdict as its message, so the `epiflow-notify` automation
(`orchestration.automations`) posts it to the webhook for runs tagged `epiflow-notify` (the CLI
tags its runs). An environment alert alone (the infrastructure share) emits
`epiflow.monitor.alert` and the run completes: it is not the model's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import State
from prefect.events import emit_event
from prefect.states import Failed
from pydantic import BaseModel

from agent.trajectory import Trajectory
from config.settings import Settings, load_settings
from flows import artifact_key, route_library_logs
from reports.monitor_summary import monitor_markdown
from training.monitor import Champion, MonitorRule, MonitorVerdict

BREACH_EVENT = "epiflow.monitor.breach"
"""Event emitted when a window breaches the monitor suite (the model regressed)."""
ALERT_EVENT = "epiflow.monitor.alert"
"""Event emitted when only the environment checks failed (never the model's)."""


class Window(BaseModel):
    """The production trajectories a monitor run judges."""

    source: str
    """Where they came from: `run <key>` or `file <path>`."""
    trajectories: list[Trajectory]
    """The episodes, in the order read."""


@task(name="load-window", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def load_window(settings: Settings, run: str | None, file: str | None, fmt: str) -> Window:
    """The stored episodes of run `run` (key or id), or every document of `file` (parsed,
    nothing written)."""
    from storage.db import make_engine
    from storage.exchange import parse_file
    from storage.objects import make_object_store
    from storage.run_reads import resolve_run, run_trajectories

    if file is not None:
        trajectories = await asyncio.to_thread(parse_file, Path(file), fmt)
        source = f"file {file}"
    else:
        assert run is not None  # the flow checked
        engine = make_engine(settings.database)
        try:

            def read() -> list[Trajectory]:
                store = make_object_store(settings.objects)
                return run_trajectories(engine, store, resolve_run(engine, run))

            trajectories = await asyncio.to_thread(read)
        finally:
            engine.dispose()
        source = f"run {run}"
    get_run_logger().info("load-window: %s, %d episodes", source, len(trajectories))
    return Window(source=source, trajectories=trajectories)


@task(name="champion-baseline", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def champion_baseline_task(settings: Settings, alias: str) -> Champion:
    """The alias's checkpoint and its evaluation figures."""
    from storage.db import make_engine
    from training.monitor import champion_baseline

    engine = make_engine(settings.database)
    try:
        champion = await asyncio.to_thread(champion_baseline, engine, alias)
    finally:
        engine.dispose()
    get_run_logger().info(
        "champion-baseline: %s -> checkpoint %s, %s",
        alias,
        champion.checkpoint_id,
        ", ".join(f"{k} {v:.3f}" for k, v in champion.baseline.items()) or "no evaluation figures",
    )
    return champion


@task(name="monitor-suite", cache_policy=NONE)
async def monitor_suite(window: Window, champion: Champion, rule: MonitorRule) -> MonitorVerdict:
    """The monitor suite in Great Expectations (a worker thread)."""
    from training.monitor import judge_window

    verdict = await asyncio.to_thread(judge_window, window.trajectories, champion.baseline, rule)
    logger = get_run_logger()
    for line in verdict.lines():
        logger.info("monitor-suite: %s", line)
    return verdict


@task(name="record-breach", cache_policy=NONE, retries=0)
async def record_breach_task(
    settings: Settings, champion: Champion, verdict: MonitorVerdict, actor: str, rollback: bool
) -> MonitorVerdict:
    """Store the breach with the champion; with `rollback`, roll the alias back."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.monitor import record_breach

    engine = make_engine(settings.database)
    try:
        return await asyncio.to_thread(
            lambda: record_breach(
                engine,
                make_object_store(settings.objects),
                champion,
                verdict,
                actor=actor,
                rollback=rollback,
            )
        )
    finally:
        engine.dispose()


def _announce(verdict: MonitorVerdict, champion: Champion, source: str) -> None:
    """The breach (or alert) as a Prefect event on the alias, the checkpoint related."""
    alerts = verdict.report.alerts if verdict.report else []
    if not verdict.breach and not alerts:
        return
    payload: dict[str, Any] = {
        "reason": verdict.reason,
        "window": source,
        "figures": verdict.figures,
        "rolled_back_to": verdict.rolled_back_to,
    }
    emit_event(
        event=BREACH_EVENT if verdict.breach else ALERT_EVENT,
        resource={
            "prefect.resource.id": f"epiflow.model-alias.{champion.alias}",
            "prefect.resource.name": champion.alias,
        },
        related=[
            {
                "prefect.resource.id": f"epiflow.checkpoint.{champion.checkpoint_id}",
                "prefect.resource.role": "checkpoint",
            }
        ],
        payload=payload,
    )


@flow(name="monitor", flow_run_name="monitor-{alias}", log_prints=False, persist_result=False)
async def monitor(
    alias: str,
    run: str | None = None,
    file: str | None = None,
    fmt: str = "atif",
    rollback: bool = False,
    min_episodes: int = 5,
    suite_version: str = "1",
    actor: str = "monitor",
) -> MonitorVerdict | State[Any]:
    """Judge a window of production trajectories against `alias`'s champion.

    Args:
        alias: The model alias whose champion produced the window (e.g. `champion`).
        run: Key or id of a stored run holding the window (an imported trace file's run,
            or a collection against the serving endpoint).
        file: A trace file to read instead (nothing is written).
        fmt: The file's format: atif, openai or harbor-traces.
        rollback: On a breach, point the alias back at its previous champion.
        min_episodes: Fewest episodes of the model's own to judge it.
        suite_version: Version of the monitor suite (`monitor_v<version>.json`).
        actor: Who the stored breach and rollback name.

    Returns the verdict; on a breach, a Failed state carrying it (the run shows Failed and
    is announced).
    """
    from storage.exchange import IMPORT_FORMATS
    from training.errors import MonitorWindowError

    route_library_logs()
    if (run is None) == (file is None):
        raise MonitorWindowError("name the window once: a run or a file", setting="--run/--from")
    if file is not None and fmt not in IMPORT_FORMATS:
        raise MonitorWindowError(
            f"unknown trace format {fmt!r}: use one of {', '.join(IMPORT_FORMATS)}",
            setting="--format",
        )
    rule = MonitorRule(min_episodes=min_episodes, suite_version=suite_version)
    settings = load_settings()
    window = await load_window(settings, run, file, fmt)
    champion = await champion_baseline_task(settings, alias)
    verdict = await monitor_suite(window, champion, rule)
    verdict = await record_breach_task(settings, champion, verdict, actor, rollback)
    _announce(verdict, champion, window.source)
    await acreate_markdown_artifact(
        markdown=monitor_markdown(verdict, window.source),
        key=artifact_key("monitor", alias),
        description=f"Production monitor of {alias}",
    )
    if verdict.breach:
        return Failed(message=f"monitor {alias}: {verdict.reason}", data=verdict)
    return verdict
