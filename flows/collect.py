"""Prefect flows for collection: `collect_episodes` (one machine or many) and `collect_shard`.

Thin composition over `collection.runner`: Prefect tasks run *batches* of episodes (asyncio
concurrency inside), never one task per step. At the end, a table artifact and a
markdown artifact summarise the run for the Prefect UI.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NONE
from prefect.runtime import flow_run

from agent.settings import LoopSettings, PolicySettings
from collection.runner import (
    CollectRequest,
    CollectResult,
    PlannedEpisode,
    close_run,
    make_run_policy,
    open_run,
    pending,
    plan_episodes,
    resolve_faults,
    run_and_persist,
    run_counts,
    task_instances,
)
from config.settings import Settings, load_settings
from sandbox.spec import SandboxSpec
from storage.db import make_engine
from storage.migrate import ensure_current
from storage.objects import make_object_store
from storage.run_summary import summarize_run, summary_markdown, summary_table

CHUNK = 64
"""Episodes per Prefect task: big enough that orchestration is noise, small enough to
show progress in the UI and bound what a crash can lose."""


@task(name="run-episode-batch", cache_policy=NONE, retries=0)
async def run_batch(
    plan: list[PlannedEpisode], request: CollectRequest, settings: Settings
) -> dict[str, int]:
    """Run one chunk of the plan concurrently and persist it; returns what was written."""
    engine = make_engine(settings.database)
    store = make_object_store(settings.objects)
    policy = make_run_policy(request.policy, PolicySettings())
    try:
        report = await run_and_persist(
            plan, request, engine=engine, store=store, loop_settings=LoopSettings(), policy=policy
        )
    finally:
        await policy.aclose()
        engine.dispose()
    return {"episodes": len(report.inserted), "steps": report.steps}


def default_run_key(suite: str, policy: str) -> str:
    """Scheduled runs get one key per night, so re-running a crashed night resumes it."""
    scheduled = flow_run.scheduled_start_time
    day = scheduled.strftime("%Y%m%d") if scheduled else time.strftime("%Y%m%dT%H%M%S")
    return f"{suite}-{policy.replace(':', '-')}-{day}"


async def _collect(request: CollectRequest, settings: Settings) -> tuple[CollectResult, Any]:
    logger = get_run_logger()
    started = time.monotonic()
    engine = make_engine(settings.database)
    store = make_object_store(settings.objects)
    store.check()
    ensure_current(engine)
    resolve_faults(request.faults)
    await make_run_policy(request.policy).aclose()  # a bad spec fails before any work
    plan = plan_episodes(request, task_instances(request))
    run_id = open_run(engine, request)
    todo = pending(engine, plan)
    logger.info(
        "run %s shard %d/%d: %d planned, %d to run (%d already stored)",
        request.run_key,
        request.shard_index + 1,
        request.shard_count,
        len(plan),
        len(todo),
        len(plan) - len(todo),
    )
    written = {"episodes": 0, "steps": 0}
    status = "failed"
    try:
        for i in range(0, len(todo), CHUNK):
            out = await run_batch(todo[i : i + CHUNK], request, settings)
            written["episodes"] += out["episodes"]
            written["steps"] += out["steps"]
        status = "completed"
    finally:
        if request.shard_count == 1:
            close_run(
                engine, run_id, status=status, flow_run_id=str(flow_run.id) if flow_run.id else None
            )
    counts = run_counts(engine, run_id)
    total = sum(counts.values())
    result = CollectResult(
        run_id=run_id,
        run_key=request.run_key,
        planned=len(plan),
        episodes=total,
        executed=written["episodes"],
        steps=written["steps"],
        by_status=counts,
        success_rate=(counts.get("success", 0) / total) if total else 0.0,
        duration_s=round(time.monotonic() - started, 3),
    )
    return result, engine


async def _publish(request: CollectRequest, result: CollectResult, engine: Any) -> None:
    summary = summarize_run(engine, result.run_id)
    key = "collect-" + "".join(c if c.isalnum() else "-" for c in request.run_key.lower())[:60]
    await acreate_markdown_artifact(
        markdown=summary_markdown(request.run_key, summary),
        key=key,
        description="Collection summary",
    )
    await acreate_table_artifact(
        table=summary_table(summary) or [{"template": "-", "success_rate": 0.0}],
        key=key + "-templates",
        description="Success rate per template",
    )


@flow(name="collect-shard", log_prints=True, persist_result=True)
async def collect_shard(
    run_key: str,
    shard_index: int,
    shard_count: int,
    suite: str = "builtin",
    policy: str = "scripted:oracle",
    tasks: int = 1,
    rollouts: int = 1,
    concurrency: int = 4,
    faults: str | None = None,
    sandbox_spec: dict[str, Any] | None = None,
    seed: int = 0,
    templates: list[str] | None = None,
) -> dict[str, Any]:
    """One shard of a collection run (a flow run on a work pool; one worker per machine)."""
    request = CollectRequest(
        suite=suite,
        policy=policy,
        tasks=tasks,
        rollouts=rollouts,
        concurrency=concurrency,
        faults=faults,
        spec=SandboxSpec(**(sandbox_spec or {})),
        run_key=run_key,
        seed=seed,
        templates=templates,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    result, engine = await _collect(request, load_settings())
    engine.dispose()
    return result.model_dump(mode="json")


@flow(name="collect-episodes", log_prints=True, persist_result=True)
async def collect_episodes(
    suite: str = "builtin",
    policy: str = "scripted:oracle",
    tasks: int = 1,
    rollouts: int = 1,
    concurrency: int = 4,
    faults: str | None = None,
    sandbox_spec: dict[str, Any] | None = None,
    run_key: str | None = None,
    seed: int = 0,
    templates: list[str] | None = None,
    shards: int = 1,
    shard_deployment: str | None = None,
    gate: bool = False,
    gate_trigger: str = "deployment",
) -> dict[str, Any]:
    """Collect `tasks` instances × `rollouts` of every template of `suite` with `policy`.

    With `gate`, the `qc-gate` flow runs on the result as a subflow (the nightly chain);
    `gate_trigger` is its trigger mode (`deployment`, `inline` or `none`).

    With `shards > 1` and `shard_deployment` (e.g. `collect-shard/epiflow-shard`), the run is
    split into shard flow runs on that deployment's work pool and this flow waits for all
    of them; results land in the shared database and object store.
    """
    settings = load_settings()
    key = run_key or default_run_key(suite, policy)
    request = CollectRequest(
        suite=suite,
        policy=policy,
        tasks=tasks,
        rollouts=rollouts,
        concurrency=concurrency,
        faults=faults,
        spec=SandboxSpec(**(sandbox_spec or {})),
        run_key=key,
        seed=seed,
        templates=templates,
    )
    if shards > 1 and shard_deployment:
        result, engine = await _fan_out(request, shards, shard_deployment, settings)
    else:
        result, engine = await _collect(request, settings)
    await _publish(request, result, engine)
    engine.dispose()
    out = result.model_dump(mode="json")
    if gate:
        from flows.qc import qc_gate

        out["qc"] = await qc_gate(run=request.run_key, trigger=gate_trigger)
    return out


async def _fan_out(
    request: CollectRequest, shards: int, deployment: str, settings: Settings
) -> tuple[CollectResult, Any]:
    from prefect.deployments.flow_runs import arun_deployment

    started = time.monotonic()
    engine = make_engine(settings.database)
    ensure_current(engine)
    run_id = open_run(engine, request)
    base = request.model_dump(
        mode="json", exclude={"shard_index", "shard_count", "batch_size", "heldout", "spec"}
    )
    base["sandbox_spec"] = request.spec.model_dump(mode="json")
    runs = await asyncio.gather(
        *(
            arun_deployment(
                deployment,
                parameters={**base, "shard_index": i, "shard_count": shards},
                timeout=None,
            )
            for i in range(shards)
        )
    )
    failed = [r for r in runs if not (r.state and r.state.is_completed())]
    close_run(engine, run_id, status="failed" if failed else "completed")
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {shards} shard(s) did not complete: {[str(r.state) for r in failed]}"
        )
    shard_results = [CollectResult.model_validate(await r.state.aresult()) for r in runs if r.state]
    counts = run_counts(engine, run_id)
    total = sum(counts.values())
    return (
        CollectResult(
            run_id=run_id,
            run_key=request.run_key,
            planned=sum(s.planned for s in shard_results),
            episodes=total,
            executed=sum(s.executed for s in shard_results),
            steps=sum(s.steps for s in shard_results),
            by_status=counts,
            success_rate=(counts.get("success", 0) / total) if total else 0.0,
            duration_s=round(time.monotonic() - started, 3),
        ),
        engine,
    )
