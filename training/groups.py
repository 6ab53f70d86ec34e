"""GRPO groups of whole episodes: which are trained, their advantages, what is dropped.

A group is the `rollouts_per_task` episodes of one task in one generation batch. A
rollout's reward is its episode's `total_reward`, which `scoring.rewards.apply_rewards`
sets: the function collection stores every episode with, so GRPO optimises exactly the
reward stored with the episode. The advantage is that reward normalised within the group,
with TRL's `GRPOTrainer` formula (`scale_rewards="group"`):

    A_i = (r_i - mean(r)) / (std(r) + 1e-4),   std with Bessel's correction

so the advantage stored with each episode is the one the trainer uses. With per-turn
returns (`judge_group(gamma=…)`, opt-in: `training.returns`), each turn gets its own
advantage from its discounted reward-to-go, normalised by the group's start returns; the
fates below are the same, zero variance judged on the start returns.

Before a group is judged, the online QC gate has judged its episodes
(`expectations.gate.run_gate` over the generation batch, verdicts stored in `qc_result`
like any gate's): an episode it discards is not trained on. Its group is **re-judged
without it**, not dropped: the verdict is about that episode's data (a format never
recovered, an aborted episode), and its siblings are still samples of the same policy on
the same task, so their relative rewards still say which behaviour to reinforce; dropping
the whole group would throw that away, and early in training, when the gate discards
often, it would drop nearly every group. The discarded episode's slot gets reward None,
which TRL (≥ 1.16) leaves out of the group's mean and standard deviation (`nanmean`,
`nanstd` with Bessel's correction over the scored slots) and gives advantage 0, so the
advantages computed here over the admitted rollouts are still exactly the trainer's. The
price is known: a discarded behaviour gets no negative advantage from RL (the format is
taught by SFT and by the reward's format shaping; the gate keeps broken data out of the
gradient). A group left with fewer than two admitted rollouts has nothing to compare and
is dropped (`qc_discarded`). Discarded rollouts are counted (`qc_discarded_rollouts`),
and so are the groups they dropped (`groups_dropped_qc`). A `downweight` verdict trains at
full advantage: TRL's loss has no per-sample weight.

A group has one of four fates (`GroupFate`), decided before the optimiser step:

- `trained`: its advantages enter the loss.
- `infrastructure`: a rollout ended `env_error`, `storage_error` or `endpoint_error`
  (`agent.trajectory.INFRASTRUCTURE_STATUSES`). The whole group is **dropped, not
  redone**: an infrastructure failure is seldom transient within one batch (a jail that
  cannot start, a store or an endpoint that is down), so a redo would stall the batch on
  it; the group's baseline from the rollouts that survived would be biased toward
  whatever the failure spared; and the failed episode stays stored as what it is, while a
  redone rollout after the policy moved would be another policy's sample. (SkyRL masks
  such a group the same way.) Counted in `groups_dropped_infrastructure` and
  `infrastructure_rollouts`.
- `zero_variance`: every rollout got the same reward, so every advantage is 0 and the
  group would only add KL and dilute the token normaliser. Dropped and counted
  (`groups_dropped_zero_variance`); when their share of the judged groups exceeds
  `TrainingSettings.zero_variance_warn_share`, `zero_variance_warning` says what to change.
  Only the admitted rollouts are compared.
- `qc_discarded`: the gate discarded all but at most one of the rollouts.

A dropped group's rollouts stay in TRL's fixed-size batch with every token masked, so
they contribute nothing to the loss. Pure: no torch, no TRL, no SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from agent.trajectory import INFRASTRUCTURE_STATUSES, Trajectory
from training.errors import TrainerError
from training.returns import ADVANTAGE_EPSILON, bessel_std, turn_advantages, turn_returns

__all__ = [
    "ADVANTAGE_EPSILON",
    "Group",
    "GroupCounts",
    "GroupFate",
    "group_advantages",
    "judge_group",
    "zero_variance_warning",
]

ZERO_STD_TOLERANCE = 1e-8
"""A group whose reward standard deviation is at most this has zero variance (TRL's
`torch.isclose(std, 0)`)."""


class GroupFate(StrEnum):
    """What happens to a group before the optimiser step."""

    TRAINED = "trained"
    INFRASTRUCTURE = "infrastructure"
    ZERO_VARIANCE = "zero_variance"
    QC_DISCARDED = "qc_discarded"


@dataclass(frozen=True)
class Group:
    """One task's rollouts of one generation batch, judged."""

    task_id: str
    """The task every rollout worked on."""
    trajectories: tuple[Trajectory, ...]
    """The rollouts, in the batch's order."""
    fate: GroupFate
    """Trained, or dropped and why."""
    rewards: tuple[float | None, ...]
    """Each rollout's reward in the group: its `total_reward`; None for an
    infrastructure outcome or a rollout the gate discarded (out of the baseline)."""
    advantages: tuple[float | None, ...] | None
    """Each rollout's advantage when the group is trained (None for a discarded
    rollout: not trained on); None when the group is dropped."""
    discarded: tuple[bool, ...] = ()
    """Whether the online QC gate discarded each rollout (empty: none was)."""
    turn_advantages: tuple[tuple[float, ...] | None, ...] | None = None
    """With per-turn returns (`gamma` given to `judge_group`), each rollout's advantage
    per assistant turn (None for a discarded rollout); `advantages` then holds each
    rollout's first turn's. None without per-turn returns or when the group is dropped."""

    @property
    def n_discarded(self) -> int:
        return sum(self.discarded)

    def admitted(self, index: int) -> bool:
        """Whether rollout `index` is trained on when the group is."""
        return not (self.discarded and self.discarded[index])

    @property
    def trained(self) -> bool:
        return self.fate is GroupFate.TRAINED


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """The group-normalised advantages of `rewards` (TRL's formula, see the module):
    `training.returns.turn_advantages` with one return per rollout."""
    return [turns[0] for turns in turn_advantages([[r] for r in rewards])]


