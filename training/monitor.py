"""Production watch on an alias's champion (issue 45 item 4): a window of production
trajectories (imported ATIF / OpenAI / Harbor traces, or the episodes of a collection run
against the serving endpoint) through the monitor suite (`expectations.monitor`: GX,
thresholds on completion, average steps, tool-failure rate, parse errors and the
infrastructure share) against the champion's evaluation baseline.

- **Window** (`window_frames`, pure): the suite's two frames, each turn judged by the
  evaluation's own rules (`training.evaluation.turn_failed`, `turn_unparsed`), so the
  window's figures are `evaluation_metrics`'s on the same episodes.
- **Baseline** (`champion_baseline`): the champion checkpoint's stored evaluation
  (`checkpoint.evaluation`, written by the evaluate flow). A figure it lacks (a champion
  never evaluated, or evaluated before `parse_error_rate` was stored) skips its check.
- **Infrastructure is not the model.** Infrastructure outcomes are in no model figure; a
  window with fewer than `MonitorRule.min_episodes` of the model's own episodes judges no
  model check, so a window of only infrastructure failures is never a breach (its share
  is an environment alert at most).
- **Breach** (`record_breach`): stored with the checkpoint that regressed (appended to its
  evaluation's `monitor_breaches`, which a later evaluation keeps: a breach is a fact
  about one checkpoint, read with it, and needs no table of its own); with `rollback`, the
  alias goes back to its previous champion (`training.aliases.rollback_alias`: one
  `model_alias_change` row whose evidence is the breach's figures, visible in the
  `model_history` view) and one WARNING line says so.

`watch_alias` is the three in a row, without Prefect (the `monitor` flow,
`flows.monitor`, runs them as tasks and notifies).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine

from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus, ParseKind, Trajectory
from expectations.gate import GateEngine
from expectations.monitor import (
    EPISODE_FRAME_SCHEMA,
    TURN_FRAME_SCHEMA,
    MonitorReport,
    MonitorRule,
    evaluate_window,
)
from storage.objects import ObjectStore
from training.aliases import alias_target, rollback_alias
from training.errors import RegistryError
from training.evaluation import turn_failed, turn_unparsed
from training.registry import append_monitor_breach, get_checkpoint

__all__ = [
    "BASELINE_FIGURES",
    "Champion",
    "MonitorRule",
    "MonitorVerdict",
    "champion_baseline",
    "judge_window",
    "record_breach",
    "watch_alias",
    "window_frames",
]

logger = logging.getLogger(__name__)

BASELINE_FIGURES = ("completion_rate", "avg_steps", "tool_failure_rate", "parse_error_rate")
"""The evaluation figures the monitor suite's bounds may be relative to."""


class Champion(BaseModel):
    """The checkpoint an alias points at, with its evaluation baseline."""

    model_config = ConfigDict(frozen=True)

    alias: str
    """The alias watched."""
    checkpoint_id: uuid.UUID
    """Its current checkpoint."""
    seq: int
    """The alias change that made it current."""
    baseline: dict[str, float]
    """Its evaluation's figures (`BASELINE_FIGURES` it has)."""


class MonitorVerdict(BaseModel):
    """What the watch found in one window, and what it did."""

    breach: bool
    """Whether the model regressed beyond the monitor suite."""
    reason: str
    """One line: the verdict and its figures."""
    figures: dict[str, Any]
    """Window figures, bounds and baseline, per check."""
    report: MonitorReport | None = None
    """Every check (None when nothing was judged)."""
    alias: str | None = None
    """The alias watched."""
    checkpoint_id: uuid.UUID | None = None
    """The champion judged."""
    rolled_back_to: str | None = None
    """The policy the alias points at after a rollback, if one was made."""

    def lines(self) -> list[str]:
        """One line per check, then the verdict (and the rollback)."""
        lines = [c.line() for c in self.report.checks] if self.report else []
        lines.append(("BREACH " if self.breach else "verdict ") + self.reason)
        if self.rolled_back_to is not None:
            lines.append(f"rolled back: {self.alias} -> {self.rolled_back_to}")
        return lines


