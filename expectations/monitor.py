"""The production monitor's suite (`suites/monitor_v<version>.json`): a window of a
deployed model's trajectories against its champion's evaluation baseline, in Great
Expectations. Pure: frames and figures in, checks out; no SQL, no Prefect.

Two frames (the contract; `training.monitor.window_frames` builds them from trajectories
with the evaluation's own turn rules, so each mean is the figure
`training.evaluation.evaluation_metrics` gives the same episodes):

- `episodes` (`EPISODE_FRAME_SCHEMA`), one row per episode of the window:
  `infrastructure` (1.0 when it ended in an infrastructure outcome), `success` and
  `n_steps` (null for those: an infrastructure outcome is never the model's);
- `turns` (`TURN_FRAME_SCHEMA`), one row per assistant turn of the model's own episodes:
  `acting_failed` (the tool-failure rule; null for a parsed `<final>`, which does not act)
  and `parse_error`.

Every expectation is a column mean (GX skips nulls). Its bound is either absolute (in
`kwargs`) or relative: `meta.baseline` names a figure of the champion's evaluation, and
the bound is that figure minus (`meta.bound` `min`) or plus (`max`) `meta.tolerance`,
written into the kwargs before GX runs, so the data docs show the number used.

A check is `ok`, `failed` or `skipped` (no baseline figure; no row to average; or, for a
`breach` check, fewer than `MonitorRule.min_episodes` episodes of the model's own). A
failed `breach` check is the model's regression (`MonitorReport.breach`); a failed
`alert` check (the infrastructure share) is the environment's, reported and never a
breach: a window of only infrastructure failures raises no breach.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from expectations.errors import SuiteError
from expectations.gate import GateEngine
from expectations.outcomes import ExpectationOutcome
from expectations.polars_checks import evaluate_suite_polars
from expectations.settings import SUITES_DIR
from expectations.suite_files import ExpectationSpec, QcAction, QcCategory, SuiteSpec, load_suite

__all__ = [
    "EPISODE_FRAME_SCHEMA",
    "TURN_FRAME_SCHEMA",
    "MonitorCheck",
    "MonitorReport",
    "MonitorRule",
    "evaluate_window",
    "load_monitor_suite",
]

FrameName = Literal["episodes", "turns"]

EPISODE_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "episode_id": pl.String(),
    "infrastructure": pl.Float64(),
    "success": pl.Float64(),
    "n_steps": pl.Float64(),
}
"""One row per episode of the window (infrastructure outcomes: `success`, `n_steps` null)."""

TURN_FRAME_SCHEMA: dict[str, pl.DataType] = {
    "episode_id": pl.String(),
    "acting_failed": pl.Float64(),
    "parse_error": pl.Float64(),
}
"""One row per assistant turn of the model's own episodes (`acting_failed` null for a
parsed `<final>`)."""


class MonitorRule(BaseModel):
    """Which monitor suite runs and when a window is big enough to judge the model."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    min_episodes: int = Field(default=5, ge=1)
    """Fewest episodes of the model's own (infrastructure outcomes left out) to judge it."""
    suite_version: str = "1"
    """Version of the monitor suite (`monitor_v<version>.json`: the thresholds)."""
    suites_dir: Path = SUITES_DIR
    """Where the suite files are."""


class MonitorMeta(BaseModel):
    """The monitor's part of an expectation's meta: its frame and how its bound is made."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    frame: FrameName
    """The frame the mean is over."""
    baseline: str | None = None
    """The champion's evaluation figure the bound is relative to (None: absolute bound)."""
    bound: Literal["min", "max"] | None = None
    """Which side the relative bound is."""
    tolerance: float | None = Field(default=None, ge=0)
    """How far past the baseline the window may go."""

    @model_validator(mode="after")
    def _relative_needs_bound(self) -> MonitorMeta:
        if self.baseline is not None and (self.bound is None or self.tolerance is None):
            raise ValueError(
                "a bound relative to meta.baseline needs meta.bound and meta.tolerance"
            )
        return self


def _meta(spec: ExpectationSpec) -> MonitorMeta:
    return MonitorMeta.model_validate(spec.meta.model_dump())


def load_monitor_suite(rule: MonitorRule) -> SuiteSpec:
    """The monitor suite of the rule's version, checked.

    Raises:
        SuiteError: the file is missing or invalid, or an expectation's meta lacks what
            the monitor needs (`frame`; `bound` and `tolerance` with `baseline`).
    """
    spec = load_suite(rule.suites_dir, "monitor", rule.suite_version)
    if spec.level != "monitor":
        raise SuiteError(f"monitor_v{rule.suite_version}.json: meta.level must be 'monitor'")
    for e in spec.expectations:
        try:
            _meta(e)
        except ValidationError as exc:
            raise SuiteError(
                f"monitor_v{rule.suite_version}.json: {e.meta.id}: {exc.errors()[0]['msg']}"
            ) from exc
    return spec


