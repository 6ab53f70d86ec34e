"""Curriculum help: per-template success rates and the 30–70 % band (seed 000 §5.3).

Pure functions over episode records (a polars DataFrame or an iterable of mappings); the
SQL that feeds them lives in storage. Expected columns:

    template        str, required   template name
    status          str, required   `EpisodeStatus` value (`success`, `failed`, `timeout`, …)
    suite           str, optional   suite name; rates are per (suite, template) when present
    policy          str, optional   policy spec; `policy=` filters on it
    verifier_score  float, optional verifier score in [0, 1] (null when it did not run)

Episodes that say nothing about the policy's skill (the infrastructure outcomes
`env_error`, `storage_error`, `endpoint_error`, and `policy_error`, `aborted`, and the
unknown outcome `imported`) are left out of the rates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import INFRASTRUCTURE_STATUSES, OUTCOMELESS_STATUSES

UNINFORMATIVE_STATUSES = frozenset(
    {str(s) for s in INFRASTRUCTURE_STATUSES | OUTCOMELESS_STATUSES} | {"policy_error"}
)
"""Statuses excluded from success rates: the environment or plumbing failed, not the policy."""


class TemplateStats(BaseModel):
    """Success statistics of one template under one policy (or all policies pooled)."""

    model_config = ConfigDict(frozen=True)

    suite: str
    """Suite name; empty when the records had no `suite` column."""
    template: str
    """Template name."""
    episodes: int
    """Informative episodes counted."""
    successes: int
    """Episodes with status `success`."""
    success_rate: float
    """successes / episodes."""
    mean_score: float | None
    """Mean verifier score over the counted episodes that have one."""


class BandSelection(BaseModel):
    """Templates sorted by where a policy stands on them."""

    model_config = ConfigDict(frozen=True)

    in_band: list[TemplateStats] = Field(default_factory=list)
    """Success rate within [low, high]: the most useful training signal."""
    too_easy: list[TemplateStats] = Field(default_factory=list)
    """Success rate above the band."""
    too_hard: list[TemplateStats] = Field(default_factory=list)
    """Success rate below the band."""
    unexplored: list[tuple[str, str]] = Field(default_factory=list)
    """(suite, template) pairs with fewer than `min_episodes` episodes: sample them to learn."""
    nearest: list[TemplateStats] = Field(default_factory=list)
    """When nothing is in the band or unexplored: the templates closest to it, closest first."""

    @property
    def selected(self) -> list[tuple[str, str]]:
        """(suite, template) pairs to collect next: in band + unexplored, else the nearest."""
        chosen = [(s.suite, s.template) for s in self.in_band] + list(self.unexplored)
        return chosen or [(s.suite, s.template) for s in self.nearest]


def episodes_frame(episodes: pl.DataFrame | Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """The records as a DataFrame with `suite`, `template`, `status`, `verifier_score`, `policy`.

    Raises:
        ValueError: `template` or `status` is missing.
    """
    frame = (
        episodes
        if isinstance(episodes, pl.DataFrame)
        else pl.DataFrame(list(episodes), infer_schema_length=None)
    )
    if frame.height == 0 and not frame.columns:
        frame = pl.DataFrame(schema={"template": pl.String, "status": pl.String})
    missing = [c for c in ("template", "status") if c not in frame.columns]
    if missing:
        raise ValueError(f"episode records need columns {missing} (have {frame.columns})")
    defaults: dict[str, pl.Expr] = {
        "suite": pl.lit("", dtype=pl.String),
        "policy": pl.lit(None, dtype=pl.String),
        "verifier_score": pl.lit(None, dtype=pl.Float64),
    }
    frame = frame.with_columns(
        [expr.alias(c) for c, expr in defaults.items() if c not in frame.columns]
    )
    return frame.with_columns(
        pl.col("suite").cast(pl.String).fill_null(""),
        pl.col("template").cast(pl.String),
        pl.col("status").cast(pl.String),
        pl.col("verifier_score").cast(pl.Float64),
        pl.col("policy").cast(pl.String),
    )


def success_rates(
    episodes: pl.DataFrame | Iterable[Mapping[str, Any]], *, policy: str | None = None
) -> list[TemplateStats]:
    """Per-(suite, template) success rates, sorted by suite then template.

    Raises:
        ValueError: `template` or `status` is missing from the records.
    """
    frame = episodes_frame(episodes)
    if policy is not None:
        frame = frame.filter(pl.col("policy") == policy)
    frame = frame.filter(~pl.col("status").is_in(sorted(UNINFORMATIVE_STATUSES)))
    grouped = (
        frame.group_by("suite", "template")
        .agg(
            pl.len().alias("episodes"),
            (pl.col("status") == "success").sum().alias("successes"),
            pl.col("verifier_score").mean().alias("mean_score"),
        )
        .sort("suite", "template")
    )
    return [
        TemplateStats(
            suite=row["suite"],
            template=row["template"],
            episodes=row["episodes"],
            successes=row["successes"],
            success_rate=row["successes"] / row["episodes"],
            mean_score=row["mean_score"],
        )
        for row in grouped.iter_rows(named=True)
    ]


def select_band(
    stats: Iterable[TemplateStats],
    *,
    low: float = 0.3,
    high: float = 0.7,
    min_episodes: int = 8,
    all_templates: Iterable[tuple[str, str]] = (),
    nearest_k: int = 3,
) -> BandSelection:
    """Split templates by success rate around the band [low, high] (defaults: 30–70 %).

    Templates with fewer than `min_episodes` episodes, and any (suite, template) in
    `all_templates` with no stats at all, are `unexplored` rather than judged.

    Raises:
        ValueError: the band or `min_episodes` is out of range.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"band must satisfy 0 <= low <= high <= 1, got [{low}, {high}]")
    if min_episodes < 1:
        raise ValueError(f"min_episodes must be a positive integer, got {min_episodes}")
    in_band: list[TemplateStats] = []
    too_easy: list[TemplateStats] = []
    too_hard: list[TemplateStats] = []
    unexplored: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for s in stats:
        seen.add((s.suite, s.template))
        if s.episodes < min_episodes:
            unexplored.append((s.suite, s.template))
        elif s.success_rate > high:
            too_easy.append(s)
        elif s.success_rate < low:
            too_hard.append(s)
        else:
            in_band.append(s)
    unexplored += [key for key in dict.fromkeys(all_templates) if key not in seen]
    nearest: list[TemplateStats] = []
    if not in_band and not unexplored:
        center = (low + high) / 2

        def distance(s: TemplateStats) -> tuple[float, float, str, str]:
            gap = low - s.success_rate if s.success_rate < low else s.success_rate - high
            return (gap, abs(s.success_rate - center), s.suite, s.template)

        nearest = sorted(too_easy + too_hard, key=distance)[:nearest_k]
    return BandSelection(
        in_band=in_band,
        too_easy=too_easy,
        too_hard=too_hard,
        unexplored=unexplored,
        nearest=nearest,
    )
