"""Gather a `RunReport` for `epiflow report`: SQL rows plus trajectories from the object store.

Counts and distributions come from the rows (the SQL contract is the source of truth);
each episode's steps come from its trajectory object, so the page shows exactly what was
stored. Gate outcomes are those of the latest `qc_run` over the collection run.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlmodel import Session, col
from sqlmodel import select as select_entity

from agent.trajectory import Trajectory, utcnow
from models import CollectionRun, Episode, QcResult, QcRun, Step
from models import Judgement as JudgementRow
from reports.model import (
    DeductionInfo,
    EpisodeEntry,
    JudgementInfo,
    QcRunInfo,
    QcVerdictInfo,
    RunInfo,
    RunReport,
    StatusCount,
    TemplateStats,
    ToolStats,
)
from storage.errors import ObjectStoreError
from storage.exchange import resolve_run
from storage.objects import ObjectStore

RUBRIC_ORDER = ("completion", "tool_correctness", "reliability", "cost", "safety")
"""Column order of the judge scores (the rubric's dimension order)."""


def gather_report(engine: Engine, store: ObjectStore, run: str) -> RunReport:
    """Everything the report shows about run `run` (key or id).

    Raises:
        CollectError: no collection run has that key or id.
        DatabaseError: the database cannot be read.
    """
    run_id = resolve_run(engine, run)
    with Session(engine) as session:
        run_row = session.get_one(CollectionRun, run_id)
        episodes = list(
            session.exec(
                select_entity(Episode)
                .where(col(Episode.run_id) == run_id)
                .order_by(col(Episode.started_at), col(Episode.id))
            )
        )
        calls = (
            session.connection()
            .execute(
                select(
                    col(Step.tool),
                    col(Step.exit_code),
                    col(Step.error_type),
                    col(Step.timed_out),
                    col(Step.signal),
                )
                .join(Episode, col(Episode.id) == col(Step.episode_id))
                .where(col(Episode.run_id) == run_id, col(Step.parse_kind) == "tool_call")
            )
            .all()
        )
        faults = _step_counts(session, run_id, col(Step.injected_fault_kind))
        perturbations = _step_counts(session, run_id, col(Step.policy_perturbation))
        qc_run = session.exec(
            select_entity(QcRun)
            .where(col(QcRun.run_id) == run_id)
            .order_by(col(QcRun.started_at).desc(), col(QcRun.id))
            .limit(1)
        ).one_or_none()
        verdicts: dict[uuid.UUID, QcVerdictInfo] = {}
        judgements: dict[uuid.UUID, list[JudgementInfo]] = {}
        if qc_run is not None:
            for r in session.exec(
                select_entity(QcResult).where(col(QcResult.qc_run_id) == qc_run.id)
            ):
                verdicts[r.episode_id] = QcVerdictInfo(
                    verdict=r.verdict,
                    quality_score=r.quality_score,
                    reward_sign=r.reward_sign,
                    reasons=[x for x in r.reasons if isinstance(x, dict)],
                )
            for j in session.exec(
                select_entity(JudgementRow)
                .where(col(JudgementRow.qc_run_id) == qc_run.id)
                .order_by(col(JudgementRow.judge), col(JudgementRow.created_at))
            ):
                judgements.setdefault(j.episode_id, []).append(_judgement(j))
        run_info = RunInfo(
            run_id=run_row.id,
            run_key=run_row.run_key,
            suite=run_row.suite,
            policy=run_row.policy_id,
            status=run_row.status,
            started_at=run_row.started_at,
            ended_at=run_row.ended_at,
            parameters=run_row.parameters or {},
            fault_profile=run_row.fault_profile or {},
        )
        qc_info = _qc_run(qc_run) if qc_run is not None else None

    entries = []
    for e in episodes:
        trajectory, error = _load(store, e.trajectory_key)
        entries.append(
            EpisodeEntry(
                episode_id=e.id,
                task_id=e.task_id,
                template=e.template,
                rollout_index=e.rollout_index,
                status=e.status,
                failure_category=e.failure_category,
                failure_reason=e.failure_reason,
                n_steps=e.n_steps,
                total_reward=e.total_reward,
                verifier_score=e.verifier_score,
                duration_ms=e.duration_ms,
                trajectory=trajectory,
                trajectory_error=error,
                qc=verdicts.get(e.id),
                judgements=judgements.get(e.id, []),
            )
        )
    mix = Counter((e.status, e.failure_category) for e in episodes)
    per_template: dict[str, list[bool]] = {}
    for e in episodes:
        per_template.setdefault(e.template, []).append(e.status == "success")
    return RunReport(
        run=run_info,
        generated_at=utcnow(),
        status_mix=[
            StatusCount(status=s, failure_category=f, episodes=n)
            for (s, f), n in sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        templates=[
            TemplateStats(template=t, episodes=len(oks), successes=sum(oks))
            for t, oks in sorted(per_template.items())
        ],
        tools=tool_stats((c.tool, c.exit_code, c.error_type, c.timed_out, c.signal) for c in calls),
        rewards=[e.total_reward for e in episodes if e.total_reward is not None],
        step_counts=[e.n_steps for e in episodes],
        quality_scores=[v.quality_score for v in verdicts.values()],
        injected_faults=faults,
        perturbations=perturbations,
        qc=qc_info,
        episodes=entries,
    )


def tool_stats(
    calls: Iterable[tuple[str | None, int | None, str | None, bool | None, int | None]],
) -> list[ToolStats]:
    """Calls and failures per tool from (tool, exit code, error type, timed out, signal).

    A call failed when it timed out, was typed as an error, was killed by a signal or
    exited non-zero: the definition `storage.run_summary` and `episode.n_tool_errors` use.
    """
    total: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for tool, exit_code, error_type, timed_out, signal in calls:
        name = tool or "?"
        total[name] += 1
        if (
            bool(timed_out)
            or error_type is not None
            or signal is not None
            or (exit_code is not None and exit_code != 0)
        ):
            failed[name] += 1
    return [ToolStats(tool=t, calls=total[t], failed=failed[t]) for t in sorted(total)]


def default_report_path(run_key: str) -> Path:
    """`./epiflow-report-<run_key>.html`, the key made safe for a file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_key).strip("._") or "run"
    return Path(f"epiflow-report-{safe}.html")


def _step_counts(session: Session, run_id: uuid.UUID, column: Any) -> dict[str, int]:
    """Steps of the run by a nullable step column's value (NULLs left out)."""
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


def _load(store: ObjectStore, key: str | None) -> tuple[Trajectory | None, str | None]:
    """The trajectory, or why the page cannot show it (the rest of the report still can)."""
    if key is None:
        return None, "no trajectory object was stored for this episode"
    try:
        return Trajectory.model_validate_json(store.get(key)), None
    except ObjectStoreError as e:
        return None, f"trajectory object {key}: {e.user_message()}"
    except ValueError as e:
        return None, f"trajectory object {key} is not a valid trajectory: {str(e).splitlines()[0]}"


def _judgement(j: JudgementRow) -> JudgementInfo:
    deductions = []
    for d in j.deductions:
        if not isinstance(d, dict):
            continue
        deductions.append(
            DeductionInfo(
                dimension=str(d.get("dimension", "?")),
                points=float(d.get("points", 0.0)),
                steps=[int(s) for s in d.get("steps", []) if isinstance(s, int)],
                reason=str(d.get("reason", "")),
                code=str(d.get("code", "")),
            )
        )
    return JudgementInfo(
        judge=j.judge,
        judge_version=j.judge_version,
        parsed=j.parsed,
        parse_error=j.parse_error,
        scores={name: getattr(j, name) for name in RUBRIC_ORDER},
        deductions=deductions,
        suggestion=j.suggestion,
    )


def _qc_run(r: QcRun) -> QcRunInfo:
    return QcRunInfo(
        qc_run_id=r.id,
        started_at=r.started_at,
        batch_passed=r.batch_passed,
        batch_failures=[x for x in r.batch_failures if isinstance(x, dict)],
        n_episodes=r.n_episodes,
        n_keep=r.n_keep,
        n_downweight=r.n_downweight,
        n_discard=r.n_discard,
        mean_quality=r.mean_quality,
        suite_versions=r.suite_versions or {},
    )
