"""The gate's output: per-episode verdicts (a polars frame), batch checks, and summaries.

`GateReport.verdicts` has one row per episode: `episode_id`, `verdict`, `quality_score`,
`reward_sign`, `rubric_mean`, `reasons` (list of expectation ids). `episode_verdicts()`
expands it into `EpisodeVerdict` objects whose `reasons` are the dicts stored in
`qc_result.reasons`. `render_markdown` is the Prefect artifact's body.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from expectations.suite_files import QcAction, QcCategory
from expectations.token_drift import TokenDrift
from scoring.quality import Verdict

__all__ = ["BatchCheck", "EpisodeVerdict", "GateReport", "Reason", "render_markdown"]


class Reason(BaseModel):
    """Why an episode got its verdict or sign: one failed expectation."""

    model_config = ConfigDict(frozen=True)

    expectation: str
    """Expectation meta id, e.g. `logic.write_before_read`."""
    category: QcCategory
    """Check family."""
    action: QcAction
    """What the failure did."""
    message: str
    """Human reason."""


class EpisodeVerdict(BaseModel):
    """One episode's gate outcome, as written to `qc_result`."""

    model_config = ConfigDict(frozen=True)

    episode_id: str
    """Episode gated."""
    verdict: Verdict
    """keep, downweight or discard."""
    quality_score: float
    """Quality in [0, 1]: rubric mean / 5 × verdict multiplier."""
    reward_sign: int
    """+1 when the final reward is non-negative, -1 otherwise."""
    rubric_mean: float
    """Rubric mean (0–5) the quality came from."""
    reasons: list[Reason]
    """Failed expectations that shaped verdict and sign."""


class BatchCheck(BaseModel):
    """One batch expectation's outcome."""

    model_config = ConfigDict(frozen=True)

    expectation: str
    """Expectation meta id."""
    category: QcCategory
    """Check family."""
    success: bool
    """True when it held."""
    observed_value: Any = None
    """The aggregate observed (rate, max, min …), when there is one."""
    message: str
    """Human reason shown when it fails."""


class GateReport(BaseModel):
    """Everything one gate run decided, without any database."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    suite_versions: dict[str, str]
    """Suite name → version used."""
    batch_passed: bool
    """True when every batch expectation held."""
    batch_checks: list[BatchCheck]
    """Every batch expectation's outcome."""
    verdicts: pl.DataFrame
    """One row per episode (see module docstring)."""
    reason_catalog: dict[str, Reason]
    """Expectation id → its reason, for expanding `verdicts.reasons`."""
    failure_modes_by_category: dict[str, int]
    """Episodes that did not succeed, by failure category."""
    failure_modes_by_tool: dict[str, int]
    """Failed tool calls, by tool."""
    data_docs_index: Path | None = None
    """index.html of the GX data docs, when they were built."""
    token_drift: list[TokenDrift] = Field(default_factory=list)
    """Per model that recorded sampled ids, the share of steps whose ids differ from the
    re-encoded text (`expectations.token_drift`): a figure, never a verdict."""

    @property
    def batch_failures(self) -> list[BatchCheck]:
        """The batch expectations that failed."""
        return [c for c in self.batch_checks if not c.success]

    @property
    def counts(self) -> dict[str, int]:
        """Episodes per verdict (every verdict present, zeros included)."""
        got = dict(self.verdicts.group_by("verdict").len().iter_rows())
        return {v.value: int(got.get(v.value, 0)) for v in Verdict}

    @property
    def n_episodes(self) -> int:
        """Episodes gated."""
        return self.verdicts.height

    @property
    def mean_quality(self) -> float | None:
        """Mean quality score, None for an empty batch."""
        value = self.verdicts["quality_score"].mean()
        return None if value is None else float(value)  # type: ignore[arg-type]

    @property
    def quality_weighted_volume(self) -> float:
        """Sum of quality scores (what the training trigger counts)."""
        return float(self.verdicts["quality_score"].sum())

    def top_reasons(self, n: int = 10) -> list[tuple[str, int]]:
        """The `n` most frequent reasons, with their episode counts."""
        counter: Counter[str] = Counter()
        for reasons in self.verdicts["reasons"].to_list():
            counter.update(reasons)
        return counter.most_common(n)

    def episode_verdicts(self) -> list[EpisodeVerdict]:
        """The verdicts frame as objects, reasons expanded (for `qc_result` rows)."""
        return [
            EpisodeVerdict(
                episode_id=row["episode_id"],
                verdict=Verdict(row["verdict"]),
                quality_score=row["quality_score"],
                reward_sign=row["reward_sign"],
                rubric_mean=row["rubric_mean"],
                reasons=[self.reason_catalog[r] for r in row["reasons"]],
            )
            for row in self.verdicts.iter_rows(named=True)
        ]


def render_markdown(report: GateReport, *, top: int = 10) -> str:
    """The Prefect artifact: batch verdict, verdict counts, top reasons, failure modes,
    and the re-encoding drift of sampled ids when any policy recorded them."""
    mean = "n/a" if report.mean_quality is None else f"{report.mean_quality:.3f}"
    lines = [
        f"# QC gate: batch {'PASSED' if report.batch_passed else 'FAILED'}",
        "",
        f"Suites: {', '.join(f'{k} v{v}' for k, v in sorted(report.suite_versions.items()))}  ",
        f"Episodes: {report.n_episodes}, mean quality {mean}, "
        f"quality-weighted volume {report.quality_weighted_volume:.1f}",
        "",
        "| verdict | episodes |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in report.counts.items()),
    ]
    if report.batch_failures:
        lines += ["", "## Failed batch checks", "", "| check | observed | why |", "|---|---|---|"]
        lines += [
            f"| {c.expectation} | {c.observed_value} | {c.message} |" for c in report.batch_failures
        ]
    lines += ["", "## Top reasons", "", "| reason | episodes | action |", "|---|---|---|"]
    lines += [
        f"| {rid} | {n} | {report.reason_catalog[rid].action.value} |"
        for rid, n in report.top_reasons(top)
    ]
    for title, table in (
        ("Failure modes by category", report.failure_modes_by_category),
        ("Failed calls by tool", report.failure_modes_by_tool),
    ):
        lines += ["", f"## {title}", "", "| key | count |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(table.items(), key=lambda kv: -kv[1])]
    if report.token_drift:
        lines += [
            "",
            "## Sampled ids that re-encoding would change",
            "",
            "Steps whose recorded completion ids differ from the tokenizer's encoding of the "
            "answer text (a figure, not a discard).",
            "",
            "| policy | steps with ids | differing | share |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {d.policy} | {d.steps_with_ids} | "
            f"{'n/a' if d.steps_differing is None else d.steps_differing} | "
            f"{'n/a (no tokenizer here)' if d.share is None else f'{d.share:.1%}'} |"
            for d in report.token_drift
        ]
    return "\n".join(lines) + "\n"