CheckStatus = Literal["ok", "failed", "skipped"]


class MonitorCheck(BaseModel):
    """One threshold over the window."""

    model_config = ConfigDict(frozen=True)

    expectation: str
    """The expectation's meta id, e.g. `logic.tool_failure_rate`."""
    category: QcCategory
    """Check family."""
    action: QcAction
    """`breach` (the model's) or `alert` (the environment's)."""
    status: CheckStatus
    """ok, failed, or skipped (see `note`)."""
    observed: float | None
    """The window's figure (the column mean)."""
    baseline: float | None = None
    """The champion's figure the bound is relative to."""
    min_value: float | None = None
    """Lower bound applied."""
    max_value: float | None = None
    """Upper bound applied."""
    note: str = ""
    """Why a check was skipped; the expectation's reason when it failed."""

    def line(self) -> str:
        """One line: status, id, the figure against its bound."""
        label = {
            "ok": "ok",
            "skipped": "skipped",
            "failed": "BREACH" if self.action is QcAction.BREACH else "ALERT",
        }[self.status]
        if self.status == "skipped":
            return f"{label} {self.expectation}: {self.note}"
        bound = (
            f">= {self.min_value:.3f}" if self.min_value is not None else f"<= {self.max_value:.3f}"
        )
        relative = "" if self.baseline is None else f" (baseline {self.baseline:.3f})"
        observed = "-" if self.observed is None else f"{self.observed:.3f}"
        return f"{label} {self.expectation}: {observed}, rule {bound}{relative}"


class MonitorReport(BaseModel):
    """Every check of the monitor suite over one window."""

    model_config = ConfigDict(frozen=True)

    suite_version: str
    """The monitor suite's version."""
    checks: list[MonitorCheck]
    """One per expectation, in suite order."""
    n_episodes: int
    """Episodes of the model's own (infrastructure outcomes left out)."""
    n_infrastructure: int
    """Episodes that ended in an infrastructure outcome."""
    n_turns: int
    """Assistant turns of the model's own episodes."""
    min_episodes: int
    """Fewest model episodes the breach checks needed."""

    @property
    def breaches(self) -> list[MonitorCheck]:
        """Failed checks that are the model's regression."""
        return [c for c in self.checks if c.status == "failed" and c.action is QcAction.BREACH]

    @property
    def alerts(self) -> list[MonitorCheck]:
        """Failed checks that are the environment's."""
        return [c for c in self.checks if c.status == "failed" and c.action is QcAction.ALERT]

    @property
    def breach(self) -> bool:
        """Whether the model regressed beyond the suite."""
        return bool(self.breaches)

    def reason(self) -> str:
        """The verdict in one line, with its figures."""
        window = f"on {self.n_episodes} episodes ({self.n_infrastructure} infrastructure outcomes left out)"
        if self.breaches:
            head = "breach: " + "; ".join(_short(c) for c in self.breaches) + f" {window}"
        elif self.n_episodes < self.min_episodes:
            head = (
                f"no verdict: {self.n_episodes} episodes of the model's own "
                f"({self.n_infrastructure} infrastructure outcomes left out), "
                f"{self.min_episodes} needed"
            )
        elif not any(c.action is QcAction.BREACH and c.status != "skipped" for c in self.checks):
            notes = dict.fromkeys(
                c.note for c in self.checks if c.action is QcAction.BREACH and c.note
            )
            head = f"no verdict {window}: " + "; ".join(notes)
        else:
            head = f"within the rule {window}"
        if self.alerts:
            head += "; environment alert (not the model's): " + "; ".join(
                _short(c) for c in self.alerts
            )
        return head

    def figures(self) -> dict[str, Any]:
        """The window's figures and bounds (JSON), as stored with a breach."""
        return {
            "suite_version": self.suite_version,
            "window_episodes": self.n_episodes,
            "window_infrastructure": self.n_infrastructure,
            "window_turns": self.n_turns,
            "checks": {
                c.expectation: c.model_dump(
                    mode="json",
                    include={"status", "observed", "baseline", "min_value", "max_value"},
                )
                for c in self.checks
            },
        }


def _short(check: MonitorCheck) -> str:
    if check.min_value is not None:
        bound = f"< {check.min_value:.3f}"
    else:
        bound = f"> {check.max_value:.3f}"
    baseline = "" if check.baseline is None else f" (baseline {check.baseline:.3f})"
    return f"{check.expectation} {check.observed:.3f} {bound}{baseline}"


