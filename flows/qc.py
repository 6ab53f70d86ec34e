"""The `qc-gate` flow: judge a collection run, run the GX suites, store verdicts, maybe train.

Thin composition: the rule judge once per episode (`scoring`), optionally the LLM judge
(GRM), the gate (`expectations.gate`), rows (`storage.qc`), data docs to the object store,
a Prefect markdown artifact, and the training trigger (`scoring.quality`).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from pydantic import BaseModel

from agent.trajectory import utcnow
from config.settings import load_settings
from expectations.settings import QcConfig
from flows.train import TrainFlowResult

TriggerMode = Literal["deployment", "inline", "none"]
"""`deployment` runs the train deployment when the threshold is crossed, `inline` trains in
the gate's flow run (embedded demo), `none` only records."""
TRIGGER_MODES: tuple[TriggerMode, ...] = ("deployment", "inline", "none")


class TriggeredTraining(BaseModel):
    """The training a gate started: a deployment run, or the inline train flow's result."""

    flow_run_id: str | None = None
    """Flow run of the train deployment (mode `deployment`)."""
    deployment: str | None = None
    """The deployment it runs (mode `deployment`)."""
    result: TrainFlowResult | None = None
    """The train flow's result (mode `inline`)."""


class QcGateResult(BaseModel):
    """What a gate pass decided (the CLI's JSON, the flow's result)."""

    qc_run_id: uuid.UUID
    """Id of the `qc_run` row."""
    batch_passed: bool
    """Whether every batch expectation passed."""
    episodes: int
    """Episodes judged."""
    keep: int
    """Episodes kept."""
    downweight: int
    """Episodes downweighted."""
    discard: int
    """Episodes discarded."""
    mean_quality: float | None
    """Mean quality score."""
    triggered_training: bool
    """Whether this gate started a training."""
    quality_volume_since_last_training: float
    """Quality-weighted volume accumulated since the last triggered training."""
    training_threshold: float
    """The volume that triggers training."""
    docs_key: str | None
    """Object key of the GX data docs index, when built."""
    training: TriggeredTraining | None = None
    """The training this gate started, if any."""

    def summary(self) -> dict[str, object]:
        """The fields `epiflow qc --json` and the demo print."""
        return self.model_dump(
            mode="json",
            include={
                "qc_run_id",
                "batch_passed",
                "episodes",
                "keep",
                "downweight",
                "discard",
                "mean_quality",
                "triggered_training",
            },
        )


@flow(name="qc-gate", log_prints=True, persist_result=True)
async def qc_gate(
    run: str,
    grm: bool = False,
    trigger: TriggerMode = "deployment",
    train_deployment: str = "train/train",
    training_threshold: float | None = None,
    train_max_steps: int | None = None,
) -> QcGateResult:
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
    """
    from expectations.gate import run_gate
    from expectations.report import render_markdown
    from scoring.grm import GrmJudge
    from scoring.quality import should_trigger_training
    from scoring.rule_judge import rule_judgement
    from scoring.settings import GrmSettings
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.qc import (
        mark_triggered,
        run_already_triggered,
        volume_since_last_trigger,
        write_qc_run,
    )
    from storage.runs import resolve_run, run_key_of, run_trajectories

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
    try:
        ensure_current(engine)
        store = make_object_store(settings.objects)
        store.check()
        run_id = resolve_run(engine, run)
        trajectories = run_trajectories(engine, store, run_id)

        rules = [rule_judgement(t, config.judge) for t in trajectories]
        llm = await GrmJudge(GrmSettings()).judge_many(trajectories) if grm else []
        qc_run_id = uuid.uuid4()
        with tempfile.TemporaryDirectory(prefix="epiflow-qc-docs-") as docs:
            report = run_gate(
                trajectories,
                config=config,
                rule_judgements=rules,
                judgements={j.episode_id: j for j in llm} or None,
                docs_dir=Path(docs),
            )
            docs_key = None
            if report.data_docs_index is not None:
                prefix = f"qc/{run_key_of(engine, run_id)}/{qc_run_id}"
                store.put_tree(prefix, Path(docs))
                docs_key = f"{prefix}/{report.data_docs_index.relative_to(docs).as_posix()}"
        write_qc_run(
            engine,
            run_id=run_id,
            report=report,
            judgements=[*rules, *llm],
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
        ) and (trigger != "none")
        training = None
        if fire:
            training = await _trigger(trigger, train_deployment, qc_run_id, train_max_steps)
            mark_triggered(engine, qc_run_id)
            logger.info(
                "quality-weighted volume %.1f ≥ %.1f: training triggered (%s)",
                volume,
                threshold,
                trigger,
            )
    finally:
        engine.dispose()
    counts = report.counts
    result = QcGateResult(
        qc_run_id=qc_run_id,
        batch_passed=report.batch_passed,
        episodes=report.n_episodes,
        keep=counts.get("keep", 0),
        downweight=counts.get("downweight", 0),
        discard=counts.get("discard", 0),
        mean_quality=report.mean_quality,
        triggered_training=fire,
        quality_volume_since_last_training=round(volume, 3),
        training_threshold=threshold,
        docs_key=docs_key,
        training=training,
    )
    markdown = render_markdown(report) + (
        f"\n\nQuality-weighted volume since the last training: **{volume:.1f}** "
        f"(threshold {threshold:.1f}); training triggered: **{fire}**.\n"
    )
    await acreate_markdown_artifact(
        markdown=markdown, key=f"qc-{str(qc_run_id)[:8]}", description="QC gate"
    )
    return result


async def _trigger(
    mode: TriggerMode, deployment: str, qc_run_id: uuid.UUID, max_steps: int | None
) -> TriggeredTraining:
    if mode == "inline":
        from flows.train import train

        return TriggeredTraining(result=await train(qc_run=str(qc_run_id), max_steps=max_steps))
    from prefect.deployments.flow_runs import arun_deployment

    parameters: dict[str, object] = {"qc_run": str(qc_run_id)}
    if max_steps is not None:
        parameters["max_steps"] = max_steps
    flow_run = await arun_deployment(deployment, parameters=parameters, timeout=0)
    return TriggeredTraining(flow_run_id=str(flow_run.id), deployment=deployment)
