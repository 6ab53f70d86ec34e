"""Quality score and the training trigger decision (pure; the flow wires SQL and Prefect).

    quality = clip(rubric_mean / 5 × multiplier[verdict], 0, 1)

with multipliers keep 1.0, downweight 0.5, discard 0.0 by default (`QualitySettings`).
The rubric mean is the rule judge's (or a parsed LLM judgement's) mean over the five
dimensions, so a fabricated claim (reliability −3) or a failed task (completion 0) lowers
the weight even when the gate keeps the episode as a negative sample.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from scoring.rubric import MAX_SCORE
from scoring.settings import QualitySettings

__all__ = [
    "Verdict",
    "quality_score",
    "quality_weighted_volume",
    "should_trigger_training",
    "verdict_multiplier",
]


class Verdict(StrEnum):
    """What the gate decides for one episode (seed 000 §3.3)."""

    KEEP = "keep"
    DOWNWEIGHT = "downweight"
    DISCARD = "discard"


def verdict_multiplier(verdict: Verdict, settings: QualitySettings) -> float:
    """The weight multiplier of a verdict."""
    return {
        Verdict.KEEP: settings.keep_multiplier,
        Verdict.DOWNWEIGHT: settings.downweight_multiplier,
        Verdict.DISCARD: settings.discard_multiplier,
    }[verdict]


def quality_score(rubric_mean: float, verdict: Verdict, settings: QualitySettings) -> float:
    """Quality in [0, 1] from a rubric mean (0–5) and the gate's verdict."""
    q = (rubric_mean / MAX_SCORE) * verdict_multiplier(verdict, settings)
    return min(1.0, max(0.0, q))


def quality_weighted_volume(qualities: Iterable[float]) -> float:
    """Sum of quality scores: how many "full-quality episodes" a batch is worth."""
    return float(sum(qualities))


def should_trigger_training(
    weighted_volume_since_last: float,
    threshold: float,
    *,
    batch_passed: bool,
    already_triggered_for_this_run: bool,
) -> bool:
    """Trigger the train deployment iff the batch passed, the volume crossed the threshold,
    and this collection run has not triggered it before (re-running the gate is a no-op)."""
    return (
        batch_passed
        and not already_triggered_for_this_run
        and weighted_volume_since_last >= threshold
    )
