"""One collection, opened once and closed once, whichever entry point runs it.

    with open_collection(request, settings, preflight=True) as collection:  # the CLI
        ...
    async with open_collection(request, settings) as collection:  # flows, in-process
        collection.start()                 # the collection_run row (`running`)
        todo = collection.remaining()      # resume: what is not stored yet
        await run_episodes(collection, todo)
        collection.end("completed")        # the one writer of the run's status

Entering plans the request (suite, templates, faults, episode ids), builds the policy,
the engine and the object store (schema current, store reachable), runs the preflight
checks when asked (`collection.preflight`), and takes the run key's lock
(`storage.run_lock`; a shard takes its shard's lock), in that order: nothing is written
until `start`. Leaving records how the run ended when nothing did yet (`run_ending`),
releases the lock, closes the policy and disposes the engine it made.

A command that opened a collection lends it to the flow it runs in the same process
(`Collection.lend`): the flow's `open_collection` of the same request returns that
collection as it is (no second plan, no second open, the lock held throughout), and its
exit leaves it to the lender. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from collections.abc import Awaitable, Callable
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
from collection.plan import Plan, PlannedEpisode, Shard, plan_collection
from collection.request import CollectRequest, CollectResult
from config.settings import Settings
from models import run_id_for
from storage.ingest import IngestReport
from storage.objects import ObjectStore
from storage.run_lock import RunKeyLock, acquire_run_key, shard_lock_name
from storage.run_reads import RerunNeeded, RunSummary, rerun_needed, run_counts, run_totals
from storage.run_reads import summarize_run as read_summary
from storage.runs import close_run, open_run, remaining_episodes
from storage.settings import DatabaseSettings

T = TypeVar("T")

RunEnding = Literal["completed", "failed", "interrupted"]
"""How a collection run ends (`collection_run.status` once it is no longer `running`)."""

Planner = Callable[[CollectRequest, Settings, Shard | None], Plan]
"""What plans a request (`plan_request`; the flows pass their `plan-collection` task)."""


def plan_request(request: CollectRequest, settings: Settings, shard: Shard | None) -> Plan:
    """The default `Planner`: `collection.plan.plan_collection` with the suites' settings."""
    return plan_collection(request, settings.suites, shard=shard)


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
    because of a cancellation, like the CLI's `Interrupted`, or any error while the
    current task is being cancelled); `failed` otherwise."""
    if error is None:
        return "completed"
    stops = (asyncio.CancelledError, KeyboardInterrupt)
    if isinstance(error, stops) or isinstance(error.__cause__, stops):
        return "interrupted"
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        task = None
    return "interrupted" if task is not None and task.cancelling() else "failed"


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

    # -------------------------------------------------------------------- writes

    def start(self) -> uuid.UUID:
        """Create (or resume) the run row, status `running`."""
        run_id = start_run(self.engine, self.request)
        self.started = True
        return run_id

    def remaining(self) -> list[PlannedEpisode]:
        """This shard's planned episodes not stored yet (spoiled ones are purged to rerun)."""
        episodes = self.plan.episodes
        todo = remaining_episodes(self.engine, [p.episode_id for p in episodes])
        return [p for p in episodes if p.episode_id in todo]

    def end(self, status: RunEnding, *, flow_run_id: str | None = None) -> None:
        """Record how the run ended: the one writer of `collection_run.status` on the
        collection path. A shard records nothing in SQL (its parent ends the run)."""
        flow_run_id = flow_run_id or self.flow_run_id
        if self.owns_run:
            close_run(self.engine, self.run_id, status=status, flow_run_id=flow_run_id)
        self.ended, self.flow_run_id = status, flow_run_id

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
    ) -> None:
        self._request = request
        self._settings = settings
        self._shard = shard
        self._preflight = preflight
        self._engine = engine
        self._store = store
        self._planner = planner
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
        policy = make_run_policy(plan.request.policy, settings)
        engine = self._engine if self._engine is not None else make_engine(settings.database)
        try:
            ensure_current(engine)
            store = self._store if self._store is not None else make_object_store(settings.objects)
            store.check()
        except BaseException:
            if self._engine is None:
                engine.dispose()
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
            await collection.policy.aclose()
            raise
        self._collection = collection
        return collection

    # ----------------------------------------------------------------- closing

    def _conclude(self, collection: Collection, error: BaseException | None) -> None:
        """Record the run's ending when this process started it and nothing ended it."""
        if collection.started and collection.ended is None:
            collection.end(run_ending(error))

    def _release(self, collection: Collection) -> None:
        """Free the lock and the engine this context made."""
        try:
            if collection.lock is not None:
                collection.lock.release()
        finally:
            if self._engine is None:
                collection.engine.dispose()

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
            # Shielded: a cancelled run still records its ending and frees its lock.
            await asyncio.shield(asyncio.to_thread(self._conclude, collection, error))
        finally:
            try:
                await asyncio.shield(asyncio.to_thread(self._release, collection))
            finally:
                await collection.policy.aclose()


def open_collection(
    request: CollectRequest,
    settings: Settings,
    *,
    shard: Shard | None = None,
    preflight: bool = False,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    planner: Planner = plan_request,
) -> CollectionContext:
    """The collection of `request` (which must carry its run key), for `with` or `async
    with`: planned, opened, checked (`preflight`), locked; closed once on exit.

    `shard` is the part this process collects (None: the whole run, which records the
    run's status). `engine` and `store` are the caller's to keep (not disposed); the lock
    is then taken in `engine`'s database. Within a collection's `lend`, the same request
    and shard return the lent collection, untouched by this context's exit.

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
    )


def _lock_settings(settings: Settings, engine: Engine | None) -> DatabaseSettings:
    """Where the lock lives: the settings' database, or the caller's engine's."""
    if engine is None:
        return settings.database
    url = SecretStr(engine.url.render_as_string(hide_password=False))
    return settings.database.model_copy(update={"url": url})
