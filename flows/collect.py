"""The `collect-episodes` flow: one collection run, on this machine or fanned out to shards.

Thin: the request is planned and opened once (`collection.runner`), each batch of
episodes runs as a Prefect task (asyncio concurrency inside, never a task per step), the
totals come from SQL, and two artifacts summarise the run for the Prefect UI.
"""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NONE
from prefect.runtime import deployment, flow_run

from collection.errors import CollectError
from collection.plan import PlannedEpisode, Shard, plan_collection
from collection.request import CollectRequest, CollectResult, fresh_run_key, nightly_run_key
from collection.runner import (
    Collection,
    collection_result,
    finish_run,
    open_collection,
    remaining,
    run_episodes,
    start_run,
)
from config.settings import Settings, load_settings
from flows.qc import QcGateResult, TriggerMode, qc_gate
from storage.run_summary import summarize_run, summary_markdown, summary_table
from storage.runs import run_totals

CHUNK = 64
"""Episodes per Prefect task: big enough that orchestration is noise, small enough to
show progress in the UI and bound what a crash can lose."""


class CollectFlowResult(CollectResult):
    """A collection's result, with the QC gate's when the flow ran it."""

    qc: QcGateResult | None = None
    """The gate's result (with `gate`), else None."""


@task(name="run-episode-batch", cache_policy=NONE, retries=0)
async def run_episode_batch(collection: Collection, batch: list[PlannedEpisode]) -> int:
    """Run one batch of the plan concurrently and persist it; returns episodes written."""
    report = await run_episodes(collection, batch)
    return len(report.inserted)


async def collect_here(
    request: CollectRequest, settings: Settings, *, shard: Shard, close: bool
) -> CollectResult:
    """Collect this process's share of the run: plan, open, run the remaining episodes in
    batch tasks, mark the run (when `close`), count."""
    logger = get_run_logger()
    started = time.monotonic()
    plan = plan_collection(request, settings.suites, shard=shard)
    collection = open_collection(plan, settings)
    try:
        start_run(collection.engine, collection.request)
        todo = remaining(collection)
        logger.info(
            "run %s shard %d/%d: %d planned, %d to run (%d already stored)",
            plan.run_key,
            shard.index + 1,
            shard.count,
            len(plan.episodes),
            len(todo),
            len(plan.episodes) - len(todo),
        )
        status = "failed"
        try:
            for i in range(0, len(todo), CHUNK):
                await run_episode_batch(collection, todo[i : i + CHUNK])
            status = "completed"
        finally:
            if close:
                flow_run_id = str(flow_run.id) if flow_run.id else None
                finish_run(collection, status=status, flow_run_id=flow_run_id)
        return collection_result(
            collection,
            executed=len(collection.written.inserted),
            steps=collection.written.steps,
            started=started,
        )
    finally:
        await collection.aclose()


def run_key_for(request: CollectRequest) -> str:
    """The request's key; else one per night for a scheduled run, a fresh one otherwise."""
    if request.run_key:
        return request.run_key
    scheduled = flow_run.scheduled_start_time
    if deployment.id and scheduled is not None:
        return nightly_run_key(request, scheduled)
    return fresh_run_key(request)


async def _publish(result: CollectResult, settings: Settings) -> None:
    from storage.db import make_engine

    engine = make_engine(settings.database)
    try:
        summary = summarize_run(engine, result.run_id)
    finally:
        engine.dispose()
    key = "collect-" + "".join(c if c.isalnum() else "-" for c in result.run_key.lower())[:60]
    await acreate_markdown_artifact(
        markdown=summary_markdown(result.run_key, summary),
        key=key,
        description="Collection summary",
    )
    await acreate_table_artifact(
        table=summary_table(summary) or [{"template": "-", "success_rate": 0.0}],
        key=key + "-templates",
        description="Success rate per template",
    )


@flow(name="collect-episodes", log_prints=True, persist_result=True)
async def collect_episodes(
    request: CollectRequest,
    shards: int = 1,
    shard_deployment: str | None = None,
    gate: bool = False,
    gate_trigger: TriggerMode = "deployment",
) -> CollectFlowResult:
    """Collect `request.tasks` instances × `request.rollouts` of every template of the suite.

    With `gate`, the `qc-gate` flow runs on the result as a subflow (the nightly chain);
    `gate_trigger` is its trigger mode.

    With `shards > 1` and `shard_deployment` (e.g. `collect-shard/shard`), the run is split
    into shard flow runs on that deployment's work pool and this flow waits for all of
    them; the shards write to the shared database and object store, and the totals are
    read back from SQL (no shard's result file is needed).
    """
    settings = load_settings()
    request = request.keyed(run_key_for(request))
    if shards > 1 and shard_deployment:
        result = await fan_out(request, settings, shards=shards, deployment=shard_deployment)
    else:
        result = await collect_here(request, settings, shard=Shard(), close=True)
    await _publish(result, settings)
    qc = await qc_gate(run=result.run_key, trigger=gate_trigger) if gate else None
    return CollectFlowResult(**result.model_dump(), qc=qc)


async def fan_out(
    request: CollectRequest, settings: Settings, *, shards: int, deployment: str
) -> CollectResult:
    """Run the request as `shards` flow runs of `deployment` and wait for them all."""
    from prefect.deployments.flow_runs import arun_deployment

    started = time.monotonic()
    plan = plan_collection(request, settings.suites)
    collection = open_collection(plan, settings)
    try:
        run_id = start_run(collection.engine, collection.request)
        episodes_before, steps_before = run_totals(collection.engine, run_id)
        runs = await asyncio.gather(
            *(
                arun_deployment(
                    deployment,
                    parameters={
                        "request": request.model_dump(mode="json"),
                        "shard_index": i,
                        "shard_count": shards,
                    },
                    timeout=None,
                )
                for i in range(shards)
            )
        )
        failed = [r for r in runs if not (r.state and r.state.is_completed())]
        finish_run(collection, status="failed" if failed else "completed")
        if failed:
            raise CollectError(
                f"{len(failed)} of {shards} shard(s) of run {request.run_key} did not complete: "
                f"{[str(r.state) for r in failed]}; re-run the key to finish it"
            )
        episodes_after, steps_after = run_totals(collection.engine, run_id)
        return collection_result(
            collection,
            executed=episodes_after - episodes_before,
            steps=steps_after - steps_before,
            started=started,
        )
    finally:
        await collection.aclose()
