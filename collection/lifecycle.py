"""One collection, opened once and closed once, whichever entry point runs it.

    with open_collection(request, settings, preflight=True) as collection:  # the CLI
        ...
    async with open_collection(request, settings) as collection:  # flows, in-process
        result = await collection.run(work)  # start, what remains, work, end, totals

`Collection.run` is the one run sequence every entry point goes through (collection,
evaluation, RL rollouts, environment sessions): the `collection_run` row (`running`,
or resumed), what is not stored yet, the caller's `work` on it (`collection.runner`'s
stream of episodes, or a sharded run's wait for its shards), how the run ended (the
one writer of the run's status, also when the work failed or was cancelled), and the
totals. `RunStages` lets the collect flow wrap each stage in a Prefect task.

Entering plans the request (suite, templates, faults, episode ids; or the caller's own
tasks, `tasks_planner`), builds the policy (unless the caller lends one: an evaluated
checkpoint, the model being trained), the engine and the object store (schema current, store reachable), runs the preflight
checks when asked (`collection.preflight`), and takes the run key's lock
(`storage.run_lock`; a shard takes its shard's lock), in that order: nothing is written
until `run` starts. Leaving releases the lock, closes the policy it made and disposes the
engine it made.

A command that opened a collection lends it to the flow it runs in the same process
(`Collection.lend`): the flow's `open_collection` of the same request returns that
collection as it is (no second plan, no second open, the lock held throughout), and its
exit leaves it to the lender. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, TypeVar

from pydantic import SecretStr
from sqlalchemy import Engine

from agent.errors import PolicySpecError
from agent.outage import EndpointOutage
from agent.policies import make_policy
from agent.policies.base import Policy
from agent.trajectory import success_rate
from collection.errors import CollectError, RequestError
from collection.plan import Plan, PlannedEpisode, Shard, plan_collection, plan_tasks
from collection.request import CollectRequest, CollectResult
from collection.stored_policy import STORED_POLICY_PREFIXES, stored_policy
from config.settings import Settings
from core.errors import EpiflowError
from models import run_id_for
from storage.ingest import IngestReport
from storage.objects import ObjectStore
from storage.run_lock import RunKeyLock, acquire_run_key, shard_lock_name
from storage.run_reads import RerunNeeded, RunSummary, rerun_needed, run_counts, run_totals
from storage.run_reads import summarize_run as read_summary
from storage.runs import close_run, open_run, remaining_episodes
from storage.settings import DatabaseSettings
from tasks.types import TaskInstance

T = TypeVar("T")

RunEnding = Literal["completed", "failed", "interrupted"]
"""How a collection run ends (`collection_run.status` once it is no longer `running`)."""

Planner = Callable[[CollectRequest, Settings, Shard | None], Plan]
"""What plans a request (`plan_request`; the flows pass their `plan-collection` task)."""


def plan_request(request: CollectRequest, settings: Settings, shard: Shard | None) -> Plan:
    """The default `Planner`: `collection.plan.plan_collection` with the suites' settings."""
    return plan_collection(request, settings.suites, sandbox=settings.sandbox, shard=shard)


def tasks_planner(tasks: Sequence[TaskInstance]) -> Planner:
    """A `Planner` over the caller's own task instances (evaluation's held-out tasks, an
    RL batch's prompts) instead of the suite's: each × the request's rollouts."""
    chosen = list(tasks)

    def plan(request: CollectRequest, settings: Settings, shard: Shard | None) -> Plan:
        return plan_tasks(request, chosen, shard=shard)

    return plan


def make_run_policy(spec: str, settings: Settings) -> Policy:
    """The policy a run uses (one instance shared by all its episodes).

    Raises:
        RequestError: the spec is malformed or names an unknown policy.
    """
    try:
        return make_policy(spec, settings=settings.policy)
    except PolicySpecError as e:
        raise RequestError(f"--policy: {e}", setting="--policy") from e


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


def run_ending(error: BaseException | None) -> RunEnding:
    """How a run that stopped with `error` ended: `completed` without one; `interrupted`
    when it was cancelled or interrupted (a signal, Ctrl-C, the UI; also an error raised
    because of a cancellation, like the CLI's `Interrupted`, an error that says it is a
    stop (`EpiflowError.stopped`: training asked to stop), or any error while the current
    task is being cancelled); `failed` otherwise."""
    if error is None:
        return "completed"
    stops = (asyncio.CancelledError, KeyboardInterrupt)
    if isinstance(error, stops) or isinstance(error.__cause__, stops):
        return "interrupted"
    if isinstance(error, EpiflowError) and error.stopped:
        return "interrupted"
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        task = None
    return "interrupted" if task is not None and task.cancelling() else "failed"


