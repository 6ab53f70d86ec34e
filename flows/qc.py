"""The `qc-gate` flow: judge a collection run, run the GX suites, store verdicts, maybe train.

Thin composition: rule judge (`scoring`), optional LLM judge (GRM), the gate
(`expectations.gate`), rows (`storage.qc`), data docs to the object store, a Prefect
markdown artifact, and the training trigger (`scoring.quality.should_trigger_training`).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from config.settings import load_settings
from expectations.gate import run_gate
from expectations.report import render_markdown
from expectations.settings import QcConfig
from models import CollectionRun
from scoring.grm import GrmJudge
from scoring.quality import should_trigger_training
from scoring.rule_judge import rule_judgement
from scoring.settings import GrmSettings
from storage.db import make_engine
from storage.exchange import resolve_run, run_trajectories
from storage.migrate import ensure_current
from storage.objects import make_object_store
from storage.qc import (
    mark_triggered,
    run_already_triggered,
    volume_since_last_trigger,
    write_qc_run,
)

TRIGGER_MODES = ("deployment", "inline", "none")


@flow(name="qc-gate", log_prints=True, persist_result=True)
async def qc_gate(
    run: str,
    grm: bool = False,
    trigger: str = "deployment",
    train_deployment: str = "train/train",
    training_threshold: float | None = None,
    train_max_steps: int | None = None,
    train_recipe: str | None = None,
    train_with_qc_runs: list[str] | None = None,
) -> dict[str, Any]:
    """Gate collection run `run` (key or id).

    Args:
        grm: also ask the LLM judge (EPIFLOW_GRM_* settings); its parsed scores replace the
            rule judge's rubric mean in the quality score.
        trigger: `deployment` runs the train deployment when the threshold is crossed,
            `inline` trains in this flow run (embedded demo), `none` only records.
        training_threshold: quality-weighted volume that triggers training; default
            EPIFLOW_QUALITY_TRAINING_TRIGGER_VOLUME.
        train_max_steps: optimizer steps of the triggered training (default from
            EPIFLOW_TRAINING_MAX_STEPS); the demo keeps it small.
        train_recipe: `training.recipes` preset of the triggered training (the demo's
            `demo`: a small model on the compact prompt, with a time budget).
        train_with_qc_runs: other gate runs whose admitted episodes join this one's in
            the triggered training (e.g. a noisy collection gated separately).
    """
    from agent.trajectory import utcnow

    if trigger not in TRIGGER_MODES:
        raise ValueError(f"trigger must be one of {TRIGGER_MODES}, got {trigger!r}")
    logger = get_run_logger()
    started = utcnow()
    settings = load_settings()
    config = QcConfig.from_env()
    threshold = (
        training_threshold
        if training_threshold is not None
        else config.quality.training_trigger_volume
    )
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    store.check()
    run_id = resolve_run(engine, run)
    trajectories = [t for t in run_trajectories(settings, run)]

    judgements = [rule_judgement(t, config.judge) for t in trajectories]
    overrides = {}
    if grm:
        llm = await GrmJudge(GrmSettings()).judge_many(trajectories)
        judgements += llm
        overrides = {j.episode_id: j for j in llm}

    qc_run_id = uuid.uuid4()
    with tempfile.TemporaryDirectory(prefix="epiflow-qc-docs-") as docs:
        report = run_gate(
            trajectories, config=config, judgements=overrides or None, docs_dir=Path(docs)
        )
        docs_key = None
        if report.data_docs_index is not None:
            prefix = f"qc/{_run_key(engine, run_id)}/{qc_run_id}"
            store.put_tree(prefix, Path(docs))
            docs_key = f"{prefix}/{report.data_docs_index.relative_to(docs).as_posix()}"
    write_qc_run(
        engine,
        run_id=run_id,
        report=report,
        judgements=judgements,
        docs_key=docs_key,
        started_at=started,
        qc_run_id=qc_run_id,
    )

    volume = volume_since_last_trigger(engine)
    fire = should_trigger_training(
        volume,
        threshold,
        batch_passed=report.batch_passed,
        already_triggered_for_this_run=run_already_triggered(engine, run_id),
    )
    training: dict[str, Any] | None = None
    if fire and trigger != "none":
        training = await _trigger(
            trigger,
            train_deployment,
            [str(qc_run_id), *(train_with_qc_runs or [])],
            train_max_steps,
            train_recipe,
        )
        mark_triggered(engine, qc_run_id)
        logger.info(
            "quality-weighted volume %.1f ≥ %.1f: training triggered (%s)",
            volume,
            threshold,
            trigger,
        )
    counts = report.counts
    summary: dict[str, Any] = {
        "qc_run_id": str(qc_run_id),
        "batch_passed": report.batch_passed,
        "episodes": report.n_episodes,
        "keep": counts.get("keep", 0),
        "downweight": counts.get("downweight", 0),
        "discard": counts.get("discard", 0),
        "mean_quality": report.mean_quality,
        "triggered_training": bool(fire and trigger != "none"),
        "quality_volume_since_last_training": round(volume, 3),
        "training_threshold": threshold,
        "docs_key": docs_key,
        "training": training,
    }
    markdown = render_markdown(report) + (
        f"\n\nQuality-weighted volume since the last training: **{volume:.1f}** "
        f"(threshold {threshold:.1f}); training triggered: **{summary['triggered_training']}**.\n"
    )
    await acreate_markdown_artifact(
        markdown=markdown, key=f"qc-{str(qc_run_id)[:8]}", description="QC gate"
    )
    engine.dispose()
    return summary


def _run_key(engine: Any, run_id: uuid.UUID) -> str:
    from sqlalchemy import select
    from sqlmodel import col

    with engine.connect() as conn:
        return str(
            conn.execute(
                select(col(CollectionRun.run_key)).where(col(CollectionRun.id) == run_id)
            ).scalar_one()
        )


async def _trigger(
    mode: str,
    deployment: str,
    qc_runs: list[str],
    max_steps: int | None,
    recipe: str | None,
) -> dict[str, Any]:
    qc_run: str | list[str] = qc_runs[0] if len(qc_runs) == 1 else qc_runs
    if mode == "inline":
        from flows.train import train

        result: dict[str, Any] = await train(qc_run=qc_run, max_steps=max_steps, recipe=recipe)
        return result
    from prefect.deployments.flow_runs import arun_deployment

    parameters: dict[str, Any] = {"qc_run": qc_run}
    if max_steps is not None:
        parameters["max_steps"] = max_steps
    if recipe is not None:
        parameters["recipe"] = recipe
    flow_run = await arun_deployment(deployment, parameters=parameters, timeout=0)
    return {"flow_run_id": str(flow_run.id), "deployment": deployment}
