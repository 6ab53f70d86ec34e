"""Quality score formula and the training trigger decision."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scoring.quality import Verdict, quality_score, quality_weighted_volume, should_trigger_training
from scoring.settings import QualitySettings


@pytest.mark.parametrize(
    ("mean", "verdict", "expected"),
    [
        (5.0, Verdict.KEEP, 1.0),
        (4.0, Verdict.KEEP, 0.8),
        (4.0, Verdict.DOWNWEIGHT, 0.4),
        (5.0, Verdict.DISCARD, 0.0),
    ],
)
def test_quality_is_rubric_mean_over_five_times_multiplier(
    quality_settings: QualitySettings, mean: float, verdict: Verdict, expected: float
) -> None:
    assert quality_score(mean, verdict, quality_settings) == pytest.approx(expected)


def test_multipliers_must_be_ordered() -> None:
    with pytest.raises(ValidationError):
        QualitySettings(downweight_multiplier=0.9, keep_multiplier=0.5)


def test_trigger_truth_table() -> None:
    assert should_trigger_training(
        10.0, 10.0, batch_passed=True, already_triggered_for_this_run=False
    )
    assert not should_trigger_training(
        9.9, 10.0, batch_passed=True, already_triggered_for_this_run=False
    )
    assert not should_trigger_training(
        50.0, 10.0, batch_passed=False, already_triggered_for_this_run=False
    )
    assert not should_trigger_training(
        50.0, 10.0, batch_passed=True, already_triggered_for_this_run=True
    )


def test_trigger_fires_once_across_gate_reruns() -> None:
    """Re-running the gate on the same run sees its own earlier trigger and does nothing."""
    triggered_runs: set[str] = set()
    fired = 0
    for _ in range(3):
        volume = quality_weighted_volume([1.0, 0.5, 0.0] * 10)
        if should_trigger_training(
            volume,
            12.0,
            batch_passed=True,
            already_triggered_for_this_run="run-1" in triggered_runs,
        ):
            fired += 1
            triggered_runs.add("run-1")
    assert fired == 1