@dataclass(frozen=True)
class Executed:
    """What a run's work did in this process (a sharded run's parent: its shards)."""

    episodes: int = 0
    """Episodes run and stored now."""
    steps: int = 0
    """Their steps."""


Work = Callable[["Collection", list[PlannedEpisode]], Awaitable[Executed]]
"""What a run does with its remaining episodes (`collection.runner.stream_work`, or the
collect flow's wait for its shards), given the open collection."""


class RunStages:
    """How `Collection.run` calls each stage; by default, as it is. The collect flow
    subclasses it to run each stage as a Prefect task (named for the UI) and to map
    Prefect's stop signal to `interrupted`. Each method gets the stage as a coroutine
    function and must await it exactly once."""

    async def start(
        self, collection: Collection, stage: Callable[[], Awaitable[uuid.UUID]]
    ) -> uuid.UUID:
        """The run row (`running`, or resumed)."""
        return await stage()

    async def work(
        self, collection: Collection, stage: Callable[[], Awaitable[Executed]]
    ) -> Executed:
        """The work on the remaining episodes."""
        return await stage()

    async def finish(
        self, collection: Collection, stage: Callable[[], Awaitable[CollectResult]]
    ) -> CollectResult:
        """How the run ended, and its totals."""
        return await stage()

    def ending(self, error: BaseException) -> RunEnding:
        """How a run whose work raised `error` ended (`run_ending`)."""
        return run_ending(error)


@dataclass(frozen=True)
class CollectionOutcome:
    """What a command is handed when its collection ends, read before it closes."""

    run_key: str
    run_id: uuid.UUID
    planned: int
    """Episodes of the whole run's plan."""
    stored: int
    """Episodes of the run stored now."""
    ended: RunEnding | None
    """How the run ended, when that is recorded yet."""
    flow_run_id: str | None
    """The Prefect flow run that ran it, when one did."""
    rerun: dict[str, RerunNeeded]
    """Episodes a re-run of the key would redo (infrastructure failures), by status."""
    result: CollectResult | None
    """The collection's result; None when it did not finish (interrupted)."""


_lent: contextvars.ContextVar[Collection | None] = contextvars.ContextVar(
    "epiflow_lent_collection", default=None
)


