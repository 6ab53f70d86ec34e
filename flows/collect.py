"""The `collect-episodes` flow: one collection run, on this machine or fanned out to shards.

The flow opens the collection once (`collection.lifecycle.open_collection`: plan, policy,
engine, object store, the run key's lock), or uses the one the command that started it
lent it (`epiflow collect`), and runs its stages as Prefect tasks, named for the UI:
`plan-collection` (suite, templates, episode ids; part of the open), `open-run` (the
`collection_run` row), `run-episodes` (the whole plan as one stream, asyncio concurrency
inside, never a task per step; finished episodes persisted in groups as they complete, a
progress artifact updated as groups are stored, at most every `PROGRESS_INTERVAL_S`, and
for the last one), `finish-run` (how the run ended, totals from SQL) and `publish-summary`
(two artifacts). With `gate`, the `qc-gate` flow follows as a
subflow.

A request may name its policy by model alias (`hf:alias/champion`: the collection runs the
checkpoint the alias points at when it opens, and labels its episodes with it). With
`alias_fallback`, an alias not set yet is no error: `champion-policy` collects with the
newest base model instead, else with the fallback spec, and logs which
(`training.champion.champion_policy`); the run key stays the alias's, so a night is one
key whoever collected it. The nightly champion deployment runs so (`flows.deployments`).

One run key, one collection at a time: the collection holds the key's lock
(`storage.run_lock`) while it is open, a shard its shard's lock, so a second run of a
key that is running fails at once with `RunKeyBusy`. The lock dies with its process, so
a crashed run never blocks the retry that resumes it.

A flow run is named after its run key. Results are not persisted by Prefect (they would
land on the worker's local disk, out of reach of every other machine): a run's totals
live in SQL and are read from there, by the parent of a sharded run too.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Cancelled

from collection.errors import CollectError
from collection.lifecycle import (
    Collection,
    Executed,
    RunEnding,
    RunStages,
    open_collection,
    plan_request,
    run_ending,
)
from collection.plan import Plan, PlannedEpisode, Shard
from collection.request import CollectRequest, CollectResult, fresh_run_key, nightly_run_key
from collection.runner import PersistedGroup, run_episodes
from config.settings import Settings, load_settings
from flows import artifact_key, link_objects, route_library_logs
from flows.qc import GateOptions, QcGateResult, qc_gate
from orchestration.automations import crash_detection_gap
from orchestration.retries import fail_once, retry_unless_deterministic
from reports.run_summary import summary_markdown, summary_table

PROGRESS_INTERVAL_S = 2.0
"""Shortest time between two updates of the progress artifact, seconds (the last group's
update is never skipped)."""

SHARD_ATTEMPTS = 3
"""Flow runs a shard gets before the sharded run fails: one that crashed (its worker died;
the zombie automation marks it Crashed) or failed is started again and resumes its share."""


class CollectFlowResult(CollectResult):
    """A collection's result, with the QC gate's when the flow ran it."""

    qc: QcGateResult | None = None
    """The gate's result (with `gate`), else None."""


def _progress_line(
    done: int, planned: int, earlier: int, by_status: Counter[str], started: float
) -> str:
    """`done / planned episodes (…)`; the counts add up to `done`: episodes stored before
    this attempt (`earlier`, a resumed run) apart from this attempt's, by status."""
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())) or "none yet"
    counts = f"{earlier} stored earlier; this attempt: {statuses}" if earlier else statuses
    return f"{done} / {planned} episodes ({counts}); {time.monotonic() - started:.0f} s elapsed"


@task(name="plan-collection", cache_policy=NONE, retries=0)
def plan_task(request: CollectRequest, settings: Settings, shard: Shard | None) -> Plan:
    """Resolve the request against its suite: task instances and episode ids (the
    collection's planner, so the UI shows the stage)."""
    plan = plan_request(request, settings, shard)
    shard = shard or Shard()
    get_run_logger().info(
        "run %s shard %d/%d: %d episodes planned (%d in the whole run)",
        plan.run_key,
        shard.index + 1,
        shard.count,
        len(plan.episodes),
        plan.total,
    )
    return plan


