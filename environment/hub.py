"""One collection run serving client-driven sessions as they arrive.

    async with open_hub(config, settings) as hub:     # the server's or EpiflowEnv's
        session, observation = await hub.reset(selection)
        observation = await hub.step(session, action)

Every session of a hub is an episode of ONE collection run (`open_collection` with a
`ChannelPolicy` and an empty `tasks_planner`, run by `Collection.run`): its work is
`collection.runner.run_episodes` over the stream of sessions' planned episodes, so each
session's episode runs through the one episode loop in a jail of the warm pool, is
rewarded by `scoring.rewards.apply_rewards` and stored through the outbox like any
collected episode (one group per episode: `batch_size` 1, so a session's end is stored
before the client hears of it). The run holds its run key's lock while the hub is open
and ends `completed` when the hub closes (`interrupted` when cancelled).

A session gets the next rollout index of its task that no open or stored episode of the
run has, so two clients on one task (GRPO's generations) are two episodes, and a run key
reused by a restarted server adds episodes instead of clashing with stored ones.

A hub loads its suite once, on the first reset that names it (`selection.LoadedSuites`,
by `load_suite`: the registry's loader with the entry point's suites and sandbox
settings unless one is injected), and resolves every later reset against it.

Sessions are bounded (`max_sessions`: a reset beyond it is refused at once with
`capacity`) and closed when idle past `idle_timeout_s` (their episode ends and is stored,
`policy_error`, with the reason). Closing the hub closes every open session the same way,
stores their episodes and releases every jail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine

from agent.trajectory import Trajectory, episode_id_for
from collection.lifecycle import Collection, Executed, open_collection, tasks_planner
from collection.plan import PlannedEpisode
from collection.request import CollectRequest, CollectResult
from collection.runner import PersistedGroup, run_episodes
from config.settings import Settings
from environment.actions import Action
from environment.errors import CapacityReached, SessionClosed
from environment.selection import LoadedSuites, SuiteLoader, TaskSelection, resolve_task
from environment.sessions import ChannelPolicy, Session
from storage.objects import ObjectStore
from storage.runs import remaining_episodes
from suites.registry import load_suite as registry_load_suite

__all__ = ["HubConfig", "SessionHub", "open_hub"]

logger = logging.getLogger(__name__)

SESSION_POLICY = "env:client"
"""The policy label of a hub's episodes (their turns come from the clients)."""


