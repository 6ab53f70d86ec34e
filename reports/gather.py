"""Gather a `RunReport` for `epiflow report`: a run's SQL rows plus its trajectories.

Counts and distributions come from the rows (`storage.run_reads`, the SQL contract is the
source of truth); each episode's steps come from its trajectory object, so the page shows
exactly what was stored. Gate outcomes are those of the latest `qc_run` over the run.
This module opens no SQL session itself.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import Engine

from agent.trajectory import INFRASTRUCTURE_STATUSES, UNKNOWN_OUTCOME_STATUSES, Trajectory, utcnow
from models import Judgement as JudgementRow
from models import QcRun
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
from storage.objects import LocalObjectStore, ObjectStore
from storage.run_reads import read_run_rows

RUBRIC_ORDER = ("completion", "tool_correctness", "reliability", "cost", "safety")
"""Column order of the judge scores (the rubric's dimension order)."""


def gather_report(
    engine: Engine, store: ObjectStore, run: str, *, trajectories: bool = True
) -> RunReport:
    """Everything the report shows about run `run` (key or id).

    `trajectories=False` leaves each entry's trajectory unread, for a paged report that
    reads one page's trajectories at a time (`load_trajectories`).

    Raises:
        RunNotFound: no collection run has that key or id.
        DatabaseError: the database cannot be read.
    """
    rows = read_run_rows(engine, run)
    run_row = rows.run
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
    verdicts = {
        eid: QcVerdictInfo(
            verdict=r.verdict,
            quality_score=r.quality_score,
            reward_sign=r.reward_sign,
            reasons=[x for x in r.reasons if isinstance(x, dict)],
        )
        for eid, r in rows.verdicts.items()
    }
    episodes = rows.episodes
    entries = []
    for e in episodes:
        trajectory, error = _load(store, e.trajectory_key) if trajectories else (None, None)
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
                trajectory_key=e.trajectory_key,
                qc=verdicts.get(e.id),
                judgements=[_judgement(j) for j in rows.judgements.get(e.id, [])],
            )
        )
    mix = Counter((e.status, e.failure_category) for e in episodes)
    per_template: dict[str, list[bool]] = {}
    infra = {str(s) for s in INFRASTRUCTURE_STATUSES | UNKNOWN_OUTCOME_STATUSES}
    for e in episodes:
        if e.status not in infra:  # says nothing about the agent (or nobody recorded it)
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
        tools=[ToolStats(tool=t.tool, calls=t.calls, failed=t.failed) for t in rows.tools],
        rewards=[e.total_reward for e in episodes if e.total_reward is not None],
        step_counts=[e.n_steps for e in episodes],
        quality_scores=[v.quality_score for v in verdicts.values()],
        injected_faults=rows.faults,
        perturbations=rows.perturbations,
        qc=_qc_run(rows.qc_run) if rows.qc_run is not None else None,
        episodes=entries,
    )


def load_trajectories(
    store: ObjectStore, entries: Sequence[EpisodeEntry], *, workers: int = 8
) -> list[EpisodeEntry]:
    """`entries` with their trajectories read (concurrently: an S3 store answers each
    read over the network); a trajectory that cannot be read becomes the entry's error."""

    def one(entry: EpisodeEntry) -> EpisodeEntry:
        trajectory, error = _load(store, entry.trajectory_key)
        return entry.model_copy(update={"trajectory": trajectory, "trajectory_error": error})

    if len(entries) <= 1 or workers <= 1 or isinstance(store, LocalObjectStore):
        # A local directory answers at once: threads would only contend for the GIL.
        return [one(e) for e in entries]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, entries))


def default_report_path(run_key: str) -> Path:
    """`./epiflow-report-<run_key>.html`, the key made safe for a file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_key).strip("._") or "run"
    return Path(f"epiflow-report-{safe}.html")


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
