"""Persist quality-gate results: `qc_run`, `qc_result` and `judgement` rows; read the trigger state.

The gate itself (`expectations.gate`) is pure; this module is its SQL side.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlmodel import col

from agent.trajectory import utcnow
from expectations.report import GateReport
from models import Judgement as JudgementRow
from models import QcResult, QcRun
from scoring.rubric import Judgement
from storage.errors import RunNotFound
from storage.sanitize import clean_json, clean_text


def judgement_row(j: Judgement, *, qc_run_id: uuid.UUID | None) -> dict[str, Any]:
    rubric = j.rubric
    return {
        "id": uuid.uuid4(),
        "episode_id": uuid.UUID(j.episode_id),
        "qc_run_id": qc_run_id,
        "judge": j.judge,
        "judge_version": j.judge_version,
        "parsed": j.parsed,
        "parse_error": clean_text(j.parse_error) if j.parse_error else None,
        "completion": rubric.completion if rubric else None,
        "tool_correctness": rubric.tool_correctness if rubric else None,
        "reliability": rubric.reliability if rubric else None,
        "cost": rubric.cost if rubric else None,
        "safety": rubric.safety if rubric else None,
        "deductions": clean_json([d.model_dump(mode="json") for d in rubric.deductions])
        if rubric
        else [],
        "suggestion": clean_text(rubric.suggestion) if rubric else None,
        "raw_answer": clean_text(j.raw_answer) if j.raw_answer is not None else None,
        "created_at": utcnow(),
    }


def write_qc_run(
    engine: Engine,
    *,
    run_id: uuid.UUID,
    report: GateReport,
    judgements: Sequence[Judgement],
    docs_key: str | None,
    started_at: datetime,
    qc_run_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """One transaction: the `qc_run`, a `qc_result` per episode, every judgement."""
    qc_run_id = qc_run_id or uuid.uuid4()
    counts = report.counts
    now = utcnow()
    results = [
        {
            "qc_run_id": qc_run_id,
            "episode_id": uuid.UUID(v.episode_id),
            "verdict": str(v.verdict),
            "quality_score": v.quality_score,
            "reward_sign": v.reward_sign,
            "reasons": clean_json([r.model_dump(mode="json") for r in v.reasons]),
            "created_at": now,
        }
        for v in report.episode_verdicts()
    ]
    with engine.begin() as conn:
        conn.execute(
            QcRun.__table__.insert().values(  # type: ignore[attr-defined]
                id=qc_run_id,
                run_id=run_id,
                suite_versions=report.suite_versions,
                batch_passed=report.batch_passed,
                batch_failures=clean_json(
                    [c.model_dump(mode="json") for c in report.batch_failures]
                ),
                n_episodes=report.n_episodes,
                n_keep=counts.get("keep", 0),
                n_downweight=counts.get("downweight", 0),
                n_discard=counts.get("discard", 0),
                mean_quality=report.mean_quality,
                docs_key=docs_key,
                triggered_training=False,
                started_at=started_at,
                ended_at=now,
            )
        )
        if results:
            conn.execute(QcResult.__table__.insert(), results)  # type: ignore[attr-defined]
        rows = [judgement_row(j, qc_run_id=qc_run_id) for j in judgements]
        if rows:
            conn.execute(JudgementRow.__table__.insert(), rows)  # type: ignore[attr-defined]
    return qc_run_id


def run_already_triggered(engine: Engine, run_id: uuid.UUID) -> bool:
    """True when an earlier gate run of this collection run triggered training."""
    with engine.connect() as conn:
        found = conn.execute(
            select(func.count()).where(
                col(QcRun.run_id) == run_id, col(QcRun.triggered_training).is_(True)
            )
        ).scalar_one()
    return bool(found)


def volume_since_last_trigger(engine: Engine) -> float:
    """Quality-weighted volume of episodes gated since the last gate run that triggered training.

    Each episode counts once, with its latest quality score.
    """
    with engine.connect() as conn:
        last = conn.execute(
            select(func.max(col(QcRun.ended_at))).where(col(QcRun.triggered_training).is_(True))
        ).scalar_one()
        latest = (
            select(col(QcResult.episode_id), func.max(col(QcResult.created_at)).label("at"))
            .group_by(col(QcResult.episode_id))
            .subquery()
        )
        query = select(func.coalesce(func.sum(col(QcResult.quality_score)), 0.0)).join(
            latest,
            (latest.c.episode_id == col(QcResult.episode_id))
            & (latest.c.at == col(QcResult.created_at)),
        )
        if last is not None:
            query = query.where(col(QcResult.created_at) > last)
        return float(conn.execute(query).scalar_one())


def mark_triggered(engine: Engine, qc_run_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(QcRun).where(col(QcRun.id) == qc_run_id).values(triggered_training=True)
        )


def gated_run_selection(engine: Engine, qc_run: str) -> tuple[uuid.UUID, uuid.UUID]:
    """(QC run id, the collection run it judged) for the QC run id `qc_run`.

    Raises:
        RunNotFound: `qc_run` is not an id, or no QC run has it.
    """
    try:
        qc_id = uuid.UUID(qc_run)
    except ValueError as e:
        raise RunNotFound(f"qc_run {qc_run!r} is not a qc run id", setting="--qc-run") from e
    with engine.connect() as conn:
        run_id: uuid.UUID | None = conn.execute(
            select(col(QcRun.run_id)).where(col(QcRun.id) == qc_id)
        ).scalar_one_or_none()
    if run_id is None:
        raise RunNotFound(f"no qc run {qc_run}", setting="--qc-run")
    return qc_id, run_id
