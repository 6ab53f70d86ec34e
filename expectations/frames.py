"""Trajectories → the polars frames the gate computes features from.

Three frames, one row per episode, per step, and per judged episode. The flow may also
build them straight from SQL rows; these schemas are the contract.

The per-step columns that need Python (`signature`, `target`, `write_path`, `transient`)
are computed here with the same functions the reward rules and the rule judge use, so
the polars features and the judge cannot disagree on what a step did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import polars as pl
from pydantic import BaseModel, ConfigDict

from agent.trajectory import Trajectory
from expectations.errors import FeatureSchemaError
from scoring.calls import call_signature, is_transient_failure
from scoring.rubric import Judgement

__all__ = [
    "EPISODE_SCHEMA",
    "JUDGE_SCHEMA",
    "STEP_SCHEMA",
    "QcFrames",
    "build_frames",
    "judge_frame",
    "judgement_rows",
    "require_columns",
]

EPISODE_SCHEMA: dict[str, pl.DataType] = {
    "episode_id": pl.String(),
    "task_id": pl.String(),
    "template": pl.String(),
    "policy": pl.String(),
    "status": pl.String(),
    "failure_category": pl.String(),
    "verifier_score": pl.Float64(),
    "duration_ms": pl.Float64(),
}
"""Episode frame: one row per episode (`duration_ms` null when the episode has no end)."""

STEP_SCHEMA: dict[str, pl.DataType] = {
    "episode_id": pl.String(),
    "index": pl.Int64(),
    "parse_kind": pl.String(),
    "has_parse_error": pl.Boolean(),
    "call_id": pl.String(),
    "tool": pl.String(),
    "signature": pl.String(),
    "failed": pl.Boolean(),
    "transient": pl.Boolean(),
    "error_type": pl.String(),
    "duration_ms": pl.Float64(),
    "n_files_changed": pl.Int64(),
}
"""Step frame: one row per step; `signature` is null when the step made no parsed call."""

JUDGE_SCHEMA: dict[str, pl.DataType] = {
    "episode_id": pl.String(),
    "rubric_mean": pl.Float64(),
    "n_blind_writes": pl.Int64(),
    "n_fabrications": pl.Int64(),
    "n_safety_violations": pl.Int64(),
    "false_final_claim": pl.Boolean(),
}
"""Judge frame: the rule judge's per-trajectory findings the gate uses (text and causality
checks that need the whole trajectory), and the rubric mean for the quality score."""


class QcFrames(BaseModel):
    """The episode and step frames of one batch."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    episodes: pl.DataFrame
    """`EPISODE_SCHEMA` rows."""
    steps: pl.DataFrame
    """`STEP_SCHEMA` rows."""


def require_columns(frame: pl.DataFrame, schema: Mapping[str, pl.DataType], name: str) -> None:
    """Raise `FeatureSchemaError` when `frame` lacks a column of `schema`."""
    missing = [c for c in schema if c not in frame.columns]
    if missing:
        raise FeatureSchemaError(f"{name} frame lacks columns {missing}")


def build_frames(trajectories: Sequence[Trajectory]) -> QcFrames:
    """Flatten trajectories into the episode and step frames."""
    episodes: dict[str, list[object]] = {k: [] for k in EPISODE_SCHEMA}
    steps: dict[str, list[object]] = {k: [] for k in STEP_SCHEMA}
    for t in trajectories:
        eid = str(t.episode_id)
        duration = t.duration_ms
        for key, value in (
            ("episode_id", eid),
            ("task_id", t.task_id),
            ("template", t.template),
            ("policy", t.policy),
            ("status", t.status.value),
            ("failure_category", t.failure_category.value),
            ("verifier_score", t.verifier_score),
            ("duration_ms", duration),
        ):
            episodes[key].append(value)
        for s in t.steps:
            sig = call_signature(s)
            for key, value in (
                ("episode_id", eid),
                ("index", s.index),
                ("parse_kind", s.parse_kind.value),
                ("has_parse_error", s.parse_error is not None),
                ("call_id", s.call_id),
                ("tool", s.tool),
                ("signature", sig),
                ("failed", s.tool_failed),
                ("transient", is_transient_failure(s)),
                ("error_type", s.error_type),
                ("duration_ms", s.duration_ms),
                ("n_files_changed", len(s.files_changed)),
            ):
                steps[key].append(value)
    return QcFrames(
        episodes=pl.DataFrame(episodes, schema=EPISODE_SCHEMA),
        steps=pl.DataFrame(steps, schema=STEP_SCHEMA),
    )


def judge_frame(rows: Iterable[Mapping[str, object]]) -> pl.DataFrame:
    """A `JUDGE_SCHEMA` frame from dict rows."""
    data: dict[str, list[object]] = {k: [] for k in JUDGE_SCHEMA}
    for row in rows:
        for k in JUDGE_SCHEMA:
            data[k].append(row[k])
    return pl.DataFrame(data, schema=JUDGE_SCHEMA)


def judgement_rows(judgements: Iterable[Judgement]) -> list[dict[str, object]]:
    """Rubric means of parsed judgements, for overriding the rule judge's (e.g. with a GRM's)."""
    return [
        {"episode_id": j.episode_id, "rubric_mean": j.rubric.mean}
        for j in judgements
        if j.parsed and j.rubric is not None
    ]
