"""The collection lifecycle, one path for the CLI, the flows, the demo and the benchmarks.

    request = CollectRequest(...)                      # validated once, where it is built
    plan = plan_collection(request, settings.suites)   # suite, templates, faults, episode ids
    collection = open_collection(plan, settings)        # policy, engine, store: built once
    run_id = start_run(engine, request)                 # the collection_run row
    todo = remaining(collection)                        # resume: what is not stored yet
    await run_episodes(collection, todo)                # sandboxes, rewards, persisted in batches
    finish_run(collection, status="completed")
    result = collection_result(collection, ...)          # counts from SQL

`collect` chains them; the `collect-episodes` flow calls the same steps with a Prefect task
around each batch. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine

from agent.errors import PolicySpecError
from agent.loop import run_episode
from agent.outage import EndpointOutage
from agent.policies import make_policy
from agent.policies.base import Policy
from agent.trajectory import Trajectory, success_rate
from collection.errors import CollectError
from collection.outbox import Outbox
from collection.plan import Plan, PlannedEpisode, Shard, plan_collection
from collection.request import CollectRequest, CollectResult
from config.settings import Settings
from models import run_id_for
from sandbox import pooled_opener
from scoring.rewards import apply_rewards
from storage.episodes import persist_episodes
from storage.ingest import IngestReport
from storage.migrate import ensure_current
from storage.objects import ObjectStore
from storage.runs import close_run, open_run, remaining_episodes, run_counts, run_totals

logger = logging.getLogger(__name__)


def make_run_policy(spec: str, settings: Settings) -> Policy:
    """The policy a run uses (one instance shared by all its episodes).

    Raises:
        CollectError: the spec is malformed or names an unknown policy.
    """
    try:
        return make_policy(spec, settings=settings.policy)
    except PolicySpecError as e:
        raise CollectError(f"--policy: {e}", setting="--policy") from e


@dataclass
class Collection:
    """A plan with what runs it, each built once: the policy, the engine, the object store
    and the settings. Close it with `aclose` (the policy may hold a model or a client)."""

    plan: Plan
    settings: Settings
    policy: Policy
    engine: Engine
    store: ObjectStore
    owns_engine: bool = True
    """Dispose the engine on close (False when the caller passed its own)."""
    written: IngestReport = field(default_factory=IngestReport)
    """What this process has persisted so far."""
    outage: EndpointOutage = field(default_factory=lambda: EndpointOutage(limit=0))
    """The early-stop rule for a model endpoint that is down (`agent.outage`)."""

    @property
    def request(self) -> CollectRequest:
        return self.plan.request

    @property
    def run_id(self) -> uuid.UUID:
        return run_id_for(self.plan.run_key)

    async def aclose(self) -> None:
        await self.policy.aclose()
        if self.owns_engine:
            self.engine.dispose()


def open_collection(
    plan: Plan,
    settings: Settings,
    *,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
) -> Collection:
    """Build what runs `plan` and check it can write: the schema is current and the object
    store reachable, before any episode runs.

    Raises:
        CollectError: the policy spec is invalid.
        StorageError: the database or object store cannot be used (names the setting).
    """
    from storage.db import make_engine
    from storage.objects import make_object_store

    policy = make_run_policy(plan.request.policy, settings)
    owns = engine is None
    engine = engine if engine is not None else make_engine(settings.database)
    try:
        ensure_current(engine)
        store = store if store is not None else make_object_store(settings.objects)
        store.check()
    except BaseException:
        if owns:
            engine.dispose()
        raise
    return Collection(
        plan=plan,
        settings=settings,
        policy=policy,
        engine=engine,
        store=store,
        owns_engine=owns,
        outage=EndpointOutage(limit=settings.policy.outage_episodes),
    )


def start_run(engine: Engine, request: CollectRequest) -> uuid.UUID:
    """Create (or resume) the `collection_run` row of `request` (which carries its key)."""
    if request.run_key is None:
        raise CollectError("the request has no run key", setting="--run-key")
    faults = request.fault_profile
    return open_run(
        engine,
        run_key=request.run_key,
        suite=request.suite,
        policy=request.policy,
        parameters=request.run_parameters(),
        sandbox_spec=request.sandbox_spec.model_dump(mode="json"),
        fault_profile=faults.model_dump(mode="json") if faults else {},
    )


def finish_run(collection: Collection, *, status: str, flow_run_id: str | None = None) -> None:
    """Mark the run `completed`, `failed` or `interrupted`."""
    close_run(collection.engine, collection.run_id, status=status, flow_run_id=flow_run_id)


def remaining(collection: Collection) -> list[PlannedEpisode]:
    """This shard's planned episodes not stored yet (half-written ones are purged to rerun)."""
    episodes = collection.plan.episodes
    todo = remaining_episodes(collection.engine, [p.episode_id for p in episodes])
    return [p for p in episodes if p.episode_id in todo]


