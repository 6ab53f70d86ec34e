"""Per-turn discounted returns for agentic GRPO (opt-in): returns, advantages, groups."""

from __future__ import annotations

import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from tests.training.factory import call_step, episode, final_step
from training.errors import TrainerError
from training.groups import GroupFate, group_advantages, judge_group
from training.returns import (
    ADVANTAGE_EPSILON,
    bessel_std,
    token_advantages,
    turn_advantages,
    turn_returns,
    turn_rewards,
)
from training.rollout_tokens import TokenRollout
from training.settings import TrainingSettings

NO_SHAPING = RewardSettings(
    format_ok_reward=0.0, format_error_penalty=0.0, repeated_call_penalty=0.0, new_path_reward=0.0
)


def _rollout(
    rollout: int, *, success: bool, calls: int = 1, rewards: RewardSettings = NO_SHAPING
) -> Trajectory:
    steps = [call_step(i, f"cat part{i}.csv") for i in range(calls)]
    t = episode(rollout=rollout, success=success, steps=[*steps, final_step(calls)])
    return apply_rewards(t, rewards)


def test_turn_rewards_sum_to_the_stored_total_and_the_final_reward_is_the_last_turns() -> None:
    t = _rollout(0, success=True, calls=2, rewards=RewardSettings())
    rewards = turn_rewards(t)
    assert len(rewards) == t.n_steps == 3
    assert rewards[:2] == [s.immediate_reward for s in t.steps[:2]]
    assert rewards[2] == t.steps[2].immediate_reward + (t.final_reward or 0.0)
    assert sum(rewards) == pytest.approx(t.total_reward)
    assert any(s.immediate_reward != 0 for s in t.steps)  # the default shaping is there


def test_returns_are_the_discounted_reward_to_go() -> None:
    t = _rollout(0, success=True, calls=2, rewards=RewardSettings())
    r = turn_rewards(t)
    returns = turn_returns(t, 0.5)
    assert returns[2] == pytest.approx(r[2])
    assert returns[1] == pytest.approx(r[1] + 0.5 * r[2])
    assert returns[0] == pytest.approx(r[0] + 0.5 * r[1] + 0.25 * r[2])
    # γ = 1: every turn's return is what is left of the episode's reward
    undiscounted = turn_returns(t, 1.0)
    assert undiscounted[0] == pytest.approx(t.total_reward)
    assert undiscounted == pytest.approx([sum(r[k:]) for k in range(3)])


def test_an_unrewarded_episode_has_no_returns() -> None:
    t = episode(success=True)  # never went through apply_rewards
    with pytest.raises(TrainerError, match="no final reward"):
        turn_returns(t, 0.99)


def test_turn_advantages_normalise_by_the_start_returns() -> None:
    returns = [[1.0, 2.0, 0.5], [0.0], [-1.0, 3.0]]
    starts = [1.0, 0.0, -1.0]
    mean, scale = 0.0, bessel_std(starts) + ADVANTAGE_EPSILON
    assert turn_advantages(returns) == [[(g - mean) / scale for g in r] for r in returns]
    assert [a[0] for a in turn_advantages([[r] for r in starts])] == group_advantages(starts)
    with pytest.raises(TrainerError):
        turn_advantages([[1.0], []])


def test_gamma_one_without_step_rewards_is_the_episode_advantage_exactly() -> None:
    rollouts = [_rollout(i, success=i % 2 == 0, calls=1 + i) for i in range(4)]
    episodic = judge_group(rollouts)
    per_turn = judge_group(rollouts, gamma=1.0)
    assert per_turn.fate is episodic.fate is GroupFate.TRAINED
    assert per_turn.advantages == episodic.advantages  # bit for bit
    assert episodic.turn_advantages is None
    assert per_turn.turn_advantages is not None
    assert episodic.advantages is not None
    for t, a, turns in zip(rollouts, episodic.advantages, per_turn.turn_advantages, strict=True):
        assert turns == (a,) * t.n_steps  # every turn gets the episode's advantage


