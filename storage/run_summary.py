"""What a collection run produced, computed from its rows with polars.

Counts by status and failure category, success rate per template, tool-call failure rate
per tool, median steps and duration: the numbers an operator reads in the Prefect UI.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import polars as pl
from pydantic import BaseModel, Field
from sqlalchemy import Engine, select
from sqlmodel import col

from agent.trajectory import INFRASTRUCTURE_STATUSES
from models import Episode
from storage.run_rows import tool_call_counts


class RunSummary(BaseModel):
    """Summary of one collection run."""

    episodes: int = 0
    """Episodes of the run."""
    steps: int = 0
    """Steps of those episodes."""
    by_status: dict[str, int] = Field(default_factory=dict)
    """Episodes by status."""
    by_failure_category: dict[str, int] = Field(default_factory=dict)
    """Episodes by failure category."""
    success_rate: float = 0.0
    """Successful episodes / episodes that are not infrastructure outcomes."""
    success_rate_by_template: dict[str, float] = Field(default_factory=dict)
    """Success rate of each template (infrastructure outcomes left out)."""
    tool_failure_rate: dict[str, float] = Field(default_factory=dict)
    """Failed calls / calls, per tool."""
    tool_calls: dict[str, int] = Field(default_factory=dict)
    """Calls per tool."""
    median_steps: float | None = None
    """Median steps per episode."""
    median_duration_s: float | None = None
    """Median episode wall time, seconds."""


def _frame(rows: Sequence[Any], columns: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        [tuple(r) for r in rows], schema=columns, orient="row", infer_schema_length=None
    )


def summarize_run(engine: Engine, run_id: uuid.UUID) -> RunSummary:
    """Read the run's episodes and steps and summarise them."""
    # No id column: a frame of UUID objects makes polars import numpy (~0.1 s per process).
    with engine.connect() as conn:
        episodes = conn.execute(
            select(
                col(Episode.template),
                col(Episode.status),
                col(Episode.failure_category),
                col(Episode.n_steps),
                col(Episode.duration_ms),
            ).where(col(Episode.run_id) == run_id)
        ).all()
    calls = [(c.tool, c.calls, c.failed) for c in tool_call_counts(engine, run_id)]
    return summarize_frames(
        _frame(episodes, ["template", "status", "failure_category", "n_steps", "duration_ms"]),
        _frame(calls, ["tool", "calls", "failed"]),
    )


def summarize_frames(episodes: pl.DataFrame, calls: pl.DataFrame) -> RunSummary:
    """Pure part: the summary of an episode frame and a per-tool frame of
    (`tool`, `calls`, `failed`) counts (`storage.run_rows.tool_call_counts`)."""
    if episodes.is_empty():
        return RunSummary()
    # Infrastructure outcomes say nothing about the agent: out of every success rate.
    judged = episodes.filter(~pl.col("status").is_in(sorted(map(str, INFRASTRUCTURE_STATUSES))))
    ok = pl.col("status") == "success"
    by_template = judged.group_by("template").agg(ok.mean().alias("rate")).sort("template")
    summary = RunSummary(
        episodes=episodes.height,
        steps=int(episodes["n_steps"].sum()),
        by_status=_counts(episodes, "status"),
        by_failure_category=_counts(episodes, "failure_category"),
        success_rate=float(judged.select(ok.mean()).item()) if judged.height else 0.0,
        success_rate_by_template={
            r["template"]: round(float(r["rate"]), 4) for r in by_template.iter_rows(named=True)
        },
        median_steps=float(episodes["n_steps"].median()),  # type: ignore[arg-type]
        median_duration_s=(
            float(episodes["duration_ms"].median()) / 1000.0  # type: ignore[arg-type]
            if episodes["duration_ms"].drop_nulls().len()
            else None
        ),
    )
    if not calls.is_empty():
        per_tool = calls.group_by("tool").agg(pl.sum("calls"), pl.sum("failed")).sort("tool")
        summary.tool_calls = {r["tool"]: int(r["calls"]) for r in per_tool.iter_rows(named=True)}
        summary.tool_failure_rate = {
            r["tool"]: round(r["failed"] / r["calls"], 4)
            for r in per_tool.iter_rows(named=True)
            if r["calls"]
        }
    return summary


def _counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    counted = frame.group_by(column).len().sort(column)
    return {str(r[column]): int(r["len"]) for r in counted.iter_rows(named=True)}


def summary_markdown(run_key: str, summary: RunSummary) -> str:
    """The summary as a markdown report (the Prefect markdown artifact)."""
    lines = [
        f"# Collection run `{run_key}`",
        "",
        f"**{summary.episodes} episodes**, {summary.steps} steps, success rate "
        f"**{summary.success_rate:.1%}**; median {summary.median_steps} steps, "
        f"median duration {summary.median_duration_s or 0:.2f} s.",
        "",
        "| status | episodes |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary.by_status.items()),
        "",
        "| failure category | episodes |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary.by_failure_category.items()),
        "",
        "| template | success rate |",
        "|---|---|",
        *(f"| {k} | {v:.1%} |" for k, v in summary.success_rate_by_template.items()),
        "",
        "| tool | calls | failure rate |",
        "|---|---|---|",
        *(
            f"| {k} | {summary.tool_calls.get(k, 0)} | {v:.1%} |"
            for k, v in summary.tool_failure_rate.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def summary_table(summary: RunSummary) -> list[dict[str, Any]]:
    """One row per template (the Prefect table artifact)."""
    return [
        {"template": template, "success_rate": rate}
        for template, rate in summary.success_rate_by_template.items()
    ]
