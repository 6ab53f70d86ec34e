"""A run's steps as one table with the episode columns beside them (`epiflow export --format parquet`).

Read from SQL, so the file says exactly what the database says: every `step` column
(object keys included), then the episode's run, task, template, policy, agent, times,
outcome, verifier score and trajectory key, and the verdict and quality score of the
latest gate (`episode_summary`). JSON columns become JSON text; ids text; times UTC
timestamps.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import polars as pl
from sqlalchemy import Engine, Float, String, Uuid, column, select, table
from sqlmodel import col

from models import Episode, Step
from models.columns import UTCDateTime

__all__ = ["EPISODE_COLUMNS", "run_step_frame"]

_SUMMARY = table(
    "episode_summary",
    column("episode_id", Uuid()),
    column("run_key", String()),
    column("qc_run_id", Uuid()),
    column("qc_verdict", String()),
    column("quality_score", Float()),
)

EPISODE_COLUMNS: dict[str, Any] = {
    "run_key": _SUMMARY.c.run_key,
    "run_id": col(Episode.run_id),
    "task_id": col(Episode.task_id),
    "suite": col(Episode.suite),
    "template": col(Episode.template),
    "rollout_index": col(Episode.rollout_index),
    "policy_id": col(Episode.policy_id),
    "agent_name": col(Episode.agent_name),
    "episode_started_at": col(Episode.started_at),
    "episode_ended_at": col(Episode.ended_at),
    "status": col(Episode.status),
    "failure_category": col(Episode.failure_category),
    "verifier_score": col(Episode.verifier_score),
    "trajectory_key": col(Episode.trajectory_key),
    "qc_run_id": _SUMMARY.c.qc_run_id,
    "qc_verdict": _SUMMARY.c.qc_verdict,
    "quality_score": _SUMMARY.c.quality_score,
}
"""Episode-level columns of the export, after the step columns, by name."""


def _value(value: Any, is_json: bool) -> Any:
    if is_json:
        return None if value is None else json.dumps(value, ensure_ascii=False)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def run_step_frame(engine: Engine, run_id: uuid.UUID) -> pl.DataFrame:
    """One row per step of the run's episodes, in episode start order then step order."""
    step_table = Step.__table__  # type: ignore[attr-defined]
    step_columns = list(step_table.columns)
    json_columns = {c.name for c in step_columns if "JSON" in repr(c.type)}
    query = (
        select(*step_columns, *(c.label(name) for name, c in EPISODE_COLUMNS.items()))
        .join(Episode, col(Episode.id) == col(Step.episode_id))
        .join(_SUMMARY, _SUMMARY.c.episode_id == col(Episode.id))
        .where(col(Episode.run_id) == run_id)
        .order_by(col(Episode.started_at), col(Episode.id), col(Step.step_index))
    )
    names = [c.name for c in step_columns] + list(EPISODE_COLUMNS)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    data: dict[str, list[Any]] = {name: [] for name in names}
    for row in rows:
        for name, value in zip(names, row, strict=True):
            data[name].append(_value(value, name in json_columns))
    schema: dict[str, Any] = {}
    for name in names:
        sql_type = step_table.c[name].type if name in step_table.c else EPISODE_COLUMNS[name].type
        if isinstance(sql_type, UTCDateTime):
            schema[name] = pl.Datetime("us", "UTC")
    frame = pl.DataFrame(data, schema_overrides=schema, infer_schema_length=None, strict=False)
    return frame.with_columns(
        pl.col(n).cast(pl.Datetime("us", "UTC")) for n in schema if frame[n].dtype != schema[n]
    )