@task(name="open-run", cache_policy=NONE, retries=0)
async def open_run_task(
    collection: Collection, stage: Callable[[], Awaitable[uuid.UUID]]
) -> uuid.UUID:
    """Create or resume the run row (the collection is open: policy, database and object
    store checked, the run key's lock held)."""
    run_id = await stage()
    get_run_logger().info(
        "open-run: run %s (%s), policy %s, database and object store checked",
        collection.run_key,
        run_id,
        collection.request.policy,
    )
    return run_id


# Idempotent: episode ids are deterministic and `remaining` skips what is stored, so a
# retry runs only what the failed attempt did not persist.
@task(
    name="run-episodes",
    cache_policy=NONE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_unless_deterministic,
)
async def run_episodes_task(
    collection: Collection, todo: list[PlannedEpisode]
) -> Executed | State[Any]:
    """Run what is not stored yet (`todo`) as one stream; persist groups as they finish;
    keep a progress artifact (episodes done / planned, by status) current. Returns what
    it ran, or a Cancelled state when the run was cancelled."""
    logger = get_run_logger()
    started = time.monotonic()
    planned = len(collection.plan.episodes)
    done = earlier = planned - len(todo)
    if done:
        logger.info("%d of %d episodes already stored: skipped (resumed run)", done, planned)
    by_status: Counter[str] = Counter()
    progress = await acreate_progress_artifact(
        progress=100.0 * done / planned if planned else 100.0,
        key=artifact_key("collect-progress", collection.plan.run_key),
        description=_progress_line(done, planned, earlier, by_status, started),
    )

    shown = done  # episodes the artifact shows
    shown_at = time.monotonic()

    async def show_progress() -> None:
        nonlocal shown, shown_at
        shown, shown_at = done, time.monotonic()
        try:
            await aupdate_progress_artifact(
                progress,
                progress=100.0 * done / planned,
                description=_progress_line(done, planned, earlier, by_status, started),
            )
        except Exception as e:  # progress is for the eyes; the collection goes on
            logger.warning("progress artifact not updated: %r", e)

    async def on_persisted(group: PersistedGroup) -> None:
        nonlocal done
        done += group.episodes
        for status, count in group.by_status.items():
            by_status[status] += count
        # Each update costs the API server ~16 ms of CPU: at most one per interval.
        if done == planned or time.monotonic() - shown_at >= PROGRESS_INTERVAL_S:
            await show_progress()

    try:
        try:
            report = await run_episodes(collection, todo, on_persisted=on_persisted)
        finally:
            if shown != done:  # the last groups came within the interval (or a stop)
                await asyncio.shield(show_progress())
    except asyncio.CancelledError:
        # A cancel (from the UI, or a stopping worker) is no crash: the finished episodes
        # are stored (`run_episodes` flushed them), the task run ends Cancelled, and the
        # caller carries the cancellation on (`collect_here`).
        logger.info("run-episodes: cancelled with %d of %d episodes stored", done, planned)
        return Cancelled(message=f"cancelled with {done} of {planned} episodes stored")
    logger.info(
        "run-episodes: %d episodes run, %d steps written in %.1f s; %s",
        len(report.inserted),
        report.steps,
        time.monotonic() - started,
        ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())) or "nothing to run",
    )
    return Executed(episodes=len(report.inserted), steps=report.steps)


def _flow_run_id() -> str | None:
    return str(flow_run.id) if flow_run.id else None


@task(
    name="finish-run",
    cache_policy=NONE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_deterministic,
)
async def finish_run_task(stage: Callable[[], Awaitable[CollectResult]]) -> CollectResult:
    """Record how the run ended (a shard: nothing; its parent does) and read its totals."""
    return await stage()


