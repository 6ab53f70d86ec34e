"""Persist quality-gate results: `qc_run`, `qc_result` and `judgement` rows; read the trigger state.

The gate itself (`expectations.gate`) is pure; this module is its SQL side.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
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
    """One transaction: the `qc_run`, a `qc_result` per episode, every judgement. Written
    only at the gate's end, so a killed gate leaves no row (only its data docs objects,
    which `storage.orphans` finds)."""
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


@dataclass(frozen=True)
class TriggerWindow:
    """What the volume trigger counted: the gated episodes since the last triggered training."""

    volume: float
    """Quality-weighted volume: each episode once, with its latest quality score."""
    qc_run_ids: tuple[uuid.UUID, ...]
    """The gate runs holding those latest verdicts, oldest first (the training's selection)."""
    episodes: int
    """Distinct episodes counted."""


def trigger_window(engine: Engine, *, until: uuid.UUID | None = None) -> TriggerWindow:
    """The episodes gated after the last gate run that triggered training, up to the end of
    gate run `until` (inclusive; default: everything stored).

    Each episode counts once, with its latest verdict up to that bound. Gates run with
    `--trigger none` count like any other. A gate that ends after `until` is left for the
    next window, so no episode verdict is trained on twice by the trigger.
    """
    with engine.connect() as conn:
        last = conn.execute(
            select(func.max(col(QcRun.ended_at))).where(col(QcRun.triggered_training).is_(True))
        ).scalar_one()
        bound = None
        if until is not None:
            bound = conn.execute(
                select(col(QcRun.ended_at)).where(col(QcRun.id) == until)
            ).scalar_one_or_none()
        inner = select(
            col(QcResult.episode_id), func.max(col(QcResult.created_at)).label("at")
        ).group_by(col(QcResult.episode_id))
        if bound is not None:
            inner = inner.where(col(QcResult.created_at) <= bound)
        latest = inner.subquery()
        query = (
            select(
                col(QcResult.episode_id),
                col(QcResult.qc_run_id),
                col(QcResult.quality_score),
                col(QcRun.ended_at),
            )
            .join(
                latest,
                (latest.c.episode_id == col(QcResult.episode_id))
                & (latest.c.at == col(QcResult.created_at)),
            )
            .join(QcRun, col(QcRun.id) == col(QcResult.qc_run_id))
        )
        if last is not None:
            query = query.where(col(QcResult.created_at) > last)
        rows = conn.execute(query).all()
    chosen: dict[uuid.UUID, tuple[uuid.UUID, float, float]] = {}
    for episode_id, qc_id, quality, ended in rows:
        at = ended.timestamp() if ended is not None else 0.0
        seen = chosen.get(episode_id)
        if seen is None or (at, str(qc_id)) > (seen[2], str(seen[0])):  # a tie: the later gate
            chosen[episode_id] = (qc_id, float(quality or 0.0), at)
    gates: dict[uuid.UUID, float] = {}
    for qc_id, _quality, gate_at in chosen.values():
        gates[qc_id] = gate_at
    return TriggerWindow(
        volume=sum(q for _g, q, _e in chosen.values()),
        qc_run_ids=tuple(sorted(gates, key=lambda g: (gates[g], str(g)))),
        episodes=len(chosen),
    )


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
