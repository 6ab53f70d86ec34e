"""The `qc-gate` flow: judge a collection run, run the GX suites, store verdicts, maybe train.

Stages as Prefect tasks: `load-episodes`, `rule-judge` (once per episode), `grm-judge`
(the LLM judge, with `grm`; an episode it cannot judge is recorded unscored, the gate goes
on), `features` (polars), `gx-suites` (Great Expectations, off the event loop),
`publish-data-docs` (to the object store), `write-verdicts` (`qc_run`, `qc_result`,
`judgement` rows) and `trigger-training` (the train deployment, or the train flow inline,
when the quality-weighted volume crosses the threshold). The markdown artifact links the
training run it started.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import Trajectory, utcnow
from config.settings import Settings, load_qc_config, load_settings
from expectations.report import GateReport
from expectations.settings import QcConfig
from flows import artifact_key, link_objects, route_library_logs
from flows.evaluate import EvaluationOptions
from flows.train import TrainFlowResult, flow_run_link
from reports.gate_summary import gate_markdown
from scoring.rubric import Judgement

TriggerMode = Literal["deployment", "inline", "none"]
"""`deployment` runs the train deployment when the threshold is crossed, `inline` trains in
the gate's flow run (embedded demo), `none` only records."""
TRIGGER_MODES: tuple[TriggerMode, ...] = ("deployment", "inline", "none")


class GateOptions(BaseModel):
    """How the QC gate judges and when it trains (the `qc-gate` flow's settings, as the
    collect flow hands them on)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    grm: bool = False
    """Also ask the LLM judge (EPIFLOW_GRM_*); its scores replace the rule judge's rubric
    mean in the quality score where they parse."""
    trigger: TriggerMode = "deployment"
    """`deployment` runs the train deployment when the threshold is crossed, `inline` trains
    in the gate's flow run, `none` only records the decision."""
    train_deployment: str = "train/train"
    """Deployment the trigger runs (mode `deployment`)."""
    training_threshold: float | None = Field(default=None, gt=0)
    """Quality-weighted volume since the last training that triggers the next; empty:
    EPIFLOW_QUALITY_TRAINING_TRIGGER_VOLUME."""
    train_max_steps: int | None = Field(default=None, ge=1)
    """Optimizer steps of the triggered training; empty: EPIFLOW_TRAINING_MAX_STEPS."""
    train_max_time_s: float | None = Field(default=None, gt=0)
    """Wall-time budget of the triggered training, seconds; empty: no limit."""
    train_recipe: str | None = None
    """`training.recipes` preset of the triggered training (the demo's `demo`: a small
    model on the compact prompt, its own base model, a time budget); empty: settings only."""
    train_with_qc_runs: tuple[str, ...] = ()
    """Other gate runs whose admitted episodes join this one's in the triggered training
    (e.g. an oracle collection gated separately)."""
    evaluation: EvaluationOptions = EvaluationOptions(instances=1)
    """Held-out evaluation after the triggered training, against the previous checkpoint."""

    def flow_parameters(self) -> dict[str, Any]:
        """These options as `qc_gate` keyword arguments."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class TriggeredTraining(BaseModel):
    """The training a gate started: a deployment run, or the inline train flow's result."""

    flow_run_id: str | None = None
    """Flow run of the training (either mode)."""
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
    grm_unscored: int = 0
    """Episodes the LLM judge could not score (recorded unscored; the rule judge stands)."""
    training: TriggeredTraining | None = None
    """The training this gate started, if any."""
    training_qc_runs: list[uuid.UUID] = Field(default_factory=list)
    """The gate runs whose latest verdicts the volume counted, oldest first: the started
    training's selection (plus `train_with_qc_runs`); empty when no training started."""

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


class LoadedRun(BaseModel):
    """A collection run's trajectories, as the gate's stages receive them."""

    run_id: uuid.UUID
    """The collection run."""
    run_key: str
    """Its key."""
    trajectories: list[Trajectory]
    """Every stored trajectory, in start order."""