def judge_group(
    trajectories: Sequence[Trajectory],
    *,
    discarded: Collection[uuid.UUID] = frozenset(),
    gamma: float | None = None,
) -> Group:
    """The fate, rewards and advantages of one task's rollouts; `discarded` holds the
    episode ids the online QC gate discarded (see the module). With `gamma`, the
    advantages are per turn, from discounted returns (`training.returns`): the group is
    compared, and judged for zero variance, on its rollouts' start returns.

    Raises:
        TrainerError: the group is empty or mixes tasks, or an agent outcome carries no
            reward (the episode was not rewarded by `scoring.rewards.apply_rewards`).
    """
    if not trajectories:
        raise TrainerError("a GRPO group needs at least one rollout")
    task_id = trajectories[0].task_id
    if any(t.task_id != task_id for t in trajectories):
        tasks = sorted({t.task_id for t in trajectories})
        raise TrainerError(f"a GRPO group mixes tasks: {', '.join(tasks)}")
    rewards: list[float | None] = []
    for t in trajectories:
        if t.status not in INFRASTRUCTURE_STATUSES and t.total_reward is None:
            raise TrainerError(
                f"episode {t.episode_id} ({t.status.value}) has no total_reward: rollouts "
                "are rewarded with scoring.rewards.apply_rewards before they are grouped"
            )
        rewards.append(None if t.status in INFRASTRUCTURE_STATUSES else t.total_reward)
    group = tuple(trajectories)
    flags = tuple(t.episode_id in discarded for t in trajectories) if discarded else ()
    if any(r is None for r in rewards):
        return Group(task_id, group, GroupFate.INFRASTRUCTURE, tuple(rewards), None, flags)
    scored = tuple(None if flags and flags[i] else r for i, r in enumerate(rewards))
    kept = [(t, r) for t, r in zip(group, scored, strict=True) if r is not None]
    if len(kept) < 2 and flags and any(flags):
        return Group(task_id, group, GroupFate.QC_DISCARDED, scored, None, flags)
    # Without gamma, one return per rollout: its total_reward (the episode advantage).
    returns = [turn_returns(t, gamma) if gamma is not None else [r] for t, r in kept]
    if not bessel_std([r[0] for r in returns]) > ZERO_STD_TOLERANCE:
        # NaN for a group of one: nothing to compare
        return Group(task_id, group, GroupFate.ZERO_VARIANCE, scored, None, flags)
    per_turn = iter(turn_advantages(returns))
    turns = tuple(None if r is None else tuple(next(per_turn)) for r in scored)
    return Group(
        task_id,
        group,
        GroupFate.TRAINED,
        scored,
        tuple(None if a is None else a[0] for a in turns),
        flags,
        turns if gamma is not None else None,
    )


