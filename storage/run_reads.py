"""Everything read about one collection run, in one module (writes: `storage.runs`).

- lookup: `resolve_run` (a key or an id), `read_run_key`, `run_sandbox_spec`;
- the lifecycle's reads: `run_counts`, `run_totals`, `run_status`, `run_flow_run_id`,
  `rerun_needed` (what a re-run of the key would redo, and why);
- episodes and trajectories: `run_episode_ids`, `run_trajectories`, `sample_episode`;
- a report's rows in one session: `read_run_rows` (`RunRows`), `tool_call_counts`;
- the summary an operator reads (`summarize_run` → `RunSummary`: counts by status and
  failure category, success rate per template, tool failure rates, medians), computed
  with polars; presenting it (markdown, tables) is the caller's.

The steps table of a run and its parquet schema are `storage.run_frames`'s.

Rows are returned detached (plain attribute access, no session behind them); the
trajectories themselves stay in the object store (`Episode.trajectory_key`). polars is
imported only by the functions that build frames.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from sqlalchemy import (
    Engine,
    case,
    func,
    select,
)
from sqlmodel import Session, col
from sqlmodel import select as select_entity

from agent.trajectory import INFRASTRUCTURE_STATUSES, Trajectory
from core.errors import reason_line
from models import CollectionRun, Episode, Judgement, QcResult, QcRun, Step, run_id_for
from models.step import tool_failed
from storage.episodes import load_trajectory
from storage.errors import RunNotFound
from storage.objects import ObjectStore
from storage.runs import RETRIED_STATUSES

if TYPE_CHECKING:
    import polars as pl

# ---------------------------------------------------------------------------- lookup


def resolve_run(engine: Engine, run: str) -> uuid.UUID:
    """The id of the run whose key, or id, is `run`.

    Raises:
        RunNotFound: no collection run has that key or id.
    """
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.id)).where(col(CollectionRun.run_key) == run)
        ).scalar_one_or_none()
        if found is None:
            try:
                candidate = uuid.UUID(run)
            except ValueError:
                candidate = None
            if candidate is not None:
                found = conn.execute(
                    select(col(CollectionRun.id)).where(col(CollectionRun.id) == candidate)
                ).scalar_one_or_none()
    if found is None:
        raise RunNotFound(f"--run {run!r}: no collection run with that key or id", setting="--run")
    return found


def read_run_key(engine: Engine, run_id: uuid.UUID) -> str:
    """The key stored on run `run_id`."""
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(col(CollectionRun.run_key)).where(col(CollectionRun.id) == run_id)
            ).scalar_one()
        )


def run_sandbox_spec(engine: Engine, run_key: str) -> dict[str, Any] | None:
    """The sandbox spec run `run_key` recorded; None when the run has no row or no spec."""
    with engine.connect() as conn:
        spec = conn.execute(
            select(col(CollectionRun.sandbox_spec)).where(
                col(CollectionRun.id) == run_id_for(run_key)
            )
        ).scalar_one_or_none()
    return dict(spec) if spec else None


# ------------------------------------------------------------ the lifecycle's reads


def run_status(engine: Engine, run_id: uuid.UUID) -> str | None:
    """The run's status; None when it has no row."""
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.status)).where(col(CollectionRun.id) == run_id)
        ).scalar_one_or_none()
    return str(found) if found is not None else None


def run_flow_run_id(engine: Engine, run_id: uuid.UUID) -> str | None:
    """The Prefect flow run recorded on the run (set when its collection ends)."""
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.prefect_flow_run_id)).where(col(CollectionRun.id) == run_id)
        ).scalar_one_or_none()
    return str(found) if found else None


def run_counts(engine: Engine, run_id: uuid.UUID) -> dict[str, int]:
    """Stored episodes of the run by status."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Episode.status), func.count())
            .where(col(Episode.run_id) == run_id)
            .group_by(col(Episode.status))
        ).all()
    return {str(status): int(n) for status, n in rows}


def run_totals(engine: Engine, run_id: uuid.UUID) -> tuple[int, int]:
    """(episodes, steps) of the run stored so far, whatever wrote them."""
    with engine.connect() as conn:
        episodes, steps = conn.execute(
            select(func.count(), func.coalesce(func.sum(col(Episode.n_steps)), 0)).where(
                col(Episode.run_id) == run_id
            )
        ).one()
    return int(episodes), int(steps)


class RerunNeeded(BaseModel):
    """Episodes of a run that a re-run of its key would redo, by status."""

    count: int
    """How many."""
    reason: str | None
    """The most frequent failure reason among them (one line)."""


def rerun_needed(engine: Engine, run_id: uuid.UUID) -> dict[str, RerunNeeded]:
    """The run's stored episodes in `RETRIED_STATUSES`, by status, with their most
    frequent reason."""
    retried = sorted(str(s) for s in RETRIED_STATUSES)
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Episode.status), col(Episode.failure_reason), func.count())
            .where(col(Episode.run_id) == run_id, col(Episode.status).in_(retried))
            .group_by(col(Episode.status), col(Episode.failure_reason))
        ).all()
    out: dict[str, RerunNeeded] = {}
    top: dict[str, int] = {}
    for status, reason, n in rows:
        entry = out.setdefault(str(status), RerunNeeded(count=0, reason=None))
        entry.count += int(n)
        if int(n) > top.get(str(status), 0):
            top[str(status)] = int(n)
            entry.reason = reason_line(reason) if reason else None
    return out


# -------------------------------------------------------- episodes and trajectories


def run_episode_ids(engine: Engine, run_id: uuid.UUID) -> list[uuid.UUID]:
    """Ids of the run's episodes that have a stored trajectory, in start order."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(col(Episode.id))
                .where(col(Episode.run_id) == run_id, col(Episode.trajectory_key).is_not(None))
                .order_by(col(Episode.started_at), col(Episode.id))
            ).scalars()
        )