def _resolve(
    spec: ExpectationSpec, baseline: Mapping[str, float | None]
) -> tuple[ExpectationSpec | None, float | None, str]:
    """The expectation with its bound in the kwargs (None and why when it has none)."""
    meta = _meta(spec)
    if meta.baseline is None:
        return spec, None, ""
    figure = baseline.get(meta.baseline)
    if figure is None:
        return None, None, f"the champion's evaluation has no {meta.baseline}"
    assert meta.tolerance is not None  # MonitorMeta's validator
    if meta.bound == "min":
        args = {**spec.args, "min_value": figure - meta.tolerance}
    else:
        args = {**spec.args, "max_value": figure + meta.tolerance}
    return spec.model_copy(update={"args": args}), float(figure), ""


def evaluate_window(
    episodes: pl.DataFrame,
    turns: pl.DataFrame,
    baseline: Mapping[str, float | None],
    *,
    rule: MonitorRule,
    engine: GateEngine = "gx",
) -> MonitorReport:
    """Run the monitor suite over the window's frames against the champion's `baseline`
    (evaluation figure name → value; see the module docstring).

    Raises:
        SuiteError: the monitor suite is missing or invalid.
        SuiteExecutionError: GX raised while evaluating an expectation.
    """
    suite = load_monitor_suite(rule)
    frames: dict[FrameName, pl.DataFrame] = {"episodes": episodes, "turns": turns}
    n_infrastructure = int(episodes.get_column("infrastructure").sum() or 0)
    n_model = episodes.height - n_infrastructure
    checks: dict[str, MonitorCheck] = {}
    to_run: dict[FrameName, list[tuple[ExpectationSpec, float | None]]] = {
        "episodes": [],
        "turns": [],
    }
    for spec in suite.expectations:
        meta = _meta(spec)
        column = frames[meta.frame].get_column(spec.args["column"])
        observed = column.mean() if column.null_count() < column.len() else None
        resolved, figure, why = _resolve(spec, baseline)
        if resolved is not None and observed is None:
            why = f"no {meta.frame[:-1]} in the window to average {spec.args['column']} over"
        elif (
            resolved is not None
            and spec.meta.action is QcAction.BREACH
            and n_model < rule.min_episodes
        ):
            why = f"{n_model} episodes of the model's own, {rule.min_episodes} needed"
        if why:
            checks[spec.meta.id] = MonitorCheck(
                expectation=spec.meta.id,
                category=spec.meta.category,
                action=spec.meta.action,
                status="skipped",
                observed=None if observed is None else float(observed),  # type: ignore[arg-type]
                baseline=figure,
                note=why,
            )
            continue
        assert resolved is not None
        to_run[meta.frame].append((resolved, figure))
    outcomes = _run(suite, to_run, frames, engine)
    for frame, specs in to_run.items():
        for resolved, figure in specs:
            outcome = outcomes[frame][resolved.meta.id]
            observed_value = outcome.observed_value
            checks[resolved.meta.id] = MonitorCheck(
                expectation=resolved.meta.id,
                category=resolved.meta.category,
                action=resolved.meta.action,
                status="ok" if outcome.success else "failed",
                observed=None if observed_value is None else float(observed_value),
                baseline=figure,
                min_value=resolved.args.get("min_value"),
                max_value=resolved.args.get("max_value"),
                note="" if outcome.success else resolved.meta.reason,
            )
    return MonitorReport(
        suite_version=suite.version,
        checks=[checks[e.meta.id] for e in suite.expectations],
        n_episodes=n_model,
        n_infrastructure=n_infrastructure,
        n_turns=turns.height,
        min_episodes=rule.min_episodes,
    )


def _run(
    suite: SuiteSpec,
    to_run: Mapping[FrameName, list[tuple[ExpectationSpec, float | None]]],
    frames: Mapping[FrameName, pl.DataFrame],
    engine: GateEngine,
) -> dict[str, dict[str, ExpectationOutcome]]:
    """Each frame's resolved expectations as one suite, through GX (or the polars reference)."""
    suites = {
        frame: (
            suite.model_copy(update={"expectations": [spec for spec, _ in specs]}),
            frames[frame],
        )
        for frame, specs in to_run.items()
        if specs
    }
    if engine == "gx":
        from expectations.gx_runner import validate_aggregates

        raw = validate_aggregates(
            {name: (spec, frame.to_pandas()) for name, (spec, frame) in suites.items()}
        )
    else:
        raw = {name: evaluate_suite_polars(frame, spec) for name, (spec, frame) in suites.items()}
    return {name: {o.expectation: o for o in outcomes} for name, outcomes in raw.items()}
