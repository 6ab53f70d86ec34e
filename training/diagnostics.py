"""What a finished training run's logs say about it that its loss does not.

Pure functions over TRL's `state.log_history` (a list of dicts, one per log event), so
they are tested without a trainer. Each finding is one sentence saying what happened and
what to change; `train_with` logs them as WARNING and keeps them on `TrainResult.warnings`,
and the train flow's artifact lists them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ZERO_STD_WARN_AT", "training_warnings", "zero_reward_variance_warning"]

ZERO_STD_WARN_AT = 0.9
"""Mean share of GRPO groups with zero reward variance at or above which a run is flagged:
such groups have zero advantages, so they teach nothing."""


def zero_reward_variance_warning(log_history: Iterable[Mapping[str, object]]) -> str | None:
    """A warning when GRPO's groups mostly had the same reward for every rollout.

    GRPO's advantage is each rollout's reward minus its group's mean: a group whose
    rollouts all succeed or all fail contributes nothing (TRL logs the share of such
    groups as `frac_reward_zero_std`). None when the logs have no such metric or the mean
    share is below `ZERO_STD_WARN_AT`.
    """
    shares = [
        float(v)
        for entry in log_history
        if isinstance(v := entry.get("frac_reward_zero_std"), int | float)
    ]
    if not shares:
        return None
    mean = sum(shares) / len(shares)
    if mean < ZERO_STD_WARN_AT:
        return None
    return (
        f"GRPO learned (almost) nothing: {mean:.0%} of the groups had the same reward for "
        f"every rollout (frac_reward_zero_std over {len(shares)} logged steps), so their "
        "advantages were 0. Give the groups both outcomes: more rollouts per task "
        "(EPIFLOW_TRAINING_ROLLOUTS_PER_TASK), a higher temperature "
        "(EPIFLOW_TRAINING_TEMPERATURE), tasks the model solves sometimes (a curriculum "
        "band), or start from an SFT checkpoint that already succeeds now and then."
    )


def training_warnings(log_history: Iterable[Mapping[str, object]]) -> list[str]:
    """Every finding about a run, in a stable order (empty when there is none)."""
    history = list(log_history)
    found = [zero_reward_variance_warning(history)]
    return [w for w in found if w is not None]
