"""Whether a challenger checkpoint replaces the champion: a paired test on the same tasks.

Pure: the two checkpoints' evaluation episodes in, a `PromotionDecision` out (no SQL, no
Prefect). The rule (seed 000 §4.5: promote what is better, never what regressed):

1. **Pairs.** Episodes are paired by task (`task_id`): both checkpoints ran the same
   held-out instances. A pair where either episode ended in an infrastructure outcome
   (`agent.trajectory.INFRASTRUCTURE_STATUSES`) is left out: it says nothing about the
   model. Fewer than `min_pairs` usable pairs: no promotion ("not enough evidence").
2. **Better overall, beyond noise.** The challenger's completion rate must exceed the
   champion's by at least `margin`, and an exact one-sided sign test (McNemar's exact
   test) on the discordant pairs — b tasks only the challenger solved, c only the
   champion — must give p = P(X ≥ b | X ~ Binomial(b + c, ½)) ≤ `alpha`.
3. **No template regresses** by more than `template_tolerance` (completion rate, per
   template, over that template's pairs).
4. **Tool failures do not rise** by more than `tool_failure_tolerance` (the shared
   `evaluation_metrics` definition).

Every figure is kept in the decision (`evidence`), which `training.aliases` stores with
the alias change, or with the refusal.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus, Trajectory
from training.evaluation import evaluation_metrics

__all__ = ["PromotionDecision", "PromotionRule", "decide_promotion", "sign_test_p"]


class PromotionRule(BaseModel):
    """The thresholds of a promotion (every field a flow or CLI parameter)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    margin: float = Field(default=0.05, ge=0.0, le=1.0)
    """Least gain in completion rate over the champion (absolute)."""
    alpha: float = Field(default=0.1, gt=0.0, le=1.0)
    """Largest one-sided p-value of the paired sign test on discordant tasks."""
    template_tolerance: float = Field(default=0.25, ge=0.0, le=1.0)
    """Largest drop in any template's completion rate."""
    tool_failure_tolerance: float = Field(default=0.05, ge=0.0, le=1.0)
    """Largest rise in the tool-failure rate."""
    min_pairs: int = Field(default=8, ge=1)
    """Fewest usable task pairs (both episodes free of infrastructure outcomes)."""


class PromotionDecision(BaseModel):
    """The outcome, with the figures that decided it."""

    promote: bool
    """Whether the challenger replaces the champion."""
    reason: str
    """One line: the rule's verdict and its figures."""
    evidence: dict[str, Any]
    """Every figure compared (rates, discordant counts, p-value, per-template deltas)."""


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(X ≥ wins) for X ~ Binomial(wins + losses, ½); 1.0
    when there is no discordant pair."""
    n = wins + losses
    if n == 0:
        return 1.0
    return float(sum(math.comb(n, k) for k in range(wins, n + 1))) / float(2**n)


def _solved(t: Trajectory) -> bool:
    return t.status == EpisodeStatus.SUCCESS


def decide_promotion(
    challenger: Sequence[Trajectory],
    champion: Sequence[Trajectory],
    rule: PromotionRule | None = None,
) -> PromotionDecision:
    """Decide whether `challenger` (its evaluation episodes) replaces `champion` (its
    episodes on the same tasks) under `rule` (defaults: `PromotionRule()`)."""
    rule = rule or PromotionRule()
    theirs = {t.task_id: t for t in champion}
    pairs = [
        (mine, theirs[mine.task_id])
        for mine in challenger
        if mine.task_id in theirs
        and mine.status not in INFRASTRUCTURE_STATUSES
        and theirs[mine.task_id].status not in INFRASTRUCTURE_STATUSES
    ]
    left_out = len(challenger) - len(pairs)
    evidence: dict[str, Any] = {
        "pairs": len(pairs),
        "left_out": left_out,
        "rule": rule.model_dump(),
    }
    if len(pairs) < rule.min_pairs:
        return PromotionDecision(
            promote=False,
            reason=f"not enough evidence: {len(pairs)} usable task pairs, {rule.min_pairs} needed "
            f"({left_out} left out: unpaired or infrastructure outcomes)",
            evidence=evidence,
        )
    wins = sum(_solved(a) and not _solved(b) for a, b in pairs)
    losses = sum(_solved(b) and not _solved(a) for a, b in pairs)
    mine_rate = sum(_solved(a) for a, _ in pairs) / len(pairs)
    their_rate = sum(_solved(b) for _, b in pairs) / len(pairs)
    p = sign_test_p(wins, losses)
    by_template: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for a, b in pairs:
        by_template[a.template].append((_solved(a), _solved(b)))
    template_delta = {
        name: (sum(x for x, _ in rows) - sum(y for _, y in rows)) / len(rows)
        for name, rows in sorted(by_template.items())
    }
    mine_fail = evaluation_metrics([a for a, _ in pairs]).tool_failure_rate
    their_fail = evaluation_metrics([b for _, b in pairs]).tool_failure_rate
    evidence.update(
        challenger_completion=round(mine_rate, 4),
        champion_completion=round(their_rate, 4),
        gain=round(mine_rate - their_rate, 4),
        discordant_wins=wins,
        discordant_losses=losses,
        p_value=round(p, 6),
        template_delta={k: round(v, 4) for k, v in template_delta.items()},
        challenger_tool_failure_rate=round(mine_fail, 4),
        champion_tool_failure_rate=round(their_fail, 4),
    )
    figures = (
        f"completion {mine_rate:.3f} vs {their_rate:.3f} on {len(pairs)} tasks "
        f"(+{wins}/-{losses} discordant, p={p:.3g})"
    )
    refusals = []
    if mine_rate - their_rate < rule.margin:
        refusals.append(f"gain {mine_rate - their_rate:+.3f} below the margin {rule.margin}")
    if p > rule.alpha:
        refusals.append(f"p={p:.3g} above alpha {rule.alpha} (could be noise)")
    regressed = {k: v for k, v in template_delta.items() if v < -rule.template_tolerance}
    if regressed:
        refusals.append(
            "templates regressed beyond "
            f"{rule.template_tolerance}: "
            + ", ".join(f"{k} {v:+.2f}" for k, v in regressed.items())
        )
    if mine_fail - their_fail > rule.tool_failure_tolerance:
        refusals.append(
            f"tool failures rose {mine_fail - their_fail:+.3f} "
            f"(tolerance {rule.tool_failure_tolerance})"
        )
    if refusals:
        return PromotionDecision(
            promote=False,
            reason=f"kept the champion: {'; '.join(refusals)}; {figures}",
            evidence=evidence,
        )
    return PromotionDecision(promote=True, reason=f"promoted: {figures}", evidence=evidence)