@task(name="load-episodes", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def load_episodes(settings: Settings, run: str) -> LoadedRun:
    """Every stored trajectory of run `run` (key or id), from SQL and the object store."""
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.run_reads import read_run_key, resolve_run, run_trajectories

    started = time.monotonic()
    engine = make_engine(settings.database)
    try:

        def load() -> LoadedRun:
            ensure_current(engine)
            store = make_object_store(settings.objects)
            store.check()
            run_id = resolve_run(engine, run)
            return LoadedRun(
                run_id=run_id,
                run_key=read_run_key(engine, run_id),
                trajectories=run_trajectories(engine, store, run_id),
            )

        loaded = await asyncio.to_thread(load)
    finally:
        engine.dispose()
    get_run_logger().info(
        "load-episodes: run %s, %d episodes in %.1f s",
        loaded.run_key,
        len(loaded.trajectories),
        time.monotonic() - started,
    )
    return loaded


@task(name="rule-judge", cache_policy=NONE)
async def rule_judge(loaded: LoadedRun, config: QcConfig) -> list[Judgement]:
    """The deterministic rubric judge, once per episode."""
    from scoring.rule_judge import rule_judgement

    judgements = await asyncio.to_thread(
        lambda: [rule_judgement(t, config.judge) for t in loaded.trajectories]
    )
    means = [j.rubric.mean for j in judgements if j.rubric is not None]
    get_run_logger().info(
        "rule-judge: %d episodes, mean rubric %s",
        len(judgements),
        f"{sum(means) / len(means):.2f} / 5" if means else "-",
    )
    return judgements


@task(name="grm-judge", cache_policy=NONE)
async def grm_judge(loaded: LoadedRun) -> list[Judgement]:
    """The LLM judge: retries inside; what it cannot judge is recorded unscored."""
    from scoring.grm import GrmJudge
    from scoring.settings import GrmSettings

    judgements = await GrmJudge(GrmSettings()).judge_many(loaded.trajectories)
    unscored = sum(not j.parsed for j in judgements)
    get_run_logger().info(
        "grm-judge: %d episodes, %d scored, %d unscored",
        len(judgements),
        len(judgements) - unscored,
        unscored,
    )
    return judgements


@task(name="features", cache_policy=NONE)
async def features_task(
    loaded: LoadedRun,
    config: QcConfig,
    rules: list[Judgement],
    llm: list[Judgement],
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-episode features (polars) with the judges' findings; the step frame."""
    from expectations.gate import gate_features

    features, steps = await asyncio.to_thread(
        lambda: gate_features(
            loaded.trajectories,
            config=config,
            rule_judgements=rules,
            judgements={j.episode_id: j for j in llm} or None,
        )
    )
    get_run_logger().info(
        "features: %d episodes × %d features, %d steps",
        features.height,
        features.width,
        steps.height,
    )
    return features, steps


@task(name="gx-suites", cache_policy=NONE)
async def gx_suites(
    features: pl.DataFrame, steps: pl.DataFrame, config: QcConfig, docs_dir: Path
) -> GateReport:
    """The episode and batch suites in Great Expectations (a worker thread); data docs."""
    from expectations.gate import evaluate_features

    started = time.monotonic()
    report = await asyncio.to_thread(
        lambda: evaluate_features(features, config=config, steps=steps, docs_dir=docs_dir)
    )
    failed = [c.expectation for c in report.batch_checks if not c.success]
    get_run_logger().info(
        "gx-suites: %s in %.1f s; batch %s; %s",
        ", ".join(f"{k} v{v}" for k, v in report.suite_versions.items()),
        time.monotonic() - started,
        "passed" if report.batch_passed else f"FAILED ({', '.join(failed)})",
        ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())),
    )
    return report


