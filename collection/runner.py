"""Running a collection: its episodes as one stream, persisted in groups.

    async with open_collection(request, settings) as collection:  # collection.lifecycle
        await collect(collection)    # Collection.run with this stream as its work

`run_episodes` is the engine every entry point shares (the CLI and the demo through the
`collect-episodes` flow, the `collect-shard` flow, `collect_in_process`, evaluation, the
benchmarks); `stream_work` makes it the work of `Collection.run` (the one run sequence),
and `collect` runs it so. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from agent.loop import run_episode
from agent.policies.base import Policy
from agent.trajectory import Trajectory
from collection.lifecycle import Collection, Executed, Work, open_collection
from collection.outbox import Outbox
from collection.plan import PlannedEpisode, Shard
from collection.request import CollectRequest, CollectResult
from config.settings import Settings
from sandbox import pooled_opener
from scoring.rewards import apply_rewards
from storage.episodes import persist_episodes
from storage.ingest import IngestReport, rows_for
from storage.objects import ObjectStore
from storage.rows import EpisodeRows

logger = logging.getLogger(__name__)


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
    episodes: Sequence[PlannedEpisode] | AsyncIterator[PlannedEpisode],
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_persisted: Callable[[PersistedGroup], Awaitable[None] | None] | None = None,
    flush_interval_s: float = FLUSH_INTERVAL_S,
    policy: Policy | None = None,
) -> IngestReport:
    """Run `episodes` as one stream, at most `concurrency` at once (a finished episode frees
    its slot for the next: no barrier between groups), and persist finished episodes in
    groups of `batch_size` — or fewer once the oldest has waited `flush_interval_s` —
    objects first, then one transaction of rows, with immediate rewards and discounted
    returns computed on the way. `on_persisted` gets each group after it is written
    (progress; it may be a coroutine function). `policy` acts in these episodes instead
    of the collection's (GRPO: the model as it is at this optimiser step).

    Workers hand finished episodes to an `Outbox` and go on; one persister task writes
    the groups, so a write (or a slow `on_persisted`) never holds up the sandboxes. At
    most `outbox_capacity(request)` finished episodes wait for storage: when storage is
    slower than the sandboxes, workers wait for room instead of memory growing.

    A crash (SIGKILL) loses at most the episodes in flight, waiting in the outbox and
    being written; when the run is cancelled (Ctrl-C, the UI) or an episode or a write
    raises, every finished episode is persisted (the group being written completes)
    before the error propagates.

    `episodes` may also be an async stream of planned episodes (environment sessions,
    planned as clients arrive): `concurrency` workers take the next one as it comes, and
    the run ends when the stream does."""
    request = collection.request
    settings = collection.settings
    acting = policy if policy is not None else collection.policy
    report = IngestReport()
    outbox: Outbox[Trajectory] = Outbox(
        batch_size=request.batch_size,
        capacity=outbox_capacity(request),
        flush_interval_s=flush_interval_s,
    )
    # A sequence's length bounds the jails and workers; a stream's is unknown.
    total = len(episodes) if isinstance(episodes, Sequence) else None
    source = episodes if isinstance(episodes, AsyncIterator) else _planned(episodes)
    taking = asyncio.Lock()  # one reader of the source at a time (an async generator's rule)

    async def take() -> PlannedEpisode | None:
        async with taking:
            return await anext(source, None)

    writing: asyncio.Task[None] | None = None
    # Rows built where each episode finishes, so the one persister only copies them.
    prepared: dict[uuid.UUID, EpisodeRows] = {}

    async def write(batch: list[Trajectory]) -> None:
        rows = {t.episode_id: prepared.pop(t.episode_id) for t in batch if t.episode_id in prepared}
        written = await asyncio.to_thread(
            persist_episodes, collection.engine, collection.store, batch, rows=rows
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
            acting,
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
        prepared[trajectory.episode_id] = rows_for(collection.engine, trajectory)
        await outbox.put(trajectory)

    async def worker() -> None:
        while (p := await take()) is not None:  # each worker takes the next planned episode
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
                episodes=total,
            ) as pool,
            asyncio.TaskGroup() as group,
        ):
            storing = group.create_task(persister())
            count = request.concurrency if total is None else min(request.concurrency, total)
            workers = [group.create_task(worker()) for _ in range(count)]
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


async def _planned(episodes: Sequence[PlannedEpisode]) -> AsyncIterator[PlannedEpisode]:
    for planned in episodes:
        yield planned


def fault_seed(episode_id: uuid.UUID) -> int:
    """Per-episode fault seed derived from the deterministic id, so a replay injects the
    same faults."""
    return int.from_bytes(episode_id.bytes[:4], "big")


def stream_work(
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_persisted: Callable[[PersistedGroup], Awaitable[None] | None] | None = None,
) -> Work:
    """`run_episodes` over the remaining episodes, as the work of `Collection.run`."""

    async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        report = await run_episodes(
            collection, todo, on_episode=on_episode, on_persisted=on_persisted
        )
        return Executed(episodes=len(report.inserted), steps=report.steps)

    return work


async def collect(
    collection: Collection,
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_persisted: Callable[[PersistedGroup], Awaitable[None] | None] | None = None,
) -> CollectResult:
    """The whole run for an opened collection (`Collection.run` with `stream_work`):
    start (or resume) the run, run what is missing, persist it, record how it ended
    (failed or interrupted on error), read the totals."""
    return await collection.run(stream_work(on_episode=on_episode, on_persisted=on_persisted))


async def collect_in_process(
    request: CollectRequest,
    *,
    engine: Engine,
    store: ObjectStore,
    settings: Settings | None = None,
    shard: Shard | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> CollectResult:
    """The collection without Prefect, in one call (tests, benchmarks, notebooks): open
    (plan, policy, the run key's lock in `engine`'s database), collect, close. `request`
    must carry its run key.

    Raises:
        CollectError: the request cannot run (suite, template, policy).
        StorageError: the database or object store cannot be used, or the run key is
            being collected right now (`RunKeyBusy`).
    """
    from config.settings import load_settings

    settings = settings if settings is not None else load_settings()
    async with open_collection(
        request, settings, shard=shard, engine=engine, store=store
    ) as collection:
        return await collect(collection, on_episode=on_episode)