@dataclass(frozen=True)
class PersistedGroup:
    """One group of finished episodes just persisted (what `on_persisted` receives)."""

    written: IngestReport
    """What the group's transaction wrote."""
    by_status: dict[str, int]
    """The group's episodes by status."""

    @property
    def episodes(self) -> int:
        """Episodes in the group."""
        return sum(self.by_status.values())


FLUSH_INTERVAL_S = 5.0
"""Longest a finished episode waits in memory before it is persisted, seconds."""


def outbox_capacity(request: CollectRequest) -> int:
    """Finished episodes that may wait for storage at once: two groups, and never fewer
    than the episodes running (so a slow write does not stall every worker at once)."""
    return max(2 * request.batch_size, request.concurrency)


async def run_episodes(
    collection: Collection,
    episodes: Sequence[PlannedEpisode],
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_persisted: Callable[[PersistedGroup], Awaitable[None] | None] | None = None,
    flush_interval_s: float = FLUSH_INTERVAL_S,
) -> IngestReport:
    """Run `episodes` as one stream, at most `concurrency` at once (a finished episode frees
    its slot for the next: no barrier between groups), and persist finished episodes in
    groups of `batch_size` — or fewer once the oldest has waited `flush_interval_s` —
    objects first, then one transaction of rows, with immediate rewards and discounted
    returns computed on the way. `on_persisted` gets each group after it is written
    (progress; it may be a coroutine function).

    Workers hand finished episodes to an `Outbox` and go on; one persister task writes
    the groups, so a write (or a slow `on_persisted`) never holds up the sandboxes. At
    most `outbox_capacity(request)` finished episodes wait for storage: when storage is
    slower than the sandboxes, workers wait for room instead of memory growing.

    A crash (SIGKILL) loses at most the episodes in flight, waiting in the outbox and
    being written; when the run is cancelled (Ctrl-C, the UI) or an episode or a write
    raises, every finished episode is persisted (the group being written completes)
    before the error propagates."""
    request = collection.request
    settings = collection.settings
    report = IngestReport()
    outbox: Outbox[Trajectory] = Outbox(
        batch_size=request.batch_size,
        capacity=outbox_capacity(request),
        flush_interval_s=flush_interval_s,
    )
    pending = iter(episodes)
    writing: asyncio.Task[None] | None = None

    async def write(batch: list[Trajectory]) -> None:
        written = await asyncio.to_thread(
            persist_episodes, collection.engine, collection.store, batch
        )
        logger.debug(
            "run %s: %d episode(s), %d step(s) persisted (%d already stored)",
            collection.plan.run_key,
            len(written.inserted),
            written.steps,
            len(written.skipped_existing),
        )
        for target in (report, collection.written):
            target.inserted.extend(written.inserted)
            target.skipped_existing.extend(written.skipped_existing)
            target.steps += written.steps
        if on_persisted is not None:
            group = PersistedGroup(
                written=written, by_status=dict(Counter(t.status.value for t in batch))
            )
            notified = on_persisted(group)
            if inspect.isawaitable(notified):
                await notified

    async def persist(batch: list[Trajectory]) -> None:
        nonlocal writing
        # Shielded: a cancellation while a group is written lets the write (and its
        # accounting) finish; the cleanup below waits for it.
        task = writing = asyncio.ensure_future(write(batch))
        try:
            await asyncio.shield(task)
        finally:
            if task.done():
                writing = None

    async def one(p: PlannedEpisode) -> None:
        trajectory = await run_episode(
            p.task,
            collection.policy,
            spec=request.sandbox_spec,
            run_key=collection.plan.run_key,
            settings=settings.loop,
            rollout_index=p.rollout_index,
            faults=collection.plan.faults,
            fault_seed=fault_seed(p.episode_id),
            open_sandbox=pool.open_sandbox,
        )
        trajectory.difficulty = p.task.difficulty
        # Step rewards and discounted returns are stored with the rows (seed 000 §4.3).
        trajectory = apply_rewards(trajectory, settings.rewards)
        if collection.outage.record(trajectory.status, trajectory.failure_reason):
            logger.warning(collection.outage.message(collection.plan.run_key))
        if on_episode is not None:
            on_episode(trajectory)
        await outbox.put(trajectory)

    async def worker() -> None:
        for p in pending:  # one shared iterator: each worker takes the next planned episode
            if collection.outage.tripped:
                return  # the endpoint is down: the rest stays unstored for the re-run
            await one(p)
            # A cancellation swallowed below (a library that turns it into a result) must
            # not start the next episode: a stopped run stops.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

    async def persister() -> None:
        while batch := await outbox.next_group():
            await persist(batch)

    try:
        # Jails come from a warm pool: an episode's cold start overlaps other episodes' work.
        async with (
            pooled_opener(
                request.sandbox_spec,
                concurrency=request.concurrency,
                settings=settings.sandbox,
                episodes=len(episodes),
            ) as pool,
            asyncio.TaskGroup() as group,
        ):
            storing = group.create_task(persister())
            workers = [
                group.create_task(worker()) for _ in range(min(request.concurrency, len(episodes)))
            ]
            if workers:
                await asyncio.wait(workers)
            outbox.close()
            await storing
    except BaseExceptionGroup as failed:
        # The first real error, as a plain gather would have raised it (the CLI maps types).
        raise next(
            (e for e in failed.exceptions if not isinstance(e, asyncio.CancelledError)),
            failed.exceptions[0],
        ) from None
    except BaseException as stopped:
        if len(outbox):
            logger.warning(
                "run %s %s: persisting %d finished episode(s) before stopping",
                collection.plan.run_key,
                "cancelled" if isinstance(stopped, asyncio.CancelledError) else "interrupted",
                len(outbox),
            )
        raise
    finally:
        if writing is not None:
            await writing
        while batch := outbox.take():
            await write(batch)
    return report


