"""Rewards: hand-computed shaping, final rewards, discounted returns, settings validation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent.settings import SuccessSettings
from scoring.rewards import (
    apply_rewards,
    compute_rewards,
    discounted_returns,
    final_reward,
    immediate_rewards,
)
from scoring.settings import RewardSettings
from tests.scoring.qc_builders import (
    call,
    final,
    list_step,
    oracle,
    parse_error,
    read_step,
    trajectory,
    write_step,
)


def test_oracle_rewards_returns_and_total_by_hand(reward_settings: RewardSettings) -> None:
    # 3 successful calls on new targets: +0.01 format +0.01 new path each; the final: +0.01.
    t = apply_rewards(oracle(), reward_settings)
    assert [s.immediate_reward for s in t.steps] == pytest.approx([0.02, 0.02, 0.02, 0.01])
    assert t.final_reward == 1.0
    # G3 = 0.01 + 1.0; G2 = 0.02 + 0.99*G3; G1 = 0.02 + 0.99*G2; G0 = 0.02 + 0.99*G1
    g3 = 1.01
    g2 = 0.02 + 0.99 * g3
    g1 = 0.02 + 0.99 * g2
    g0 = 0.02 + 0.99 * g1
    assert [s.return_ for s in t.steps] == pytest.approx([g0, g1, g2, g3])
    assert t.total_reward == pytest.approx(1.07)
    dumped = t.steps[0].model_dump(by_alias=True)
    assert dumped["return"] == pytest.approx(g0)


def test_format_error_repeat_and_failed_call_shaping(reward_settings: RewardSettings) -> None:
    steps = [
        list_step(0),  # +0.01 format, +0.01 new path
        parse_error(1, "unclosed <tool_call>"),  # -0.03
        list_step(2),  # +0.01 format, -0.02 repeated, no new path: -0.01
        call(
            3, "read_file", {"path": "nope.csv"}, exit_code=1, error_type="not_found"
        ),  # failed: format only
        final(4),
    ]
    assert immediate_rewards(trajectory(steps), reward_settings) == pytest.approx(
        [0.02, -0.03, -0.01, 0.01, 0.01]
    )


def test_retry_after_injected_fault_or_after_a_write_is_not_a_repeat(
    reward_settings: RewardSettings,
) -> None:
    faulty = call(
        0,
        "read_file",
        {"path": "data/sales.csv"},
        exit_code=None,
        error_type="permission_denied",
        fault="permission_denied",
    )
    steps = [faulty, read_step(1), list_step(2), write_step(3), list_step(4), final(5)]
    rewards = immediate_rewards(trajectory(steps), reward_settings)
    # step 1 retries a faulted call (no penalty, and its target is new because the first try failed);
    # step 4 repeats the listing after a write changed the workspace (no penalty, target already seen).
    assert rewards == pytest.approx([0.01, 0.02, 0.02, 0.02, 0.01, 0.01])


def test_rewriting_the_same_file_identically_is_a_repeat(reward_settings: RewardSettings) -> None:
    # The first write's own change does not count as "something changed in between".
    steps = [list_step(0), read_step(1), write_step(2), write_step(3), final(4)]
    assert immediate_rewards(trajectory(steps), reward_settings)[3] == pytest.approx(0.01 - 0.02)


def test_shaping_is_clipped_per_step() -> None:
    s = RewardSettings(format_ok_reward=0.05, new_path_reward=0.05, max_step_fraction=0.05)
    assert immediate_rewards(oracle(), s)[0] == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("score", "expected"),
    [(1.0, 1.0), (None, -0.5), (0.0, -0.5), (0.5, 0.25), (1 / 3, 0.0), (0.9, 0.85)],
)
def test_final_reward_interpolates_between_failure_and_success(
    reward_settings: RewardSettings, score: float | None, expected: float
) -> None:
    assert final_reward(score, reward_settings) == pytest.approx(expected)


def test_failure_reward_and_success_threshold_are_configurable() -> None:
    s = RewardSettings(failure_reward=-1.0, success=SuccessSettings(threshold=0.8))
    assert final_reward(0.0, s) == -1.0
    assert final_reward(0.8, s) == 1.0
    assert final_reward(0.5, s) == pytest.approx(0.0)


def test_discounted_returns_by_hand() -> None:
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx(
        [1.0 + 0.5 * (0.0 + 0.5 * 2.0), 1.0, 2.0]
    )
    assert discounted_returns([], 0.9) == []


def test_gamma_changes_returns() -> None:
    t = oracle()
    g_hi = compute_rewards(t, RewardSettings(gamma=0.99)).returns[0]
    g_lo = compute_rewards(t, RewardSettings(gamma=0.5)).returns[0]
    assert g_lo == pytest.approx(0.02 + 0.5 * (0.02 + 0.5 * (0.02 + 0.5 * 1.01)))
    assert g_hi > g_lo


def test_episode_without_steps_gets_only_the_final_reward(reward_settings: RewardSettings) -> None:
    b = compute_rewards(trajectory([], score=None), reward_settings)
    assert (b.immediate, b.returns, b.final, b.total) == ([], [], -0.5, -0.5)


def test_apply_rewards_does_not_mutate_its_input(reward_settings: RewardSettings) -> None:
    t = oracle()
    apply_rewards(t, reward_settings)
    assert t.final_reward is None and all(s.immediate_reward == 0.0 for s in t.steps)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"format_ok_reward": 0.2},  # 20% of the scale
        {"repeated_call_penalty": -0.001},  # below 1%
        {"format_error_penalty": 0.03},  # wrong sign
        {"gamma": 0.0},
        {"success_reward": -1.0},
        {"failure_reward": 2.0},
    ],
)
def test_settings_reject_out_of_scale_or_inconsistent_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RewardSettings(**kwargs)


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_SCORING_GAMMA", "0.9")
    monkeypatch.setenv("EPIFLOW_SCORING_FAILURE_REWARD", "-1")
    s = RewardSettings()
    assert (s.gamma, s.failure_reward) == (0.9, -1.0)
