"""Rewards: per-step shaping, the final reward from the verifier, and discounted returns.

Immediate rewards (seed 000 §4.3), summed per step and clipped to ±`max_step_fraction`
of the final reward's scale:

- format: `format_ok_reward` when the message parsed, `format_error_penalty` when not;
- repetition: `repeated_call_penalty` for an identical call whose result cannot have
  changed (see `scoring.calls.repeated_call_steps`);
- exploration: `new_path_reward` for a successful call on a target not touched before.

Final reward: `success_reward` for a score the one success rule
(`agent.settings.SuccessSettings`, the rule of the episode's status) calls a success,
`failure_reward + (success_reward - failure_reward) * score` for a lower verifier score, and
`failure_reward` when the verifier did not run. Partial credit is therefore linear
between failure and success, and its sign flips at `-failure / (success - failure)`
(1/3 with the defaults).

Returns: `G_t = r_t + γ G_{t+1}`, where the final reward is added to the last step's
immediate reward.

`final_reward` is the one final-reward formula: collection, evaluation, the QC features
and GRPO's `training.rewards.SandboxReward` all reward through this module.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from agent.trajectory import INFRASTRUCTURE_STATUSES, Step, Trajectory
from scoring.calls import RepeatedCalls, call_target, is_format_error
from scoring.settings import RewardSettings

__all__ = [
    "RewardBreakdown",
    "StepRewards",
    "apply_rewards",
    "compute_rewards",
    "discounted_returns",
    "final_reward",
    "immediate_rewards",
    "step_rewards",
]


class RewardBreakdown(BaseModel):
    """Every reward of one episode, as written back onto the trajectory."""

    immediate: list[float]
    """Clipped shaping reward per step, in step order."""
    final: float
    """Final reward from the verifier."""
    returns: list[float]
    """Discounted return per step (final reward included at the last step)."""
    total: float
    """Sum of the immediate rewards and the final reward (undiscounted)."""


def immediate_rewards(trajectory: Trajectory, settings: RewardSettings) -> list[float]:
    """The shaping reward of each step, clipped to ±max_step_fraction × final scale."""
    return step_rewards(trajectory.steps, settings)


def step_rewards(steps: Sequence[Step], settings: RewardSettings) -> list[float]:
    """`immediate_rewards` over the steps so far (a step's reward depends only on it and
    the steps before it, so an episode still running gets its final values)."""
    running = StepRewards(settings)
    return [running.add(step) for step in steps]


class StepRewards:
    """`step_rewards` one step at a time, in step order (the one formula: that function
    is this class over a whole episode). `add(step)` is the step's immediate reward
    given the steps added before it, so a session rewards each step as it comes instead
    of going over the episode so far again."""

    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        self._repeats = RepeatedCalls()
        self._seen_targets: set[str] = set()

    def add(self, step: Step) -> float:
        """The clipped immediate reward of `step`, the next step of the episode."""
        settings = self.settings
        cap = settings.max_step_fraction * settings.final_scale
        r = settings.format_error_penalty if is_format_error(step) else settings.format_ok_reward
        if self._repeats.add(step):
            r += settings.repeated_call_penalty
        target = call_target(step)
        # A failed call explored nothing: its successful retry still earns the exploration reward.
        if target is not None and not step.tool_failed:
            if target not in self._seen_targets:
                r += settings.new_path_reward
            self._seen_targets.add(target)
        return max(-cap, min(cap, r))


def final_reward(verifier_score: float | None, settings: RewardSettings) -> float:
    """The outcome reward for a verifier score in [0, 1] (None: the verifier did not run)."""
    if verifier_score is None:
        return settings.failure_reward
    if settings.success.is_success(verifier_score):
        return settings.success_reward
    score = min(1.0, max(0.0, verifier_score))
    return settings.failure_reward + (settings.success_reward - settings.failure_reward) * score


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """`G_t = r_t + gamma * G_{t+1}`, computed backwards."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def compute_rewards(trajectory: Trajectory, settings: RewardSettings) -> RewardBreakdown:
    """All rewards of an episode without touching it."""
    immediate = immediate_rewards(trajectory, settings)
    final = final_reward(trajectory.verifier_score, settings)
    per_step = list(immediate)
    if per_step:
        per_step[-1] += final
    return RewardBreakdown(
        immediate=immediate,
        final=final,
        returns=discounted_returns(per_step, settings.gamma),
        total=sum(immediate) + final,
    )


def apply_rewards(trajectory: Trajectory, settings: RewardSettings) -> Trajectory:
    """A copy of the trajectory with immediate rewards, returns, final and total reward
    filled; an infrastructure outcome (`INFRASTRUCTURE_STATUSES`) gets none: its rewards
    stay 0 and its final and total reward None, since it says nothing about the agent."""
    if trajectory.status in INFRASTRUCTURE_STATUSES:
        steps = [
            s.model_copy(update={"immediate_reward": 0.0, "return_": 0.0}) for s in trajectory.steps
        ]
        return trajectory.model_copy(
            update={"steps": steps, "final_reward": None, "total_reward": None}
        )
    breakdown = compute_rewards(trajectory, settings)
    steps = [
        step.model_copy(update={"immediate_reward": r, "return_": g})
        for step, r, g in zip(trajectory.steps, breakdown.immediate, breakdown.returns, strict=True)
    ]
    return trajectory.model_copy(
        update={"steps": steps, "final_reward": breakdown.final, "total_reward": breakdown.total}
    )