async def stream_here(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
    """This process's share of the run, as the `run-episodes` task (`Collection.run`'s
    work for a run collected here)."""
    ran = await run_episodes_task(collection, todo)
    _raise_if_cancelled()  # the task ended Cancelled: the flow run is being cancelled
    if isinstance(ran, Executed):
        return ran
    # Cancelled, while this flow run is not: what it stored before it stopped.
    return Executed(episodes=len(collection.written.inserted), steps=collection.written.steps)


class FlowStages(RunStages):
    """`Collection.run`'s stages as the flow's Prefect tasks: `open-run` and
    `finish-run` (the run-episodes stage is the work's own task, `run-episodes`, or the
    shards' flow runs); a worker's SIGTERM (Prefect's `TerminationSignal`) is a stop, as
    in the CLI; the flow run's id goes with the run's ending."""

    async def start(
        self, collection: Collection, stage: Callable[[], Awaitable[uuid.UUID]]
    ) -> uuid.UUID:
        return await open_run_task(collection, stage)

    async def finish(
        self, collection: Collection, stage: Callable[[], Awaitable[CollectResult]]
    ) -> CollectResult:
        collection.flow_run_id = _flow_run_id()
        result = await finish_run_task(stage)
        if collection.ended == "interrupted":
            get_run_logger().warning(resume_hint(result))
        return result

    def ending(self, error: BaseException) -> RunEnding:
        return "interrupted" if isinstance(error, TerminationSignal) else run_ending(error)


async def collect_here(collection: Collection) -> CollectResult:
    """Collect this process's share of an open collection (`Collection.run` with the
    flow's stages): the run row, what remains as one stream, how it ended (also when it
    failed or was cancelled), the totals."""
    result = await collection.run(stream_here, stages=FlowStages())
    get_run_logger().info(
        "run %s %s: %d / %d episodes stored, success rate %.2f",
        result.run_key,
        collection.ended or "ended",
        result.episodes,
        result.planned,
        result.success_rate,
    )
    return result


def _raise_if_cancelled() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def resume_hint(result: CollectResult) -> str:
    """The log line of an interrupted run: what is stored and how to resume it."""
    return (
        f"run {result.run_key} interrupted with {result.episodes} of {result.planned} "
        f"episodes stored. Resume: retry this flow run (it keeps run key {result.run_key}), "
        f"or start a run with request.run_key = {result.run_key}; only the missing episodes run"
    )


def run_key_for(request: CollectRequest) -> str:
    """The run key of this flow run (see `flow_run_key`); outside a flow run, a fresh key."""
    context = FlowRunContext.get()
    return flow_run_key(request, context.flow_run if context is not None else None)


def flow_run_key(request: CollectRequest, run: FlowRun | None) -> str:
    """The request's key; else, for a run the nightly schedule created, one per night (from
    its expected start time, which a retry or a crash recovery keeps); else the flow run's
    own (from its id, so a rescheduled run resumes it); without a flow run, a fresh key."""
    if request.run_key:
        return request.run_key
    if run is None:
        return fresh_run_key(request)
    if run.deployment_id and run.auto_scheduled and run.expected_start_time is not None:
        return nightly_run_key(request, run.expected_start_time)
    return fresh_run_key(request, run.id)


def _flow_run_name() -> str:
    """Flow runs are named after their run key (the nightly ones after their night)."""
    context = FlowRunContext.get()
    raw = (context.parameters or {}).get("request") if context is not None else None
    if raw is None:
        return "collect"
    request = raw if isinstance(raw, CollectRequest) else CollectRequest.model_validate(raw)
    return run_key_for(request)


async def close_killed_attempts(run: FlowRun | None) -> int:
    """Task runs that an earlier attempt of this flow run left Running or Pending (its
    process was killed) are set Crashed, so a finished flow run shows nothing running.
    Returns how many. Call before this attempt's first task."""
    if run is None or run.run_count <= 1:
        return 0
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    async with get_client() as client:
        stale = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(
                    type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
                )
            ),
        )
        for task_run in stale:
            await client.set_task_run_state(
                task_run.id,
                Crashed(
                    message="an earlier attempt of its flow run was killed; a later one resumes"
                ),
                force=True,
            )
    return len(stale)


def _check_attempts(run: FlowRun | None, retries: int) -> None:
    """Give up on a flow run started more often than its retries allow: a crash recovery
    puts the same flow run back to Scheduled, and a run that crashes every time must end
    Failed (which notifies) instead of going round for ever."""
    if run is None or run.run_count <= retries + 1:
        return
    raise CollectError(
        f"flow run {run.name} started {run.run_count} times ({retries} retries allowed; "
        "its earlier attempts crashed or failed): giving up. Fix the cause, then re-run "
        "its run key by hand",
        setting="retries",
    )


