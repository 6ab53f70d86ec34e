"""GRPO groups of whole episodes: advantages as TRL computes them, drops counted."""

from __future__ import annotations

import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from tests.training.factory import episode
from training.errors import TrainerError
from training.groups import (
    GroupCounts,
    GroupFate,
    group_advantages,
    judge_group,
    zero_variance_warning,
)


def _rollout(rollout: int, *, success: bool, task: int = 0) -> Trajectory:
    return apply_rewards(episode(task=task, rollout=rollout, success=success), RewardSettings())


def _infra(rollout: int, status: EpisodeStatus = EpisodeStatus.ENV_ERROR) -> Trajectory:
    t = episode(rollout=rollout, success=False)
    t.status, t.failure_category = status, FailureCategory(status.value)
    return apply_rewards(t, RewardSettings())


def test_advantages_are_trls_group_normalisation() -> None:
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rewards = [1.2, -0.4, 0.3, 1.2]
    t = torch.tensor(rewards)
    expected = (t - t.mean()) / (nanstd(t) + 1e-4)
    assert group_advantages(rewards) == pytest.approx(expected.tolist(), abs=1e-5)


def test_a_mixed_group_is_trained_on_its_stored_rewards() -> None:
    group = judge_group([_rollout(i, success=i % 2 == 0) for i in range(4)])
    assert group.fate is GroupFate.TRAINED and group.trained
    stored = [t.total_reward for t in group.trajectories]  # what storage writes
    assert list(group.rewards) == stored
    assert group.advantages is not None
    assert group.advantages == pytest.approx(group_advantages([r or 0.0 for r in stored]))
    first, second = group.advantages[0], group.advantages[1]
    assert first is not None and second is not None and first > 0 > second


@pytest.mark.parametrize(
    "status",
    [EpisodeStatus.ENV_ERROR, EpisodeStatus.STORAGE_ERROR, EpisodeStatus.ENDPOINT_ERROR],
)
def test_an_infrastructure_outcome_drops_the_whole_group(status: EpisodeStatus) -> None:
    group = judge_group([_rollout(0, success=True), _rollout(1, success=False), _infra(2, status)])
    assert group.fate is GroupFate.INFRASTRUCTURE
    assert group.advantages is None
    assert group.rewards[2] is None


def test_equal_rewards_drop_the_group_as_zero_variance() -> None:
    for success in (True, False):
        group = judge_group([_rollout(i, success=success) for i in range(4)])
        assert group.fate is GroupFate.ZERO_VARIANCE and group.advantages is None


def test_groups_are_one_task_and_rewarded() -> None:
    with pytest.raises(TrainerError, match="mixes tasks"):
        judge_group([_rollout(0, success=True), _rollout(1, success=False, task=1)])
    with pytest.raises(TrainerError, match="has no total_reward"):
        judge_group([episode(rollout=0), episode(rollout=1)])  # never rewarded
    with pytest.raises(TrainerError, match="at least one rollout"):
        judge_group([])


def test_counts_and_the_zero_variance_warning() -> None:
    counts = GroupCounts()
    counts.add(judge_group([_rollout(i, success=i == 0) for i in range(4)]))
    counts.add(judge_group([_rollout(0, success=True), _infra(1)]))
    counts.add(judge_group([_rollout(i, success=False) for i in range(4)]))
    assert counts.as_dict() == {
        "groups": 3,
        "groups_used": 1,
        "groups_dropped_infrastructure": 1,
        "groups_dropped_zero_variance": 1,
        "groups_dropped_qc": 0,
        "rollouts_generated": 10,
        "infrastructure_rollouts": 1,
        "qc_discarded_rollouts": 0,
        "zero_variance_share": 0.5,  # of the two groups that could be judged
    }
    assert zero_variance_warning(counts, warn_above=0.5) is None
    warning = zero_variance_warning(counts, warn_above=0.4)
    assert warning is not None
    assert "1 of 2 groups (50%" in warning
    assert "EPIFLOW_TRAINING_ROLLOUTS_PER_TASK" in warning
    assert "EPIFLOW_TRAINING_TEMPERATURE" in warning
    assert zero_variance_warning(GroupCounts(), warn_above=0.0) is None


def test_a_discarded_rollout_leaves_the_group_rejudged_without_it() -> None:
    """The gate's discard takes the episode out of the group's baseline, as TRL does with a
    None reward (nanmean, nanstd): the advantages of the rest are TRL's over the rest."""
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rollouts = [_rollout(i, success=i in (0, 3)) for i in range(4)]
    group = judge_group(rollouts, discarded={rollouts[3].episode_id})
    assert group.fate is GroupFate.TRAINED and group.n_discarded == 1
    assert group.discarded == (False, False, False, True)
    assert not group.admitted(3) and group.admitted(0)
    assert group.rewards[3] is None and group.advantages is not None
    assert group.advantages[3] is None
    kept = [r for r in group.rewards if r is not None]
    assert group.advantages[:3] == pytest.approx(group_advantages(kept))
    t = torch.tensor([r if r is not None else float("nan") for r in group.rewards])
    trl = torch.nan_to_num((t - t.nanmean()) / (nanstd(t) + 1e-4), nan=0.0)
    assert [a or 0.0 for a in group.advantages] == pytest.approx(trl.tolist(), abs=1e-5)

    # Variance among the admitted only: the discarded success does not make a group.
    flat = [_rollout(i, success=i == 0) for i in range(3)]
    assert judge_group(flat, discarded={flat[0].episode_id}).fate is GroupFate.ZERO_VARIANCE


def test_a_group_left_with_one_admitted_rollout_is_dropped_and_counted() -> None:
    rollouts = [_rollout(i, success=i == 0) for i in range(3)]
    group = judge_group(rollouts, discarded={rollouts[1].episode_id, rollouts[2].episode_id})
    assert group.fate is GroupFate.QC_DISCARDED and group.advantages is None
    infra = [_rollout(0, success=True), _infra(1)]
    counts = GroupCounts()
    counts.add(group)
    counts.add(judge_group(infra, discarded={infra[1].episode_id}))  # the infra drop wins
    trained = [_rollout(i, success=i % 2 == 0) for i in range(3)]
    counts.add(judge_group(trained, discarded={trained[2].episode_id}))
    assert (counts.dropped_qc, counts.dropped_infrastructure, counts.trained) == (1, 1, 1)
    assert counts.qc_discarded_rollouts == 3 and counts.infrastructure_rollouts == 1
    assert counts.zero_variance_share == 0.0  # the gate's and infrastructure drops aside
