"""Production watch on an alias's champion (issue 45 item 4, the tool-failure rule): a
window of production trajectories (imported ATIF / OpenAI / Harbor traces, or episodes
collected against the serving endpoint) against the champion's evaluation baseline.

- **Baseline.** The champion checkpoint's stored evaluation (`checkpoint.evaluation`, the
  evaluate flow's `tool_failure_rate`). A champion never evaluated has no baseline: no
  verdict either way.
- **Infrastructure is not the model.** Episodes that ended in an infrastructure outcome
  (`INFRASTRUCTURE_STATUSES`) are left out (`training.evaluation.evaluation_metrics`); a
  window with fewer than `MonitorRule.min_episodes` of the model's own episodes raises
  nothing, so a window of only infrastructure failures is never a breach.
- **Breach.** The window's tool-failure rate above the baseline by more than
  `MonitorRule.tool_failure_tolerance`. With `rollback`, the alias goes back to its
  previous champion (`training.aliases.rollback_alias`: one `model_alias_change` row whose
  evidence is the breach's figures); the breach is also appended to the champion's stored
  evaluation (`monitor_breaches`), so it stays with the checkpoint that regressed.

Not wired yet: a Prefect flow, a notification and `epiflow models monitor`; GX suites over
the other thresholds (completion, average steps, parse errors, infrastructure share).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine

from agent.trajectory import Trajectory
from storage.objects import ObjectStore
from training.aliases import alias_target, rollback_alias
from training.evaluation import evaluation_metrics
from training.registry import get_checkpoint, record_evaluation

__all__ = ["MonitorRule", "MonitorVerdict", "judge_window", "watch_alias"]


class MonitorRule(BaseModel):
    """The thresholds of the production watch."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tool_failure_tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    """Largest rise of the tool-failure rate over the champion's baseline."""
    min_episodes: int = Field(default=5, ge=1)
    """Fewest episodes of the model's own (infrastructure outcomes left out) to judge."""


class MonitorVerdict(BaseModel):
    """What the watch found in one window."""

    breach: bool
    """Whether the window regressed beyond the rule."""
    reason: str
    """One line: the verdict and its figures."""
    figures: dict[str, Any]
    """Window and baseline rates, counts, the rule."""
    rolled_back_to: str | None = None
    """The policy the alias points at after a rollback, if one was made."""


def judge_window(
    window: Sequence[Trajectory], baseline_tool_failure_rate: float, rule: MonitorRule
) -> MonitorVerdict:
    """The window's tool-failure rate against the baseline (pure)."""
    metrics = evaluation_metrics(list(window))
    figures: dict[str, Any] = {
        "window_episodes": metrics.n_episodes,
        "window_infrastructure": metrics.n_infrastructure,
        "window_tool_failure_rate": round(metrics.tool_failure_rate, 4),
        "baseline_tool_failure_rate": round(baseline_tool_failure_rate, 4),
        "rule": rule.model_dump(),
    }
    if metrics.n_episodes < rule.min_episodes:
        return MonitorVerdict(
            breach=False,
            reason=f"no verdict: {metrics.n_episodes} episodes of the model's own "
            f"({metrics.n_infrastructure} infrastructure outcomes left out), "
            f"{rule.min_episodes} needed",
            figures=figures,
        )
    rise = metrics.tool_failure_rate - baseline_tool_failure_rate
    figures["rise"] = round(rise, 4)
    line = (
        f"tool failures {metrics.tool_failure_rate:.3f} vs the baseline "
        f"{baseline_tool_failure_rate:.3f} on {metrics.n_episodes} episodes"
    )
    if rise > rule.tool_failure_tolerance:
        return MonitorVerdict(
            breach=True,
            reason=f"breach: {line} (rise {rise:+.3f} > {rule.tool_failure_tolerance})",
            figures=figures,
        )
    return MonitorVerdict(breach=False, reason=f"within the rule: {line}", figures=figures)


def watch_alias(
    engine: Engine,
    store: ObjectStore,
    alias: str,
    window: Sequence[Trajectory],
    *,
    rule: MonitorRule,
    actor: str,
    rollback: bool,
) -> MonitorVerdict:
    """Judge `window` against `alias`'s champion's baseline; on a breach, store it with the
    champion's evaluation and, with `rollback`, point the alias back at its previous
    champion.

    Raises:
        RegistryError: the alias is unset or names no checkpoint; a rollback with no
            earlier checkpoint, or one that raced another change (`AliasConflict`).
    """
    from training.errors import RegistryError

    champion = alias_target(engine, alias)
    if champion is None or champion.checkpoint_id is None:
        raise RegistryError(f"alias {alias!r} names no checkpoint to watch", setting="ALIAS")
    evaluation = dict(get_checkpoint(engine, champion.checkpoint_id).evaluation or {})
    if "tool_failure_rate" not in evaluation:
        return MonitorVerdict(
            breach=False,
            reason=f"no verdict: champion {champion.checkpoint_id} has no evaluation baseline",
            figures={},
        )
    verdict = judge_window(window, float(evaluation["tool_failure_rate"]), rule)
    if not verdict.breach:
        return verdict
    breach = {
        "at": datetime.now(UTC).isoformat(),
        "reason": verdict.reason,
        "figures": verdict.figures,
        "actor": actor,
    }
    evaluation["monitor_breaches"] = [*evaluation.get("monitor_breaches", []), breach]
    record_evaluation(engine, champion.checkpoint_id, evaluation)
    if rollback:
        back = rollback_alias(
            engine,
            store,
            alias,
            reason=f"monitor {verdict.reason}",
            actor=actor,
            evidence=verdict.figures,
        )
        verdict = verdict.model_copy(update={"rolled_back_to": back.policy})
    return verdict