@task(name="publish-summary", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def publish_summary(collection: Collection) -> None:
    """The run's summary (markdown) and its success rate per template (table)."""
    summary = await asyncio.to_thread(collection.summary)
    key = artifact_key("collect", collection.run_key)
    await acreate_markdown_artifact(
        markdown=summary_markdown(collection.run_key, summary),
        key=key,
        description="Collection summary",
    )
    await acreate_table_artifact(
        table=summary_table(summary) or [{"template": "-", "success_rate": 0.0}],
        key=key + "-templates",
        description="Success rate per template",
    )
    from storage.episodes import run_prefix

    await link_objects(
        collection.store,
        run_prefix(collection.run_key),
        artifact=key + "-objects",
        text="Stored episodes (trajectories, outputs)",
        description=f"Objects of run {collection.run_key}: one folder per episode",
    )


@task(name="champion-policy", cache_policy=NONE, retries=1, retry_delay_seconds=2)
async def champion_policy_task(
    settings: Settings, request: CollectRequest, fallback: str
) -> CollectRequest:
    """The request with the policy it collects with tonight: its alias when set, else the
    base model or `fallback` (`training.champion.champion_policy`), with a log line."""
    from storage.db import make_engine
    from training.champion import champion_policy

    engine = make_engine(settings.database)
    try:
        chosen = await asyncio.to_thread(champion_policy, engine, request.policy, fallback=fallback)
    finally:
        engine.dispose()
    get_run_logger().info("champion-policy: %s", chosen.line)
    return CollectRequest.model_validate({**request.model_dump(), "policy": chosen.spec})


@flow(name="collect-episodes", flow_run_name=_flow_run_name, log_prints=False, persist_result=False)
async def collect_episodes(
    request: CollectRequest,
    shards: int = 1,
    shard_deployment: str | None = None,
    gate: bool = False,
    gate_options: GateOptions = GateOptions(),  # noqa: B008 - frozen, shown in the form
    alias_fallback: str | None = None,
) -> CollectFlowResult:
    """Collect `request.tasks` instances × `request.rollouts` of every template of the suite.

    Args:
        request: What to collect: suite, policy, sizes, faults, sandbox, run key.
        shards: Split the run into this many shard flow runs (needs `shard_deployment`).
        shard_deployment: Deployment that runs one shard, e.g. `collect-shard/shard`; the
            shards write to the shared database and object store, and the totals are read
            back from SQL.
        gate: Run the `qc-gate` flow on the result as a subflow (the nightly chain).
        gate_options: How the gate judges and when it trains (threshold, trigger, steps).
        alias_fallback: When `request.policy` names a model alias (`hf:alias/champion`)
            that is not set yet (the first night), collect with the newest base model,
            else with this policy spec (e.g. `scripted:noisy`); empty: an unset alias is
            the request's error.
    """
    route_library_logs()
    # A deterministic error (unknown suite, template or policy) fails this attempt once.
    async with fail_once():
        context = FlowRunContext.get()
        if context is not None and context.flow_run is not None:
            # The flow run's own policy wins (set when it was created); else the flow's.
            policy = context.flow_run.empirical_policy.retries
            flow_retries = context.flow.retries if context.flow is not None else 0
            _check_attempts(context.flow_run, policy if policy is not None else flow_retries or 0)
            if closed := await close_killed_attempts(context.flow_run):
                get_run_logger().info("%d task run(s) of a killed attempt set Crashed", closed)
        settings = load_settings()
        request = request.keyed(run_key_for(request))  # the alias's key, whoever collects
        if alias_fallback is not None:
            request = await champion_policy_task(settings, request, alias_fallback)
        async with open_collection(request, settings, planner=plan_task) as collection:
            if shards > 1 and shard_deployment:
                result = await fan_out(collection, shards=shards, deployment=shard_deployment)
            else:
                result = await collect_here(collection)
            await publish_summary(collection)
    qc = await qc_gate(run=result.run_key, **gate_options.flow_parameters()) if gate else None
    return CollectFlowResult(**result.model_dump(), qc=qc)


async def fan_out(collection: Collection, *, shards: int, deployment: str) -> CollectResult:
    """Run the collection as `shards` flow runs of `deployment` and wait for them all; a
    shard that crashed or failed runs again (`SHARD_ATTEMPTS`). The totals come from SQL,
    never from the shards' Prefect results, which stay on their workers. Without the zombie
    automation (`orchestration.automations.crash_detection_gap`) a lost worker's shard is never
    seen as crashed: the run warns at its start.

    Raises:
        CollectError: a shard did not complete in `SHARD_ATTEMPTS` flow runs.
    """
    request = collection.request
    if gap := await crash_detection_gap():
        get_run_logger().warning(
            "run %s: %s: a shard whose worker is lost would leave this run waiting; "
            "run `epiflow prefect setup` against this Prefect API",
            request.run_key,
            gap,
        )

    async def shards_work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        episodes_before, steps_before = await asyncio.to_thread(collection.stored_totals)
        runs = await asyncio.gather(
            *(_run_shard(request, i, shards, deployment) for i in range(shards))
        )
        failed = [r for r in runs if not (r.state and r.state.is_completed())]
        if failed:
            raise CollectError(
                f"{len(failed)} of {shards} shard(s) of run {collection.run_key} did not "
                f"complete in {SHARD_ATTEMPTS} flow runs each: "
                f"{[str(r.state) for r in failed]}; re-run the key to finish it"
            )
        episodes_after, steps_after = await asyncio.to_thread(collection.stored_totals)
        return Executed(episodes=episodes_after - episodes_before, steps=steps_after - steps_before)

    return await collection.run(shards_work, stages=_ShardedStages())


class _ShardedStages(FlowStages):
    """A sharded run's parent: the run row and its ending as plain calls (its shards'
    flow runs show the work)."""

    async def start(
        self, collection: Collection, stage: Callable[[], Awaitable[uuid.UUID]]
    ) -> uuid.UUID:
        return await stage()

    async def finish(
        self, collection: Collection, stage: Callable[[], Awaitable[CollectResult]]
    ) -> CollectResult:
        collection.flow_run_id = _flow_run_id()
        return await stage()


async def _run_shard(request: CollectRequest, index: int, count: int, deployment: str) -> FlowRun:
    """One shard as flow runs of `deployment`, until one completes or `SHARD_ATTEMPTS` ran.

    A retry resumes the shard: its episode ids are deterministic and stored ones are skipped.
    """
    from prefect.deployments.flow_runs import arun_deployment

    logger = get_run_logger()
    parameters = {
        "request": request.model_dump(mode="json"),
        "shard_index": index,
        "shard_count": count,
    }
    for attempt in range(1, SHARD_ATTEMPTS + 1):
        run = await arun_deployment(deployment, parameters=parameters, timeout=None)
        if run.state is not None and run.state.is_completed():
            return run
        logger.warning(
            "shard %d/%d of run %s: flow run %s ended %s (attempt %d of %d)%s",
            index + 1,
            count,
            request.run_key,
            run.name,
            run.state.name if run.state else "without a state",
            attempt,
            SHARD_ATTEMPTS,
            "; starting it again" if attempt < SHARD_ATTEMPTS else "",
        )
    return run


NIGHTLY_RETRIES = 2
"""Times a failed nightly run is tried again (the same flow run, so the same run key)."""
NIGHTLY_RETRY_DELAY_S = 600
"""Seconds between a failed nightly attempt and the next."""

nightly_collect_episodes = collect_episodes.with_options(
    retries=NIGHTLY_RETRIES, retry_delay_seconds=NIGHTLY_RETRY_DELAY_S
)
"""`collect-episodes` as the nightly deployment runs it: a failed attempt is retried
(`NIGHTLY_RETRIES`), and a crashed one is put back to Scheduled by the recovery automation
(`orchestration.automations`); every attempt resumes the night's run key. Attempts beyond the
retries end Failed (which notifies)."""