def fault_seed(episode_id: uuid.UUID) -> int:
    """Per-episode fault seed derived from the deterministic id, so a replay injects the
    same faults."""
    return int.from_bytes(episode_id.bytes[:4], "big")


def collection_result(
    collection: Collection, *, executed: int, steps: int, started: float
) -> CollectResult:
    """The run's result: totals from SQL (every shard's and every earlier call's episodes
    and steps), and this call's work (`executed` episodes, `steps` written)."""
    counts = run_counts(collection.engine, collection.run_id)
    total = sum(counts.values())
    _, run_steps = run_totals(collection.engine, collection.run_id)
    return CollectResult(
        run_id=collection.run_id,
        run_key=collection.plan.run_key,
        planned=collection.plan.total,
        episodes=total,
        executed=executed,
        steps=run_steps,
        executed_steps=steps,
        by_status=counts,
        success_rate=success_rate(counts),
        duration_s=round(time.monotonic() - started, 3),
    )


async def collect(
    collection: Collection,
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    close_run_when_done: bool = True,
) -> CollectResult:
    """The whole lifecycle for an opened collection: start (or resume) the run, run what is
    missing, persist it, mark the run completed (failed on error)."""
    started = time.monotonic()
    start_run(collection.engine, collection.request)
    status = "failed"
    try:
        report = await run_episodes(collection, remaining(collection), on_episode=on_episode)
        status = "completed"
    finally:
        if close_run_when_done:
            finish_run(collection, status=status)
    return collection_result(
        collection, executed=len(report.inserted), steps=report.steps, started=started
    )


async def collect_in_process(
    request: CollectRequest,
    *,
    engine: Engine,
    store: ObjectStore,
    settings: Settings | None = None,
    shard: Shard | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    close: bool = True,
) -> CollectResult:
    """The collection without Prefect, in one call (tests, benchmarks, notebooks): plan,
    open, collect, close. `request` must carry its run key.

    Raises:
        CollectError: the request cannot run (suite, template, policy).
        StorageError: the database or object store cannot be used.
    """
    from config.settings import load_settings

    settings = settings if settings is not None else load_settings()
    plan = plan_collection(request, settings.suites, shard=shard)
    collection = open_collection(plan, settings, engine=engine, store=store)
    try:
        return await collect(collection, on_episode=on_episode, close_run_when_done=close)
    finally:
        await collection.aclose()
