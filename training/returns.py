"""Per-turn discounted returns for agentic GRPO (opt-in), and the group normalisation.

Today's default is one advantage per episode: every sampled token of rollout i gets

    A_i = (R_i - mean_j R_j) / (std_j R_j + 1e-4),   R_i its `total_reward`

(`training.groups.group_advantages`, TRL's `scale_rewards="group"`). With
`TrainingSettings.returns_gamma` = γ set, each assistant turn gets its own advantage
instead (seed 000 §4.3: discounted returns, γ 0.95-0.99). For rollout i with turns
t = 0..T_i-1 and per-turn rewards r_{i,t} (the turn's stored immediate reward, the
final reward added at the last turn, so Σ_t r_{i,t} = `total_reward`, exactly as
`scoring.rewards.compute_rewards` builds `Step.return_`):

    G_{i,t} = Σ_{k≥t} γ^{k-t} r_{i,k}                         (reward-to-go)
    A_{i,t} = (G_{i,t} - mean_j G_{j,0}) / (std_j G_{j,0} + 1e-4)

std with Bessel's correction, over the group's admitted rollouts. Every sampled token of
turn t is trained with A_{i,t} (`training.trainers.step_returns`).

Why these choices:

- **The baseline and the scale are the start returns'.** G_{j,0} is what each rollout
  earned from the task's start, the quantity the group compares; one baseline per
  group keeps GRPO's critic-free estimate (a per-turn baseline would need turns that
  are comparable across rollouts, and turn t of one episode is not turn t of another).
  Later turns' returns are measured on the same scale, so a turn past the decisive one
  gets less credit than the start, never a fresh normalisation. Zero variance is
  judged on G_{·,0} for the same reason: it is the value the group's advantages are
  normalised by.
- **γ < 1 prefers the shorter success.** Two successes with the same `total_reward` get
  the same episode advantage today; with γ < 1 the one that finished in fewer turns has
  the larger start return, so its turns are reinforced more. That is the seed's reason
  for discounting an agent's episodes.
- **γ = 1 without step rewards is today's formula, exactly.** Then G_{i,t} = R_i for
  every turn and A_{i,t} = A_i (`group_advantages` is this module's formula with one
  turn per rollout, not a second copy of it).
- **Why it is not the default.** Immediate rewards are kept at 1-5 % of the final one
  (`scoring.settings.RewardSettings`), so with γ close to 1 the per-turn advantages
  differ from the episode one mostly by the discount; whether that helps the recipe has
  not been measured at its scale (docs/training.md, "Per-turn returns").

An infrastructure outcome still drops its group, and a gate-discarded rollout is still
left out of the baseline (`training.groups`); the stored `advantage` of a rollout stays
one number, A_{i,0}, and the per-turn ones are stored beside it
(`grpo_rollout.turn_advantages`).

`γ` here is the trainer's (`EPIFLOW_TRAINING_RETURNS_GAMMA`), not the stored
`Step.return_`'s (`EPIFLOW_SCORING_GAMMA`): the returns are recomputed from the stored
rewards with the same backward recursion (`scoring.rewards.discounted_returns`), so a
run's γ is a training knob that does not rewrite stored episodes.

Pure: no torch, no TRL, no SQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.trajectory import Trajectory
from scoring.rewards import discounted_returns
from training.errors import TrainerError
from training.rollout_tokens import TokenRollout

__all__ = [
    "ADVANTAGE_EPSILON",
    "bessel_std",
    "token_advantages",
    "turn_advantages",
    "turn_returns",
    "turn_rewards",
]

ADVANTAGE_EPSILON = 1e-4
"""Added to the group's standard deviation before dividing (TRL's constant)."""


def bessel_std(values: Sequence[float]) -> float:
    """Standard deviation with Bessel's correction (NaN for fewer than two values)."""
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def turn_rewards(trajectory: Trajectory) -> list[float]:
    """Each assistant turn's reward: its stored immediate reward, the final reward added
    at the last turn (their sum is the episode's `total_reward`). An episode without a
    turn has one reward, its `total_reward`.

    Raises:
        TrainerError: the episode carries no final reward (not rewarded by
            `scoring.rewards.apply_rewards`, or an infrastructure outcome).
    """
    if trajectory.final_reward is None or trajectory.total_reward is None:
        raise TrainerError(
            f"episode {trajectory.episode_id} ({trajectory.status.value}) has no final reward: "
            "rollouts are rewarded with scoring.rewards.apply_rewards before their returns"
        )
    if not trajectory.steps:
        return [trajectory.total_reward]
    rewards = [step.immediate_reward for step in trajectory.steps]
    rewards[-1] += trajectory.final_reward
    return rewards


def turn_returns(trajectory: Trajectory, gamma: float) -> list[float]:
    """G_t = Σ_{k≥t} γ^{k-t} r_k over the episode's turns (`turn_rewards`).

    Raises:
        TrainerError: the episode carries no final reward.
    """
    return discounted_returns(turn_rewards(trajectory), gamma)


def turn_advantages(returns: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each rollout's per-turn advantages from its per-turn returns, normalised by the
    mean and Bessel std of the rollouts' start returns (see the module). One return per
    rollout gives the episode-level advantages exactly.

    Raises:
        TrainerError: no rollout, or a rollout without a return.
    """
    if not returns or any(not r for r in returns):
        raise TrainerError("per-turn advantages need rollouts with at least one return each")
    starts = [r[0] for r in returns]
    mean = sum(starts) / len(starts)
    scale = bessel_std(starts) + ADVANTAGE_EPSILON
    return [[(g - mean) / scale for g in r] for r in returns]


def token_advantages(rollout: TokenRollout, advantages: Sequence[float]) -> list[float]:
    """The advantage of each completion token of `rollout`: its turn's
    (`TokenRollout.turn_index`); observation tokens get their turn's too, though the loss
    masks them.

    Raises:
        TrainerError: the rollout has more turns than `advantages`.
    """
    turns = max(rollout.turn_index, default=-1) + 1
    if turns > len(advantages):
        raise TrainerError(
            f"episode {rollout.episode_id} has {turns} turns but {len(advantages)} "
            "per-turn advantages"
        )
    return [advantages[k] for k in rollout.turn_index]