def run_trajectories(engine: Engine, store: ObjectStore, run_id: uuid.UUID) -> list[Trajectory]:
    """Every stored trajectory of the run, in start order."""
    return [load_trajectory(engine, store, eid) for eid in run_episode_ids(engine, run_id)]


def sample_episode(engine: Engine, run_id: uuid.UUID, *, success: bool) -> str | None:
    """The id of one successful (or one unsuccessful) episode of the run, the first by
    template and id; None when there is none."""
    query = select(col(Episode.id)).where(col(Episode.run_id) == run_id)
    query = query.where(
        col(Episode.status) == "success" if success else col(Episode.status) != "success"
    )
    with engine.connect() as conn:
        found = conn.execute(
            query.order_by(col(Episode.template), col(Episode.id)).limit(1)
        ).scalar_one_or_none()
    return str(found) if found else None


# ------------------------------------------------------------------ a report's rows


@dataclass(frozen=True)
class ToolCallCounts:
    """Calls of one tool in a run and how many failed (`models.step.tool_failed_sql`)."""

    tool: str
    calls: int
    failed: int


@dataclass
class RunRows:
    """A run's rows: the run, its episodes, per-tool call counts, step counts by injected
    fault and by policy perturbation, and its latest QC run with verdicts and judgements."""

    run: CollectionRun
    episodes: list[Episode]
    tools: list[ToolCallCounts]
    faults: dict[str, int]
    perturbations: dict[str, int]
    qc_run: QcRun | None = None
    verdicts: dict[uuid.UUID, QcResult] = field(default_factory=dict)
    judgements: dict[uuid.UUID, list[Judgement]] = field(default_factory=dict)


def tool_call_counts(engine: Engine, run_id: uuid.UUID) -> list[ToolCallCounts]:
    """Calls and failed calls per tool of run `run_id`, ordered by tool."""
    failed = func.sum(case((tool_failed(), 1), else_=0))
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Step.tool), func.count(), failed)
            .join(Episode, col(Episode.id) == col(Step.episode_id))
            .where(col(Episode.run_id) == run_id, col(Step.parse_kind) == "tool_call")
            .group_by(col(Step.tool))
            .order_by(col(Step.tool))
        ).all()
    return [ToolCallCounts(tool=t or "?", calls=int(n), failed=int(f or 0)) for t, n, f in rows]


def read_run_rows(engine: Engine, run: str) -> RunRows:
    """The rows of run `run` (key or id).

    Raises:
        RunNotFound: no collection run has that key or id.
    """
    run_id = resolve_run(engine, run)
    with Session(engine, expire_on_commit=False) as session:
        run_row = session.get_one(CollectionRun, run_id)
        episodes = list(
            session.exec(
                select_entity(Episode)
                .where(col(Episode.run_id) == run_id)
                .order_by(col(Episode.started_at), col(Episode.id))
            )
        )
        faults = _step_counts(session, run_id, col(Step.injected_fault_kind))
        perturbations = _step_counts(session, run_id, col(Step.policy_perturbation))
        qc_run = session.exec(
            select_entity(QcRun)
            .where(col(QcRun.run_id) == run_id)
            .order_by(col(QcRun.started_at).desc(), col(QcRun.id))
            .limit(1)
        ).one_or_none()
        verdicts: dict[uuid.UUID, QcResult] = {}
        judgements: dict[uuid.UUID, list[Judgement]] = {}
        if qc_run is not None:
            for r in session.exec(
                select_entity(QcResult).where(col(QcResult.qc_run_id) == qc_run.id)
            ):
                verdicts[r.episode_id] = r
            for j in session.exec(
                select_entity(Judgement)
                .where(col(Judgement.qc_run_id) == qc_run.id)
                .order_by(col(Judgement.judge), col(Judgement.created_at))
            ):
                judgements.setdefault(j.episode_id, []).append(j)
        session.expunge_all()
    return RunRows(
        run=run_row,
        episodes=episodes,
        tools=tool_call_counts(engine, run_id),
        faults=faults,
        perturbations=perturbations,
        qc_run=qc_run,
        verdicts=verdicts,
        judgements=judgements,
    )


def _step_counts(session: Session, run_id: uuid.UUID, column: Any) -> dict[str, int]:
    """Steps of the run by a nullable step column's value (NULLs left out), most first."""
    rows = (
        session.connection()
        .execute(
            select(column, func.count())
            .join(Episode, col(Episode.id) == col(Step.episode_id))
            .where(col(Episode.run_id) == run_id, column.is_not(None))
            .group_by(column)
        )
        .all()
    )
    return {str(k): int(n) for k, n in sorted(rows, key=lambda r: (-r[1], str(r[0])))}


# ---------------------------------------------------------------------- the summary


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
    import polars as pl

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
    (`tool`, `calls`, `failed`) counts (`tool_call_counts`)."""
    import polars as pl

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
