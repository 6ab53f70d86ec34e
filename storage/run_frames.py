"""The steps table of one collection run, as a polars frame in one fixed schema (the
parquet export, `storage.exchange`).

One row per step with the episode columns beside it: every `step` column, then the
episode's run, task, template, policy, agent, times, outcome, verifier score, trajectory
key and the latest gate's verdict and quality score (`episode_summary`); JSON columns as
JSON text, ids as text, times UTC, in one fixed schema (`step_frame_schema`, format
`STEP_FRAME_FORMAT`) so the exports of any runs concatenate. polars is imported only by
the functions that build frames. Every other read of a run is `storage.run_reads`'s.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    Boolean,
    Engine,
    Float,
    Integer,
    String,
    TypeDecorator,
    Uuid,
    column,
    select,
    table,
)
from sqlmodel import col

from models import Episode, Step
from models.columns import UTCDateTime

if TYPE_CHECKING:
    import polars as pl


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
"""Episode-level columns of the step table, after the step columns, by name."""


def _value(value: Any, is_json: bool) -> Any:
    if is_json:
        return None if value is None else json.dumps(value, ensure_ascii=False)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


STEP_FRAME_FORMAT = "1"
"""Version of the step table's layout; `step_frame_schema()` is its one schema, written into
the parquet file's metadata as `epiflow_step_frame_format`."""


def _polars_dtype(sql_type: Any, is_json: bool) -> Any:
    import polars as pl

    if isinstance(sql_type, UTCDateTime):
        return pl.Datetime("us", "UTC")
    if isinstance(sql_type, TypeDecorator):  # sqlmodel's AutoString and the like
        sql_type = sql_type.impl_instance
    if is_json or isinstance(sql_type, (JSON, Uuid, String)):
        return pl.String
    if isinstance(sql_type, Boolean):
        return pl.Boolean
    if isinstance(sql_type, Integer):
        return pl.Int64
    if isinstance(sql_type, Float):
        return pl.Float64
    raise TypeError(f"no parquet dtype for SQL type {sql_type!r}")  # a new column type: map it


def step_frame_schema() -> pl.Schema:
    """The step table's fixed schema (format `STEP_FRAME_FORMAT`), from the SQL column types.

    Every run's export has exactly these columns and dtypes, whatever its values (a column
    all NULL in one run is still its SQL type's dtype, never `Null`), so any set of exports
    `pl.concat`s.
    """
    import polars as pl

    step_table = Step.__table__  # type: ignore[attr-defined]
    columns: dict[str, Any] = {
        c.name: _polars_dtype(c.type, "JSON" in repr(c.type)) for c in step_table.columns
    }
    for name, c in EPISODE_COLUMNS.items():
        columns[name] = _polars_dtype(c.type, False)
    return pl.Schema(columns)


def run_step_frame(engine: Engine, run_id: uuid.UUID) -> pl.DataFrame:
    """One row per step of the run's episodes, in episode start order then step order.

    Its schema is `step_frame_schema()`, whatever the run holds.
    """
    import polars as pl

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
    schema = step_frame_schema()
    names = list(schema)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    data: dict[str, list[Any]] = {name: [] for name in names}
    for row in rows:
        for name, value in zip(names, row, strict=True):
            data[name].append(_value(value, name in json_columns))
    # SQLite hands back naive UTC datetimes, PostgreSQL aware ones: build each column with
    # what it holds, then cast it to the one schema.
    frame = pl.DataFrame(data, infer_schema_length=None, strict=False)
    return frame.select(pl.col(name).cast(dtype) for name, dtype in schema.items())
