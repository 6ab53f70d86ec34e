"""A session: one episode of the one episode loop whose assistant turns come from a client.

The loop (`agent.loop.run_episode`) runs unchanged: its policy is a `ChannelPolicy`,
whose `respond(request)` hands the loop's request (the observation so far) to the
session the request belongs to and waits for the client's next action. So protocol v1,
the tools, the limits, the fault profile, the verifier in its own jail and the rewards
are the loop's, for a session as for any collected episode.

    client           Session                     the loop (a worker of the run)
    reset ─────────► planned ──────────────────► run_episode(task, ChannelPolicy)
          ◄───────── first request ◄──────────── respond(request)   [sandbox open]
    step(action) ──► action ───────────────────► … tool call, observation …
          ◄───────── next request ◄───────────── respond(request)
    step(final) ───► action ───────────────────► verifier (own jail), rewards, stored
          ◄───────── the stored trajectory (done)

A request reaches its session by episode id: `episode_id_for(run_key, task_id, seed)`,
since the loop's policy seed is the rollout index (`run_episode`'s default), and each
session of a run has its own (task, rollout index).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from agent.errors import PolicyError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus, Trajectory, episode_id_for
from collection.plan import PlannedEpisode
from environment.actions import Action
from environment.errors import (
    InfrastructureFailure,
    SessionClosed,
    SessionDone,
)
from environment.wire import Observation, StepResult
from scoring.rewards import StepRewards
from scoring.settings import RewardSettings

__all__ = ["ChannelPolicy", "Session", "Turn"]

Turn = PolicyRequest | Trajectory
"""What the loop hands a session next: its next request, or the stored trajectory."""


class SessionAborted(PolicyError):
    """The client closed the session (or left, or idled past its deadline) while the loop
    waited for its turn; the episode ends `policy_error` with this reason and is stored."""


class Session:
    """One client's episode: the planned episode, and the two hand-offs between the
    client and the loop (the loop's next turn, the client's next action)."""

    def __init__(self, planned: PlannedEpisode, rewards: RewardSettings) -> None:
        self.planned = planned
        self.rewards = rewards
        self._step_rewards = StepRewards(rewards)
        self._rewarded: list[float] = []
        """The immediate reward of each step observed so far (`StepRewards`, one step at a
        time: a step's observation does not go over the earlier steps again)."""
        loop = asyncio.get_running_loop()
        self._turn: asyncio.Future[Turn] = loop.create_future()
        self._action: asyncio.Future[PolicyResponse] | None = None
        self._ended = asyncio.Event()
        self.trajectory: Trajectory | None = None
        """The stored trajectory, once the episode ended and was stored."""
        self.closed: str | None = None
        """Why the session was closed before its end, once it was."""
        self.last_active = time.monotonic()
        self.busy = False
        """A reset or step is waiting for the loop (not idle, whatever the clock says)."""

    @property
    def episode_id(self) -> uuid.UUID:
        return self.planned.episode_id

    @property
    def done(self) -> bool:
        return self.trajectory is not None or self.closed is not None

    # ------------------------------------------------------------ the loop's side

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        """Hand `request` to the client and wait for its action (the loop's policy call).

        Raises:
            SessionAborted: the session was closed before the client acted.
        """
        if self.closed is not None:
            raise SessionAborted(f"the session was closed: {self.closed}")
        action: asyncio.Future[PolicyResponse] = asyncio.get_running_loop().create_future()
        self._action = action
        if not self._turn.done():
            self._turn.set_result(request)
        try:
            return await action
        finally:
            self._action = None

    def stored(self, trajectory: Trajectory) -> None:
        """The episode ended and is stored: the client's pending turn gets it."""
        self.trajectory = trajectory
        self._ended.set()
        if not self._turn.done():
            self._turn.set_result(trajectory)

    # ---------------------------------------------------------- the client's side

    async def first_turn(self) -> Turn:
        """The loop's first request (the sandbox is open), or the trajectory when the
        episode ended before asking anything (the sandbox could not start)."""
        return await self._wait_turn()

    async def act(self, action: Action) -> Turn:
        """Hand `action` to the loop and wait for what follows it.

        Raises:
            SessionDone: the episode has ended.
            SessionClosed: the session was closed.
        """
        if self.closed is not None:
            raise SessionClosed(f"the session was closed: {self.closed}")
        if self.trajectory is not None:
            raise SessionDone(f"episode {self.episode_id} has ended: reset for a new one")
        pending = self._action
        if pending is None or pending.done():
            raise SessionDone(f"episode {self.episode_id} is not waiting for an action")
        self._turn = asyncio.get_running_loop().create_future()
        pending.set_result(action.response())
        return await self._wait_turn()

    async def _wait_turn(self) -> Turn:
        self.busy = True
        try:
            return await asyncio.shield(self._turn)
        finally:
            self.busy = False
            self.last_active = time.monotonic()

    def fail(self, error: BaseException) -> None:
        """The run serving this session failed (storage refused, the server broke): the
        client's pending turn gets `error` instead of an outcome."""
        if self.closed is None:
            self.closed = f"the run failed: {error}"
        self._ended.set()
        if not self._turn.done():
            self._turn.set_exception(error)
        if self._action is not None and not self._action.done():
            self._action.set_exception(SessionAborted(self.closed))

    async def ended(self) -> None:
        """Wait until the episode is stored (or the run serving it failed)."""
        await self._ended.wait()

    def close(self, reason: str) -> None:
        """Close the session: a loop waiting for its action gets `SessionAborted` (the
        episode ends and is stored); the next client call gets `SessionClosed`."""
        if self.done:
            return
        self.closed = reason
        if self._action is not None and not self._action.done():
            self._action.set_exception(SessionAborted(f"the session was closed: {reason}"))

    # -------------------------------------------------------------- observations

    def observation(self, turn: Turn, *, first: bool = False) -> dict[str, Any]:
        """OpenEnv's observation message data for `turn`: `observation`, `reward`, `done`.

        Raises:
            InfrastructureFailure: the episode ended for a reason that is not the agent's
                (never a reward of 0).
        """
        episode = str(self.episode_id)
        if isinstance(turn, Trajectory):
            return self._final(turn)
        observation: dict[str, Any] = {
            "episode_id": episode,
            "task_id": self.planned.task.task_id,
            "step_index": turn.step_index,
        }
        reward: float | None = None
        if first:
            observation["instruction"] = self.planned.task.prompt
            observation["tools"] = [t.openai_tool() for t in turn.tools]
            observation["system_prompt"] = turn.messages[0]["content"]
        else:
            step = turn.steps[-1]
            observation["text"] = step.observation
            observation["tool"] = step.tool
            observation["exit_code"] = step.exit_code
            observation["parse_error"] = step.parse_error
            for earlier in turn.steps[len(self._rewarded) :]:
                self._rewarded.append(self._step_rewards.add(earlier))
            reward = self._rewarded[-1]
            observation["step_reward"] = reward
        return _result(observation, reward, done=False)

    def _final(self, trajectory: Trajectory) -> dict[str, Any]:
        if trajectory.status in INFRASTRUCTURE_STATUSES:
            raise InfrastructureFailure(
                f"episode {trajectory.episode_id} ended {trajectory.status.value}, not the "
                f"agent's doing: {trajectory.failure_reason}"
            )
        last = trajectory.steps[-1] if trajectory.steps else None
        observation = {
            "episode_id": str(trajectory.episode_id),
            "task_id": trajectory.task_id,
            "step_index": last.index if last is not None else None,
            "text": last.observation if last is not None else None,
            "status": trajectory.status.value,
            "failure_category": trajectory.failure_category.value,
            "failure_reason": trajectory.failure_reason,
            "verifier_score": trajectory.verifier_score,
            "verifier_reason": trajectory.verifier_reason,
            "final_reward": trajectory.final_reward,
            "total_reward": trajectory.total_reward,
            "step_reward": last.immediate_reward if last is not None else None,
            "success": trajectory.status == EpisodeStatus.SUCCESS,
        }
        return _result(observation, trajectory.final_reward, done=True)


def _result(observation: dict[str, Any], reward: float | None, *, done: bool) -> dict[str, Any]:
    """An `observation` message's data (`environment.wire.StepResult`, unset fields left out)."""
    result = StepResult(observation=Observation(**observation), reward=reward, done=done)
    return result.model_dump(mode="json", exclude_none=True) | {"reward": reward}


class ChannelPolicy(Policy):
    """The policy of a run whose turns come from clients: each request goes to the
    session of its episode (registered by the hub before the episode is planned)."""

    def __init__(self, spec: str, run_key: str) -> None:
        self.spec = spec
        self.run_key = run_key
        self.sessions: dict[uuid.UUID, Session] = {}

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        """The client's next action for the request's episode.

        Raises:
            SessionAborted: the session was closed, or is unknown (it ended).
        """
        episode = episode_id_for(self.run_key, request.task.task_id, request.seed)
        session = self.sessions.get(episode)
        if session is None:
            raise SessionAborted(f"no open session for episode {episode}")
        return await session.respond(request)
