"""Everything SQL holds about one collection run, read in one session for a report.

Rows are returned detached (plain attribute access, no session behind them); the
trajectories themselves stay in the object store (`Episode.trajectory_key`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, case, func, select
from sqlmodel import Session, col
from sqlmodel import select as select_entity

from models import CollectionRun, Episode, Judgement, QcResult, QcRun, Step
from models.step import tool_failed
from storage.runs import resolve_run


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