@task(name="publish-data-docs", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def publish_data_docs(
    settings: Settings, report: GateReport, run_key: str, qc_run_id: uuid.UUID, docs_dir: Path
) -> str | None:
    """Upload the GX data docs and link them (a link artifact); returns the object key of
    their index (None when none)."""
    from storage.objects import make_object_store

    if report.data_docs_index is None:
        get_run_logger().info("publish-data-docs: no data docs built: skipped")
        return None
    prefix = f"qc/{run_key}/{qc_run_id}"
    store = make_object_store(settings.objects)
    await asyncio.to_thread(store.put_tree, prefix, docs_dir)
    key = f"{prefix}/{report.data_docs_index.relative_to(docs_dir).as_posix()}"
    get_run_logger().info("publish-data-docs: %s", key)
    await link_objects(
        store,
        key,
        artifact=artifact_key("qc-docs", run_key),
        text="Great Expectations data docs",
        description=f"Data docs of the QC gate of run {run_key} (object {key})",
    )
    return key


@task(name="write-verdicts", cache_policy=NONE)
async def write_verdicts(
    settings: Settings,
    loaded: LoadedRun,
    report: GateReport,
    judgements: list[Judgement],
    docs_key: str | None,
    started_at: datetime,
    qc_run_id: uuid.UUID,
) -> None:
    """The `qc_run` row, a `qc_result` per episode and every judgement, in one go."""
    from storage.db import make_engine
    from storage.qc import write_qc_run

    engine = make_engine(settings.database)
    try:
        await asyncio.to_thread(
            lambda: write_qc_run(
                engine,
                run_id=loaded.run_id,
                report=report,
                judgements=judgements,
                docs_key=docs_key,
                started_at=started_at,
                qc_run_id=qc_run_id,
            )
        )
    finally:
        engine.dispose()
    get_run_logger().info(
        "write-verdicts: qc run %s, %d verdicts, %d judgements",
        qc_run_id,
        report.n_episodes,
        len(judgements),
    )


class TriggerDecision(BaseModel):
    """What `trigger-training` decided and started."""

    fire: bool
    """Whether training was started."""
    volume: float
    """Quality-weighted volume since the last triggered training."""
    qc_runs: list[uuid.UUID] = Field(default_factory=list)
    """The gate runs the started training draws on (empty when none started)."""
    training: TriggeredTraining | None = None
    """The training started."""


@task(name="trigger-training", cache_policy=NONE)
async def trigger_training(
    settings: Settings,
    loaded: LoadedRun,
    report: GateReport,
    qc_run_id: uuid.UUID,
    threshold: float,
    options: GateOptions,
) -> TriggerDecision:
    """Start the training when the quality-weighted volume crosses the threshold (once per
    collection run, never on a failed batch, never in mode `none`), on exactly what the
    volume counted: every gate run since the last training, up to this one, each episode
    with its latest verdict."""
    from scoring.quality import should_trigger_training
    from storage.db import make_engine
    from storage.qc import mark_triggered, run_already_triggered, trigger_window

    logger = get_run_logger()
    engine = make_engine(settings.database)
    try:
        window = await asyncio.to_thread(lambda: trigger_window(engine, until=qc_run_id))
        volume = window.volume
        already = await asyncio.to_thread(run_already_triggered, engine, loaded.run_id)
        crossed = should_trigger_training(
            volume,
            threshold,
            batch_passed=report.batch_passed,
            already_triggered_for_this_run=already,
        )
        if not crossed or options.trigger == "none":
            logger.info(
                "trigger-training: volume %.1f / threshold %.1f, batch %s%s: no training",
                volume,
                threshold,
                "passed" if report.batch_passed else "failed",
                "; this run already triggered one" if already else "",
            )
            return TriggerDecision(fire=False, volume=volume)
        gates = list(window.qc_run_ids) or [qc_run_id]
        # Marked before it starts: a training that fails is not re-triggered by the next
        # gate on the same volume (re-run it with `epiflow train --qc-run …`).
        await asyncio.to_thread(mark_triggered, engine, qc_run_id)
    finally:
        engine.dispose()
    logger.info(
        "trigger-training: volume %.1f ≥ %.1f from %d episode(s) of %d gate run(s): "
        "starting the training (%s)",
        volume,
        threshold,
        window.episodes,
        len(gates),
        options.trigger,
    )
    training = await _start_training(options, gates)
    logger.info("trigger-training: training flow run %s", training.flow_run_id)
    return TriggerDecision(fire=True, volume=volume, qc_runs=gates, training=training)


async def _start_training(options: GateOptions, gates: list[uuid.UUID]) -> TriggeredTraining:
    chosen = [str(g) for g in gates]
    chosen += [q for q in options.train_with_qc_runs if q not in chosen]
    qc_runs: str | list[str] = chosen if len(chosen) > 1 else chosen[0]
    if options.trigger == "inline":
        from flows.train import train

        result = await train(
            qc_run=qc_runs,
            max_steps=options.train_max_steps,
            max_time_s=options.train_max_time_s,
            recipe=options.train_recipe,
            evaluation=options.evaluation,
        )
        return TriggeredTraining(flow_run_id=result.flow_run_id, result=result)
    from prefect.deployments.flow_runs import arun_deployment

    parameters: dict[str, object] = {
        "qc_run": qc_runs,
        "evaluation": options.evaluation.model_dump(mode="json"),
    }
    if options.train_max_steps is not None:
        parameters["max_steps"] = options.train_max_steps
    if options.train_max_time_s is not None:
        parameters["max_time_s"] = options.train_max_time_s
    if options.train_recipe is not None:
        parameters["recipe"] = options.train_recipe
    run = await arun_deployment(options.train_deployment, parameters=parameters, timeout=0)
    return TriggeredTraining(flow_run_id=str(run.id), deployment=options.train_deployment)


@flow(name="qc-gate", flow_run_name="qc-{run}", log_prints=False, persist_result=False)
async def qc_gate(
    run: str,
    grm: bool = False,
    trigger: TriggerMode = "deployment",
    train_deployment: str = "train/train",
    training_threshold: float | None = None,
    train_max_steps: int | None = None,
    train_max_time_s: float | None = None,
    train_recipe: str | None = None,
    train_with_qc_runs: list[str] | None = None,
    evaluation: EvaluationOptions = EvaluationOptions(instances=1),  # noqa: B008 - frozen
) -> QcGateResult:
    """Gate collection run `run`: judges, GX suites, verdicts, data docs, training trigger.

    Args:
        run: Key or id of the collection run to gate.
        grm: Also ask the LLM judge (EPIFLOW_GRM_*); its scores replace the rule judge's
            rubric mean in the quality score where they parse.
        trigger: `deployment` runs the train deployment when the threshold is crossed,
            `inline` trains in this flow run, `none` only records the decision.
        train_deployment: Deployment the trigger runs (mode `deployment`).
        training_threshold: Quality-weighted volume since the last training that triggers
            the next (default EPIFLOW_QUALITY_TRAINING_TRIGGER_VOLUME).
        train_max_steps: Optimizer steps of the triggered training (default
            EPIFLOW_TRAINING_MAX_STEPS).
        train_max_time_s: Wall-time budget of the triggered training, seconds.
        train_recipe: `training.recipes` preset of the triggered training (`demo`, `loop`).
        train_with_qc_runs: Other gate runs whose admitted episodes join this one's in the
            triggered training.
        evaluation: Held-out evaluation after the triggered training, against the
            previous checkpoint (instances 0: none).
    """
    route_library_logs()
    options = GateOptions(
        grm=grm,
        trigger=trigger,
        train_deployment=train_deployment,
        training_threshold=training_threshold,
        train_max_steps=train_max_steps,
        train_max_time_s=train_max_time_s,
        train_recipe=train_recipe,
        train_with_qc_runs=tuple(train_with_qc_runs or ()),
        evaluation=evaluation,
    )
    started = utcnow()
    settings = load_settings()
    config = load_qc_config()
    threshold = options.training_threshold or config.quality.training_trigger_volume
    qc_run_id = uuid.uuid4()
    loaded = await load_episodes(settings, run)
    rules = await rule_judge(loaded, config)
    llm = await grm_judge(loaded) if grm else []
    features, steps = await features_task(loaded, config, rules, llm)
    with tempfile.TemporaryDirectory(prefix="epiflow-qc-docs-") as tmp:
        docs = Path(tmp)
        report = await gx_suites(features, steps, config, docs)
        docs_key = await publish_data_docs(settings, report, loaded.run_key, qc_run_id, docs)
    await write_verdicts(settings, loaded, report, [*rules, *llm], docs_key, started, qc_run_id)
    decision = await trigger_training(settings, loaded, report, qc_run_id, threshold, options)
    counts = report.counts
    result = QcGateResult(
        qc_run_id=qc_run_id,
        batch_passed=report.batch_passed,
        episodes=report.n_episodes,
        keep=counts.get("keep", 0),
        downweight=counts.get("downweight", 0),
        discard=counts.get("discard", 0),
        mean_quality=report.mean_quality,
        triggered_training=decision.fire,
        quality_volume_since_last_training=round(decision.volume, 3),
        training_threshold=threshold,
        docs_key=docs_key,
        grm_unscored=sum(not j.parsed for j in llm),
        training=decision.training,
        training_qc_runs=decision.qc_runs,
    )
    await acreate_markdown_artifact(
        markdown=gate_markdown(
            report,
            volume=result.quality_volume_since_last_training,
            threshold=result.training_threshold,
            training_link=(
                flow_run_link(result.training.flow_run_id) if result.training is not None else None
            ),
            training_deployment=result.training.deployment if result.training else None,
            training_qc_runs=result.training_qc_runs,
            grm_unscored=result.grm_unscored,
        ),
        key=artifact_key("qc", loaded.run_key),
        description="QC gate",
    )
    return result