@dataclass
class GroupCounts:
    """What happened to the groups of a training run so far (added to per batch)."""

    groups: int = 0
    """Groups judged."""
    trained: int = 0
    """Groups whose advantages entered the loss."""
    dropped_infrastructure: int = 0
    """Groups dropped because a rollout had an infrastructure outcome."""
    dropped_zero_variance: int = 0
    """Groups dropped because every rollout got the same reward."""
    dropped_qc: int = 0
    """Groups dropped because the online QC gate left fewer than two rollouts."""
    rollouts: int = 0
    """Rollouts generated (every episode of every group)."""
    infrastructure_rollouts: int = 0
    """Rollouts that ended in an infrastructure outcome."""
    qc_discarded_rollouts: int = 0
    """Rollouts the online QC gate discarded (in groups without an infrastructure
    outcome: those are counted there)."""

    def add(self, group: Group) -> None:
        self.groups += 1
        self.rollouts += len(group.trajectories)
        if group.fate is GroupFate.INFRASTRUCTURE:
            self.dropped_infrastructure += 1
            self.infrastructure_rollouts += sum(r is None for r in group.rewards)
            return
        self.qc_discarded_rollouts += group.n_discarded
        if group.fate is GroupFate.TRAINED:
            self.trained += 1
        elif group.fate is GroupFate.QC_DISCARDED:
            self.dropped_qc += 1
        else:
            self.dropped_zero_variance += 1

    @property
    def zero_variance_share(self) -> float:
        """Zero-variance groups among the groups that could be judged (infrastructure
        and gate drops aside); 0.0 before any."""
        judged = self.groups - self.dropped_infrastructure - self.dropped_qc
        return self.dropped_zero_variance / judged if judged else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "groups": self.groups,
            "groups_used": self.trained,
            "groups_dropped_infrastructure": self.dropped_infrastructure,
            "groups_dropped_zero_variance": self.dropped_zero_variance,
            "groups_dropped_qc": self.dropped_qc,
            "rollouts_generated": self.rollouts,
            "infrastructure_rollouts": self.infrastructure_rollouts,
            "qc_discarded_rollouts": self.qc_discarded_rollouts,
            "zero_variance_share": self.zero_variance_share,
        }


def zero_variance_warning(counts: GroupCounts, *, warn_above: float) -> str | None:
    """One sentence saying what to change when more than `warn_above` of the judged groups
    had zero reward variance; None otherwise."""
    share = counts.zero_variance_share
    if share <= warn_above:
        return None
    judged = counts.groups - counts.dropped_infrastructure - counts.dropped_qc
    return (
        f"GRPO dropped {counts.dropped_zero_variance} of {judged} groups ({share:.0%}, above "
        f"the {warn_above:.0%} of EPIFLOW_TRAINING_ZERO_VARIANCE_WARN_SHARE) because every "
        "rollout got the same reward: their generation was wasted. Give the groups both "
        "outcomes: more rollouts per task (EPIFLOW_TRAINING_ROLLOUTS_PER_TASK, seed 4-8), a "
        "higher temperature (EPIFLOW_TRAINING_TEMPERATURE), tasks the model solves 30-70 % "
        "of the time (EPIFLOW_TRAINING_TASK_SAMPLING=success_variance draws those most), or "
        "start from an SFT checkpoint that already succeeds now and then."
    )
