"""What training logs say beyond the loss: GRPO groups with zero reward variance."""

from __future__ import annotations

from training.diagnostics import training_warnings, zero_reward_variance_warning


def test_grpo_groups_without_reward_variance_are_flagged_with_what_to_change():
    logs = [{"loss": 0.0, "frac_reward_zero_std": 1.0, "grad_norm": 0.0}] * 3 + [
        {"train_runtime": 9.0}
    ]
    warning = zero_reward_variance_warning(logs)
    assert warning is not None
    assert "100%" in warning and "3 logged steps" in warning
    assert "ROLLOUTS_PER_TASK" in warning and "TEMPERATURE" in warning
    assert training_warnings(logs) == [warning]


def test_groups_with_both_outcomes_or_other_algorithms_are_not_flagged():
    assert zero_reward_variance_warning([{"frac_reward_zero_std": 0.5}] * 4) is None
    assert training_warnings([{"loss": 1.2}, {"loss": 0.8}]) == []
    assert training_warnings([]) == []