@dataclass
class Collection:
    """A plan with what runs it, each built once: the policy, the engine, the object
    store, the run key's lock and the settings; and what this process did with the run
    (started, ended, written)."""

    plan: Plan
    settings: Settings
    policy: Policy
    engine: Engine
    store: ObjectStore
    shard: Shard | None = None
    """The shard this process collects; None for the whole run (which owns its status)."""
    lock: RunKeyLock | None = None
    """The run key's (or the shard's) lock, held until the collection closes."""
    written: IngestReport = field(default_factory=IngestReport)
    """What this process has persisted so far."""
    started: bool = False
    """Whether this process wrote the run row (`start`)."""
    ended: RunEnding | None = None
    """How the run ended, once `end` recorded it."""
    flow_run_id: str | None = None
    """The Prefect flow run that ran it (given to `end`)."""
    outage: EndpointOutage = field(default_factory=lambda: EndpointOutage(limit=0))
    """The early-stop rule for a model endpoint that is down (`agent.outage`): the runner
    records each finished episode and starts no more once it trips."""
    _ending: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Serialises the run's ending: the run path and an abandoning command (another
    thread) never both write it; the first ending recorded stands."""

    @property
    def request(self) -> CollectRequest:
        return self.plan.request

    @property
    def run_key(self) -> str:
        return self.plan.run_key

    @property
    def run_id(self) -> uuid.UUID:
        return run_id_for(self.plan.run_key)

    @property
    def owns_run(self) -> bool:
        """Whether this collection records the run's status (a shard's parent does)."""
        return self.shard is None

    # -------------------------------------------------------------------- the run

    async def run(self, work: Work, *, stages: RunStages | None = None) -> CollectResult:
        """The run, start to end: the run row (`running`, or resumed), what is not stored
        yet, `work` on it (which returns what it executed), how the run ended, and the
        totals (from SQL: every shard's and every earlier attempt's episodes count).

        The ending is recorded also when `work` fails (`failed`) or is cancelled or
        interrupted (`interrupted`, `run_ending`), shielded from the cancellation; then
        the error propagates. `stages` wraps each stage (the collect flow's Prefect
        tasks); by default each runs as it is."""
        stages = stages if stages is not None else RunStages()
        started = time.monotonic()
        executed = Executed()
        ending: RunEnding = "failed"
        try:
            await stages.start(self, self._start)
            todo = await asyncio.to_thread(self.remaining)
            executed = await stages.work(self, lambda: work(self, todo))
            ending = "completed"
        except BaseException as e:
            ending = stages.ending(e)
            raise
        finally:
            # Also on failure or cancellation: no run stays `running` once its work ended.
            result = await asyncio.shield(
                stages.finish(self, lambda: self._finish(ending, executed, started))
            )
        return result

    async def _start(self) -> uuid.UUID:
        run_id = await asyncio.to_thread(start_run, self.engine, self.request)
        self.started = True
        return run_id

    async def _finish(self, ending: RunEnding, executed: Executed, started: float) -> CollectResult:
        await asyncio.to_thread(self._end, ending)
        return await asyncio.to_thread(
            self.result, executed=executed.episodes, steps=executed.steps, started=started
        )

    def abandon(self) -> None:
        """Record the run `interrupted` now, from any thread: the command is leaving
        without waiting for its run to finish (a second signal, or a stop past its
        timeout). The run's own ending, should it still come, does not overwrite it."""
        self._end("interrupted")

    def _end(self, status: RunEnding) -> None:
        """Record how the run ended: the one writer of `collection_run.status` on the
        collection path (`run`, or `abandon`), once. A shard records nothing in SQL (its
        parent ends the run)."""
        with self._ending:
            if self.ended is not None:
                return
            if self.owns_run:
                close_run(self.engine, self.run_id, status=status, flow_run_id=self.flow_run_id)
            self.ended = status

    def remaining(self) -> list[PlannedEpisode]:
        """This shard's planned episodes not stored yet (spoiled ones are purged to rerun)."""
        episodes = self.plan.episodes
        todo = remaining_episodes(self.engine, [p.episode_id for p in episodes])
        return [p for p in episodes if p.episode_id in todo]

    # --------------------------------------------------------------------- reads

    def stored_episodes(self) -> int:
        """Episodes of the run stored so far, by any process (progress)."""
        return run_totals(self.engine, self.run_id)[0]

    def stored_totals(self) -> tuple[int, int]:
        """(episodes, steps) of the run stored so far, by any process."""
        return run_totals(self.engine, self.run_id)

    def summary(self) -> RunSummary:
        """The run's summary from its rows (`storage.run_reads.summarize_run`)."""
        return read_summary(self.engine, self.run_id)

    def result(self, *, executed: int, steps: int, started: float) -> CollectResult:
        """The run's result: totals from SQL (every shard's and every earlier call's
        episodes and steps), this call's work (`executed` episodes, `steps` written),
        and the time since `started` (`time.monotonic()`)."""
        counts = run_counts(self.engine, self.run_id)
        total = sum(counts.values())
        _, stored_steps = run_totals(self.engine, self.run_id)
        return CollectResult(
            run_id=self.run_id,
            run_key=self.run_key,
            planned=self.plan.total,
            episodes=total,
            executed=executed,
            steps=stored_steps,
            executed_steps=steps,
            by_status=counts,
            success_rate=success_rate(counts),
            duration_s=round(time.monotonic() - started, 3),
        )

    def outcome(self, result: CollectResult | None = None) -> CollectionOutcome:
        """What the command that opened this collection reports (read now)."""
        return CollectionOutcome(
            run_key=self.run_key,
            run_id=self.run_id,
            planned=self.plan.total,
            stored=self.stored_episodes(),
            ended=self.ended,
            flow_run_id=self.flow_run_id,
            rerun=rerun_needed(self.engine, self.run_id),
            result=result,
        )

    # ------------------------------------------------------------------- lending

    async def lend(self, work: Awaitable[T]) -> T:
        """Await `work` (a flow run) with this collection lent to it: its
        `open_collection` of the same request gets this one."""
        token = _lent.set(self)
        try:
            return await work
        finally:
            _lent.reset(token)

    def _matches(self, request: CollectRequest, shard: Shard | None) -> bool:
        return self.request == request and self.shard == shard