def window_frames(window: Sequence[Trajectory]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The monitor suite's `episodes` and `turns` frames of a window (pure)."""
    episodes: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for t in window:
        infrastructure = t.status in INFRASTRUCTURE_STATUSES
        episodes.append(
            {
                "episode_id": str(t.episode_id),
                "infrastructure": float(infrastructure),
                "success": None if infrastructure else float(t.status == EpisodeStatus.SUCCESS),
                "n_steps": None if infrastructure else float(t.n_steps),
            }
        )
        if infrastructure:
            continue
        for step in t.steps:
            turns.append(
                {
                    "episode_id": str(t.episode_id),
                    "acting_failed": (
                        None if step.parse_kind == ParseKind.FINAL else float(turn_failed(step))
                    ),
                    "parse_error": float(turn_unparsed(step)),
                }
            )
    return (
        pl.DataFrame(episodes, schema=EPISODE_FRAME_SCHEMA),
        pl.DataFrame(turns, schema=TURN_FRAME_SCHEMA),
    )


def judge_window(
    window: Sequence[Trajectory],
    baseline: dict[str, float],
    rule: MonitorRule,
    *,
    engine: GateEngine = "gx",
) -> MonitorVerdict:
    """The monitor suite over the window against the baseline (pure).

    Raises:
        SuiteError: the monitor suite is missing or invalid.
        SuiteExecutionError: GX raised while evaluating an expectation.
    """
    episodes, turns = window_frames(window)
    report = evaluate_window(episodes, turns, baseline, rule=rule, engine=engine)
    return MonitorVerdict(
        breach=report.breach,
        reason=report.reason(),
        figures={**report.figures(), "baseline": baseline, "rule": rule.model_dump(mode="json")},
        report=report,
    )


def champion_baseline(engine: Engine, alias: str) -> Champion:
    """The alias's current checkpoint and its evaluation figures.

    Raises:
        RegistryError: the alias is unset or names no checkpoint (an endpoint).
    """
    target = alias_target(engine, alias)
    if target is None or target.checkpoint_id is None:
        raise RegistryError(f"alias {alias!r} names no checkpoint to watch", setting="ALIAS")
    evaluation = get_checkpoint(engine, target.checkpoint_id).evaluation or {}
    return Champion(
        alias=alias,
        checkpoint_id=target.checkpoint_id,
        seq=target.seq,
        baseline={
            name: float(evaluation[name])
            for name in BASELINE_FIGURES
            if isinstance(evaluation.get(name), int | float)
        },
    )


def record_breach(
    engine: Engine,
    store: ObjectStore,
    champion: Champion,
    verdict: MonitorVerdict,
    *,
    actor: str,
    rollback: bool,
) -> MonitorVerdict:
    """Store a breach with the champion's evaluation and, with `rollback`, point the alias
    back at its previous champion (one row, one log line). A verdict without a breach is
    returned as it is.

    Raises:
        RegistryError: a rollback with no earlier checkpoint, or one that raced another
            change of the alias (`AliasConflict`: nothing rolled back, the breach stored).
    """
    verdict = verdict.model_copy(
        update={"alias": champion.alias, "checkpoint_id": champion.checkpoint_id}
    )
    if not verdict.breach:
        return verdict
    append_monitor_breach(
        engine,
        champion.checkpoint_id,
        {
            "at": datetime.now(UTC).isoformat(),
            "alias": champion.alias,
            "reason": verdict.reason,
            "figures": verdict.figures,
            "actor": actor,
        },
    )
    if not rollback:
        return verdict
    back = rollback_alias(
        engine,
        store,
        champion.alias,
        reason=f"monitor {verdict.reason}",
        actor=actor,
        evidence=verdict.figures,
        expected_seq=champion.seq,
    )
    logger.warning(
        "monitor: alias %s rolled back from checkpoint %s to %s (change %d): %s",
        champion.alias,
        champion.checkpoint_id,
        back.policy,
        back.seq,
        verdict.reason,
    )
    return verdict.model_copy(update={"rolled_back_to": back.policy})


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
        SuiteError: the monitor suite is missing or invalid.
    """
    champion = champion_baseline(engine, alias)
    verdict = judge_window(window, champion.baseline, rule)
    return record_breach(engine, store, champion, verdict, actor=actor, rollback=rollback)