def test_a_shorter_success_beats_a_longer_one_under_discounting() -> None:
    short, long = _rollout(0, success=True, calls=1), _rollout(1, success=True, calls=4)
    failure = _rollout(2, success=False, calls=2)
    assert short.total_reward == long.total_reward
    episodic = judge_group([short, long, failure])
    assert episodic.advantages is not None
    assert episodic.advantages[0] == episodic.advantages[1]  # no difference today
    discounted = judge_group([short, long, failure], gamma=0.95)
    assert discounted.advantages is not None and discounted.turn_advantages is not None
    a_short, a_long, a_fail = discounted.advantages
    assert a_short is not None and a_long is not None and a_fail is not None
    assert a_short > a_long > 0 > a_fail
    long_turns = discounted.turn_advantages[1]
    assert long_turns is not None and list(long_turns) == sorted(long_turns)  # credit grows
    assert long_turns[0] == a_long  # the stored advantage is the first turn's


def test_zero_variance_is_judged_on_the_start_returns() -> None:
    both = [_rollout(0, success=True, calls=1), _rollout(1, success=True, calls=3)]
    assert judge_group(both).fate is GroupFate.ZERO_VARIANCE
    assert judge_group(both, gamma=1.0).fate is GroupFate.ZERO_VARIANCE
    assert judge_group(both, gamma=0.9).fate is GroupFate.TRAINED  # lengths differ
    same = [_rollout(i, success=True, calls=2) for i in range(3)]
    dropped = judge_group(same, gamma=0.9)
    assert dropped.fate is GroupFate.ZERO_VARIANCE
    assert dropped.advantages is None and dropped.turn_advantages is None


def test_fates_are_unchanged_by_returns() -> None:
    infra = episode(rollout=2, success=False, steps=[])
    infra.status, infra.failure_category = EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR
    rollouts = [_rollout(0, success=True), _rollout(1, success=False)]
    group = judge_group([*rollouts, apply_rewards(infra, NO_SHAPING)], gamma=0.95)
    assert group.fate is GroupFate.INFRASTRUCTURE and group.turn_advantages is None

    three = [_rollout(i, success=i == 0, calls=1 + i) for i in range(3)]
    gated = judge_group(three, discarded={three[1].episode_id}, gamma=0.95)
    assert gated.fate is GroupFate.TRAINED and gated.turn_advantages is not None
    assert gated.turn_advantages[1] is None and gated.advantages is not None
    assert gated.advantages[1] is None
    kept = [turn_returns(three[0], 0.95), turn_returns(three[2], 0.95)]
    expected = turn_advantages(kept)  # the discarded rollout is out of the baseline
    assert [gated.turn_advantages[0], gated.turn_advantages[2]] == [tuple(a) for a in expected]
    lonely = judge_group(three, discarded={three[1].episode_id, three[2].episode_id}, gamma=0.95)
    assert lonely.fate is GroupFate.QC_DISCARDED


def test_each_token_gets_its_turns_advantage() -> None:
    rollout = TokenRollout(
        episode_id="e",
        prompt_ids=[1],
        completion_ids=[10, 11, 50, 12, 51, 52, 13],
        env_mask=[1, 1, 0, 1, 0, 0, 1],
        logprobs=[-1.0, -1.0, 0.0, -1.0, 0.0, 0.0, -1.0],
        turn_index=[0, 0, 0, 1, 1, 1, 2],
    )
    assert token_advantages(rollout, [0.3, 0.2, 0.1]) == [0.3, 0.3, 0.3, 0.2, 0.2, 0.2, 0.1]
    with pytest.raises(TrainerError, match="3 turns but 2"):
        token_advantages(rollout, [0.3, 0.2])


def test_returns_gamma_is_off_by_default_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainingSettings().returns_gamma is None
    assert TrainingSettings(returns_gamma=1.0).returns_gamma == 1.0
    monkeypatch.setenv("EPIFLOW_TRAINING_RETURNS_GAMMA", "0.97")
    assert TrainingSettings().returns_gamma == 0.97
    for bad in ("0", "1.5", "-0.9", "nan"):
        monkeypatch.setenv("EPIFLOW_TRAINING_RETURNS_GAMMA", bad)
        with pytest.raises(ValueError, match="EPIFLOW_TRAINING_RETURNS_GAMMA must be in"):
            TrainingSettings()