class CollectionContext:
    """`open_collection`'s context manager: `async with` (the blocking work runs in a
    thread), or `with` outside an event loop (the CLI), which runs the same steps in one."""

    def __init__(
        self,
        request: CollectRequest,
        settings: Settings,
        *,
        shard: Shard | None,
        preflight: bool,
        engine: Engine | None,
        store: ObjectStore | None,
        planner: Planner,
        policy: Policy | None,
    ) -> None:
        self._request = request
        self._settings = settings
        self._shard = shard
        self._preflight = preflight
        self._engine = engine
        self._store = store
        self._planner = planner
        self._policy = policy
        self._scratch = contextlib.ExitStack()
        """What the collection's stored policy lives in (its checkpoint's directory)."""
        self._collection: Collection | None = None
        self._borrowed = False

    # ----------------------------------------------------------------- opening

    def _lent_here(self) -> Collection | None:
        lent = _lent.get()
        return lent if lent is not None and lent._matches(self._request, self._shard) else None

    def _build(self, plan: Plan) -> Collection:
        """Policy, engine, object store (checked); the caller checks and locks."""
        from storage.db import make_engine
        from storage.migrate import ensure_current
        from storage.objects import make_object_store

        settings = self._settings
        spec = plan.request.policy
        policy = None
        if self._policy is None and not spec.startswith(STORED_POLICY_PREFIXES):
            policy = make_run_policy(spec, settings)
        engine = self._engine if self._engine is not None else make_engine(settings.database)
        try:
            ensure_current(engine)
            store = self._store if self._store is not None else make_object_store(settings.objects)
            store.check()
            policy = (
                self._policy
                or policy
                or stored_policy(spec, settings.policy, engine, store, self._scratch)
            )
        except BaseException:
            if self._engine is None:
                engine.dispose()
            self._scratch.close()
            raise
        return Collection(
            plan=plan,
            settings=settings,
            policy=policy,
            engine=engine,
            store=store,
            shard=self._shard,
            outage=EndpointOutage(limit=settings.policy.outage_episodes),
        )

    def _lock(self, collection: Collection) -> None:
        """Take the run key's lock (a shard's own), where the run's rows are."""
        name = collection.run_key
        if self._shard is not None:
            name = shard_lock_name(name, self._shard.index, self._shard.count)
        collection.lock = acquire_run_key(_lock_settings(self._settings, self._engine), name)

    def __enter__(self) -> Collection:
        return asyncio.run(self.__aenter__())

    async def __aenter__(self) -> Collection:
        if (lent := self._lent_here()) is not None:
            self._borrowed = True
            return lent
        from collection.preflight import preflight_checks

        plan = self._planner(self._request, self._settings, self._shard)
        collection = await asyncio.to_thread(self._build, plan)
        try:
            if self._preflight:
                await preflight_checks(collection)
            await asyncio.to_thread(self._lock, collection)
        except BaseException:
            await asyncio.to_thread(self._release, collection)
            await self._close_policy(collection)
            raise
        self._collection = collection
        return collection

    # ----------------------------------------------------------------- closing

    async def _close_policy(self, collection: Collection) -> None:
        """Close the policy this context made (a lent one is its owner's to close)."""
        if self._policy is None:
            await collection.policy.aclose()

    def _release(self, collection: Collection) -> None:
        """Free the lock and the engine this context made."""
        try:
            if collection.lock is not None:
                collection.lock.release()
        finally:
            try:
                if self._engine is None:
                    collection.engine.dispose()
            finally:
                self._scratch.close()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        asyncio.run(self.__aexit__(kind, error, traceback))

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        collection = self._collection
        if self._borrowed or collection is None:
            return
        try:
            # Shielded: a cancelled run still frees its lock (`run` recorded its ending).
            await asyncio.shield(asyncio.to_thread(self._release, collection))
        finally:
            await self._close_policy(collection)


def open_collection(
    request: CollectRequest,
    settings: Settings,
    *,
    shard: Shard | None = None,
    preflight: bool = False,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    planner: Planner = plan_request,
    policy: Policy | None = None,
) -> CollectionContext:
    """The collection of `request` (which must carry its run key), for `with` or `async
    with`: planned, opened, checked (`preflight`), locked; closed once on exit.

    `shard` is the part this process collects (None: the whole run, which records the
    run's status). `engine` and `store` are the caller's to keep (not disposed); the lock
    is then taken in `engine`'s database. `policy` is the caller's too (built and closed
    by it; `request.policy` is then only its label). `planner` plans the request (the
    suite's instances; `tasks_planner` for the caller's own). Within a collection's
    `lend`, the same request and shard return the lent collection, untouched by this
    context's exit.

    Raises:
        RequestError: the suite, a template or the policy spec is invalid.
        SandboxUnavailable: (`preflight`) no jail can start with these sandbox settings.
        StorageError: the database or object store cannot be used or written, or the run
            key (or shard) is being collected right now (`RunKeyBusy`).
    """
    return CollectionContext(
        request,
        settings,
        shard=shard,
        preflight=preflight,
        engine=engine,
        store=store,
        planner=planner,
        policy=policy,
    )


def _lock_settings(settings: Settings, engine: Engine | None) -> DatabaseSettings:
    """Where the lock lives: the settings' database, or the caller's engine's."""
    if engine is None:
        return settings.database
    url = SecretStr(engine.url.render_as_string(hide_password=False))
    return settings.database.model_copy(update={"url": url})