class HubConfig(BaseModel):
    """What a hub serves and how many sessions it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_key: str
    """The collection run every session belongs to."""
    suite: str = "builtin"
    """The suite whose tasks sessions run."""
    templates: list[str] | None = None
    """The templates (or Harbor tasks) served; None: every template of the suite."""
    max_sessions: int = Field(default=8, ge=1, le=512)
    """Sessions open at once (the run's concurrency: workers and warm jails)."""
    idle_timeout_s: float = Field(default=300.0, gt=0)
    """A session with no client message for this long is closed and its episode stored."""


class SessionHub:
    """The sessions of one open collection run (built by `open_hub`)."""

    def __init__(
        self,
        collection: Collection,
        policy: ChannelPolicy,
        config: HubConfig,
        suites: LoadedSuites,
    ) -> None:
        self.collection = collection
        self.policy = policy
        self.config = config
        self.suites = suites
        """The suites resets resolve against, each loaded once."""
        self.sessions: dict[uuid.UUID, Session] = {}
        """Open sessions by episode id (until their episode is stored)."""
        self.result: CollectResult | None = None
        """The run's result, once the hub closed."""
        self._queue: asyncio.Queue[PlannedEpisode | None] = asyncio.Queue()
        self._finished: dict[uuid.UUID, Trajectory] = {}
        self._next_rollout: dict[str, int] = defaultdict(int)
        self._reserved = 0
        self._stopping = False
        self._run: asyncio.Task[CollectResult] | None = None
        self._reaper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------- the run

    def start(self) -> None:
        """Start the run (its row `running`, the warm pool) and the idle reaper."""
        self._run = asyncio.create_task(self.collection.run(self._work))
        self._run.add_done_callback(self._run_ended)
        self._reaper = asyncio.create_task(self._reap_idle())

    async def _work(self, collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        report = await run_episodes(
            collection, self._stream(), on_episode=self._ended, on_persisted=self._stored
        )
        return Executed(episodes=len(report.inserted), steps=report.steps)

    async def _stream(self) -> AsyncIterator[PlannedEpisode]:
        while (planned := await self._queue.get()) is not None:
            yield planned

    def _ended(self, trajectory: Trajectory) -> None:
        self._finished[trajectory.episode_id] = trajectory

    def _stored(self, group: PersistedGroup) -> None:
        for episode in [*group.written.inserted, *group.written.skipped_existing]:
            trajectory = self._finished.pop(episode, None)
            session = self.sessions.pop(episode, None)
            self.policy.sessions.pop(episode, None)
            if session is not None and trajectory is not None:
                session.stored(trajectory)

    def _run_ended(self, run: asyncio.Task[CollectResult]) -> None:
        error = run.exception() if not run.cancelled() else asyncio.CancelledError()
        if error is None:
            return
        logger.error("run %s stopped: %s", self.config.run_key, error)
        from environment.errors import InfrastructureFailure

        failure = InfrastructureFailure(f"the run serving this session stopped: {error}")
        for session in list(self.sessions.values()):
            session.fail(failure)

    async def _reap_idle(self) -> None:
        limit = self.config.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if not session.busy and not session.done and now - session.last_active > limit:
                    logger.info("session %s idle past %g s: closed", session.episode_id, limit)
                    session.close(f"no message from the client for {limit:g} s")

    # -------------------------------------------------------------- the sessions

    async def reset(self, selection: TaskSelection) -> tuple[Session, dict[str, Any]]:
        """A new session on the task `selection` names, and its first observation (the
        instruction and tool schemas), once its jail is open.

        Raises:
            CapacityReached: `max_sessions` sessions are open (at once, no waiting).
            UnknownTask: the selection names no served task.
            SessionClosed: the hub is stopping.
            InfrastructureFailure: the episode could not start (its jail); stored.
        """
        if self._stopping:
            raise SessionClosed("the server is stopping")
        if len(self.sessions) + self._reserved >= self.config.max_sessions:
            raise CapacityReached(
                f"all {self.config.max_sessions} sessions are in use (--max-sessions)"
            )
        self._reserved += 1
        try:
            settings = self.collection.settings
            task = await asyncio.to_thread(
                resolve_task,
                selection,
                suite=self.config.suite,
                templates=self.config.templates,
                suites=self.suites,
            )
            planned = await asyncio.to_thread(self._plan, task.task_id, task)
            session = Session(planned, settings.rewards)
            self.sessions[planned.episode_id] = session
            self.policy.sessions[planned.episode_id] = session
        finally:
            self._reserved -= 1
        await self._queue.put(planned)
        turn = await session.first_turn()
        return session, session.observation(turn, first=True)

    def _plan(self, task_id: str, task: Any) -> PlannedEpisode:
        """The next rollout of `task` no open or stored episode of the run has."""
        run_key = self.config.run_key
        while True:
            index = self._next_rollout[task_id]
            self._next_rollout[task_id] = index + 1
            episode = episode_id_for(run_key, task_id, index)
            if episode in self.sessions or episode in self._finished:
                continue
            if episode in remaining_episodes(self.collection.engine, [episode]):
                return PlannedEpisode(task=task, rollout_index=index, episode_id=episode)

    async def step(self, session: Session, action: Action) -> dict[str, Any]:
        """The observation after `action` (the final one, with the stored episode's
        rewards, when the episode ended).

        Raises:
            SessionDone, SessionClosed: the episode ended, or the session was closed.
            InfrastructureFailure: the episode ended for a reason not the agent's.
        """
        turn = await session.act(action)
        return session.observation(turn)

    def state(self, session: Session) -> dict[str, Any]:
        """OpenEnv's state of `session`: its episode, steps so far, whether done."""
        trajectory = session.trajectory
        return {
            "episode_id": str(session.episode_id),
            "task_id": session.planned.task.task_id,
            "run_key": self.config.run_key,
            "done": session.done,
            "closed": session.closed,
            "status": trajectory.status.value if trajectory is not None else "running",
            "step_count": len(trajectory.steps) if trajectory is not None else None,
        }

    async def close(self, session: Session, reason: str) -> None:
        """Close `session` (its episode ends and is stored) and wait until it is stored."""
        session.close(reason)
        await session.ended()

    async def aclose(self) -> CollectResult | None:
        """Stop: refuse new sessions, close the open ones, end the stream, wait for the run
        to store every episode and end; the run's result."""
        self._stopping = True
        for session in list(self.sessions.values()):
            session.close("the server is stopping")
        await self._queue.put(None)
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._run is not None:
            self.result = await self._run
        return self.result


@contextlib.asynccontextmanager
async def open_hub(
    config: HubConfig,
    settings: Settings,
    *,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    load_suite: SuiteLoader | None = None,
) -> AsyncIterator[SessionHub]:
    """A hub serving `config`'s sessions as the collection run `config.run_key`: opened
    (lock, engine, store) through `open_collection`, started, and on exit closed (every
    session's episode stored, the run ended, the lock released, every jail gone).
    `load_suite` loads a suite by name, once per hub (default: the registry's, with
    `settings.suites` and `settings.sandbox`).

    Raises:
        RequestError: the suite or a template does not exist.
        StorageError: the database or object store cannot be used, or the run key is
            being collected right now (`RunKeyBusy`).
    """
    request = CollectRequest(
        suite=config.suite,
        templates=config.templates,
        policy=SESSION_POLICY,
        run_key=config.run_key,
        concurrency=config.max_sessions,
        batch_size=1,
    )
    # A client's think time is bounded by the idle deadline, not the model timeout.
    loop = settings.loop.model_copy(
        update={"policy_timeout_s": max(settings.loop.policy_timeout_s, 2 * config.idle_timeout_s)}
    )
    settings = dataclasses.replace(settings, loop=loop)
    policy = ChannelPolicy(SESSION_POLICY, config.run_key)
    if load_suite is None:
        load_suite = functools.partial(
            registry_load_suite, settings=settings.suites, sandbox=settings.sandbox
        )
    async with open_collection(
        request,
        settings,
        engine=engine,
        store=store,
        planner=tasks_planner([]),
        policy=policy,
    ) as collection:
        hub = SessionHub(collection, policy, config, LoadedSuites(load_suite))
        hub.start()
        try:
            yield hub
        finally:
            await asyncio.shield(hub.aclose())
