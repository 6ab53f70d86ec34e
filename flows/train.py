"""The `train` flow: dataset snapshot → TRL trainer → checkpoint, rows and metrics.

Stages as Prefect tasks: `dataset-snapshot` (a stored snapshot, or one built now from a
collection run, `from_run`, or from the run a QC gate judged, `qc_run`), `base-model` (the
given checkpoint, else the newest base model, built from the protocol corpus when none
exists: no download, ever), `train` (TRL off the event loop; a progress artifact of step /
max steps and a table of loss, learning rate and the process's memory, kept current while
it trains; stops at `max_time_s`) and `register-checkpoint`. `grpo` is agentic GRPO over whole episodes: its `train` stage
runs the rollouts as a collection run keyed by the training run (gated online per batch),
its progress artifact is updated at every optimiser step with the step's reward mean and
std, success rate, KL, grad norm, groups dropped (zero variance, infrastructure, gate) and
tokens/s, and its loss table carries the same figures per step. With `evaluation.instances > 0` the `evaluate`
flow follows as a subflow and the Prefect training artifact links it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags, task
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from config.settings import Settings, load_qc_config, load_settings
from core.scratch import scratch_dir
from core.worker_threads import in_worker_thread
from expectations.settings import QcConfig
from flows import artifact_key, link_objects, route_library_logs
from flows.evaluate import EvaluationOptions, EvaluationResult
from orchestration.automations import NOTIFY_TAG
from training.errors import DatasetSelectionError, TrainerError, TrainingStopped
from training.grpo_figures import TokenRate, grpo_step_figures, is_grpo_step, step_summary
from training.pipeline import TrainedModel
from training.recipes import get_recipe
from training.settings import TrainingSettings
from training.trainers import Algo

LOSS_TABLE_EVERY_S = 15.0
"""How often the loss table artifact gets a new version while training runs, seconds."""


class TrainFlowResult(BaseModel):
    """What a training run produced (the CLI's JSON, the flow's result)."""

    training_run_id: uuid.UUID
    """The `training_run` row."""
    checkpoint_id: uuid.UUID
    """The checkpoint it saved."""
    dataset_id: uuid.UUID
    """The snapshot it trained on."""
    base_checkpoint_id: uuid.UUID
    """The checkpoint it started from."""
    algo: Algo
    """Algorithm."""
    steps: int
    """Optimizer steps taken."""
    train_loss: float | None
    """Mean training loss."""
    tokens: int
    """Tokens trained on."""
    tokens_per_s: float
    """Training throughput."""
    stopped_by_time: bool = False
    """Training ended at `max_time_s`, before its step budget."""
    warnings: list[str] = Field(default_factory=list)
    """What the logs say went wrong beyond the loss, with what to change
    (`training.diagnostics`), e.g. GRPO groups with zero reward variance."""
    flow_run_id: str | None = None
    """The train flow run (for links in the UI)."""
    evaluation: EvaluationResult | None = None
    """The evaluation that followed (with `evaluation.instances > 0`)."""


def flow_run_link(flow_run_id: str | None) -> str:
    """A markdown link to a flow run's page in the Prefect UI (the bare id without a UI)."""
    if not flow_run_id:
        return "-"
    from prefect.utilities.urls import url_for

    url = url_for("flow-run", obj_id=flow_run_id)
    return f"[{flow_run_id}]({url})" if url else f"`{flow_run_id}`"


@task(name="dataset-snapshot", cache_policy=NONE, retries=1, retry_delay_seconds=2)
async def dataset_snapshot(
    settings: Settings,
    algo: Algo,
    dataset: str | None,
    from_run: str | None,
    qc_run: str | list[str] | None,
    training: TrainingSettings,
) -> uuid.UUID:
    """The snapshot to train on: the given id, or one built from a run or from several gate
    runs (identical selections reuse the stored snapshot, so a retry builds nothing twice);
    its prompts in the settings' prompt style."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from storage.qc import gated_run_selection
    from storage.run_reads import resolve_run
    from training.pipeline import DEFAULT_KIND
    from training.snapshots import build_snapshot

    logger = get_run_logger()
    if dataset is not None:
        logger.info("dataset-snapshot: stored snapshot %s", dataset)
        return uuid.UUID(dataset)
    engine = make_engine(settings.database)
    try:
        store = make_object_store(settings.objects)
        qc_ids: list[uuid.UUID] | None = None
        if qc_run is not None:
            gated = [
                await asyncio.to_thread(gated_run_selection, engine, q)
                for q in ([qc_run] if isinstance(qc_run, str) else qc_run)
            ]
            qc_ids, run_ids = [q for q, _ in gated], [r for _, r in gated]
        else:
            run_ids = [await asyncio.to_thread(resolve_run, engine, str(from_run))]
        info = await asyncio.to_thread(
            lambda: build_snapshot(
                engine,
                store,
                kind=DEFAULT_KIND[algo],
                run_ids=run_ids,
                qc_run_id=qc_ids,
                prompt_style=training.prompt_style,
            )
        )
    finally:
        engine.dispose()
    logger.info(
        "dataset-snapshot: %s (%s), %d rows from %d episodes",
        info.id,
        info.kind.value,
        info.n_rows,
        info.n_episodes,
    )
    return info.id


@task(name="base-model", cache_policy=NONE, retries=1, retry_delay_seconds=2)
async def base_model(
    settings: Settings,
    training: TrainingSettings,
    base_checkpoint: str | None,
    work: Path,
    for_dataset: uuid.UUID | None = None,
) -> uuid.UUID:
    """The checkpoint to start from: the given one; else, with `for_dataset` (a recipe), a
    base built for that snapshot (its tokenizer, the recipe's shape, the copy warm-up);
    else the newest base model (built locally from the protocol corpus when there is none)."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.pipeline import ensure_base_model, prepare_base_for_snapshot

    if base_checkpoint:
        get_run_logger().info("base-model: checkpoint %s", base_checkpoint)
        return uuid.UUID(base_checkpoint)
    engine = make_engine(settings.database)
    try:
        store = make_object_store(settings.objects)
        if for_dataset is not None:
            base = await in_worker_thread(
                lambda: prepare_base_for_snapshot(
                    engine, store, dataset_id=for_dataset, work_dir=work, settings=training
                )
            )
        else:
            base = await in_worker_thread(lambda: ensure_base_model(engine, store, training, work))
    finally:
        engine.dispose()
    get_run_logger().info("base-model: checkpoint %s", base)
    return base


class _TrainingMonitor:
    """Turns the trainer's metrics hook (called in the training thread) into a progress
    artifact and a loss table on the flow's event loop. The progress artifact is updated
    at most every second, and at every optimiser step of agentic GRPO (each one is
    seconds to minutes of rollouts), its description then carrying the step's figures
    (`training.grpo_figures`: reward mean and std, success rate, KL, grad norm, groups
    dropped by why, tokens/s); the loss table gets a row per logged step (with those
    figures for GRPO), published every `LOSS_TABLE_EVERY_S`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, progress_id: uuid.UUID, key: str) -> None:
        self.loop = loop
        self.progress_id = progress_id
        self.key = key
        self.rows: list[dict[str, Any]] = []
        self.step = 0
        self.max_steps = 0
        self.figures = ""
        """The latest GRPO step's figures, as the progress artifact shows them."""
        self._token_rate = TokenRate()
        self._last_progress = 0.0
        self._last_table = time.monotonic()
        self._lock = threading.Lock()
        self._pending: list[concurrent.futures.Future[Any]] = []
        self.stop = threading.Event()
        """Set when the flow is cancelled: the training thread stops at its next micro-batch
        (`TrainJob.stop`) or log event."""

    def on_metrics(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        if self.stop.is_set():
            raise TrainingStopped(f"training stopped at step {step}: its flow was cancelled")
        with self._lock:
            self.step, self.max_steps = step, max_steps
            grpo = is_grpo_step(logs)
            figures = grpo_step_figures(logs, self._token_rate(logs)) if grpo else None
            if figures is not None:
                self.figures = step_summary(figures)
            if "loss" in logs:
                row: dict[str, Any] = {
                    "step": step,
                    "loss": round(logs["loss"], 5),
                    "learning_rate": logs.get("learning_rate"),
                    "grad_norm": round(logs["grad_norm"], 5) if "grad_norm" in logs else None,
                    "epoch": logs.get("epoch"),
                    # the training process's memory (`training.callbacks.MemoryRelease`)
                    "rss_gib": logs.get("memory/rss_gib"),
                    "peak_gib": logs.get("memory/peak_gib"),
                }
                self.rows.append(row | (figures or {}))
            now = time.monotonic()
            if grpo or now - self._last_progress >= 1.0 or step >= max_steps:
                self._last_progress = now
                self._submit(self.publish_progress(*self._progress()))
            if now - self._last_table >= LOSS_TABLE_EVERY_S:
                self._last_table = now
                self._submit(self.publish_table())

    def _progress(self) -> tuple[float, str]:
        """The progress artifact's value and description now (the caller holds the lock)."""
        step, max_steps = self.step, self.max_steps
        value = 100.0 * min(step, max_steps) / max_steps if max_steps else 0.0
        described = f"step {step} / {max_steps}"
        return value, f"{described}: {self.figures}" if self.figures else described

    def _submit(self, coroutine: Any) -> None:
        self._pending.append(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    async def publish_progress(self, value: float | None = None, description: str = "") -> None:
        """Update the progress artifact (by default: to what is known now)."""
        if value is None:
            with self._lock:
                value, description = self._progress()
        try:
            await aupdate_progress_artifact(
                self.progress_id, progress=value, description=description
            )
        except Exception as e:  # progress is for the eyes; training goes on
            get_run_logger().warning("progress artifact not updated: %r", e)

    async def publish_table(self) -> None:
        with self._lock:
            rows = list(self.rows)
        if rows:
            await acreate_table_artifact(
                table=rows, key=self.key, description="Loss and learning rate per logged step"
            )

    async def drain(self) -> None:
        """Wait for the updates in flight (they run on this loop)."""
        pending, self._pending = self._pending, []
        for future in pending:
            await asyncio.wrap_future(future)


@task(name="train", cache_policy=NONE, retries=0)
async def train_task(
    settings: Settings,
    training: TrainingSettings,
    algo: Algo,
    dataset_id: uuid.UUID,
    base: uuid.UUID,
    work: Path,
    qc_config: QcConfig | None = None,
    templates: list[str] | None = None,
) -> TrainedModel:
    """Train with TRL in a worker thread (the event loop stays free), publishing progress
    (step / max steps) and the loss table while it runs. `grpo` is agentic GRPO over whole
    episodes (`collection.grpo_training`: rollouts in the sandbox, gated online with
    `qc_config`, on the snapshot's tasks of `templates`)."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.pipeline import train_model

    logger = get_run_logger()
    key = artifact_key("train", str(dataset_id))  # one key per dataset snapshot
    progress = await acreate_progress_artifact(
        progress=0.0, key=key + "-progress", description="starting"
    )
    monitor = _TrainingMonitor(asyncio.get_running_loop(), progress, key=key + "-loss")
    engine = make_engine(settings.database)
    try:
        store = make_object_store(settings.objects)
        flow_run_id = str(flow_run.id) if flow_run.id else None
        if algo is Algo.GRPO:
            from collection.grpo_training import train_grpo_model

            if qc_config is None:
                raise TrainerError("agentic GRPO needs the online QC gate's settings")
            gate = qc_config
            trained = await in_worker_thread(
                lambda: train_grpo_model(
                    engine,
                    store,
                    dataset_id=dataset_id,
                    work_dir=work,
                    training=training,
                    settings=settings,
                    qc_config=gate,
                    base_checkpoint_id=base,
                    templates=templates,
                    prefect_flow_run_id=flow_run_id,
                    on_metrics=monitor.on_metrics,
                    stop=monitor.stop,
                ),
                stop=monitor.stop,
            )
        else:
            trained = await in_worker_thread(
                lambda: train_model(
                    engine,
                    store,
                    algo=algo,
                    dataset_id=dataset_id,
                    work_dir=work,
                    settings=training,
                    base_checkpoint_id=base,
                    prefect_flow_run_id=flow_run_id,
                    on_metrics=monitor.on_metrics,
                    stop=monitor.stop,
                ),
                stop=monitor.stop,
            )
    finally:
        engine.dispose()
        await monitor.drain()
    await monitor.publish_progress()
    await monitor.publish_table()
    result = trained.result
    logger.info(
        "train: %s, %d steps%s, loss %s, %d tokens at %.0f tokens/s in %.1f s",
        algo.value,
        result.steps,
        " (stopped at the wall-time budget)" if result.stopped_by_time else "",
        f"{result.train_loss:.4f}" if result.train_loss is not None else "-",
        result.tokens,
        result.tokens_per_s,
        result.runtime_s,
    )
    return trained


@task(name="register-checkpoint", cache_policy=NONE, retries=0)
async def register_checkpoint_task(
    settings: Settings, training: TrainingSettings, trained: TrainedModel
) -> uuid.UUID:
    """Upload the checkpoint with its training config; close the training run."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.pipeline import register_checkpoint
    from training.registry import checkpoint_prefix

    engine = make_engine(settings.database)
    try:
        store = make_object_store(settings.objects)
        outcome = await asyncio.to_thread(
            lambda: register_checkpoint(engine, store, trained, settings=training)
        )
    finally:
        engine.dispose()
    get_run_logger().info(
        "register-checkpoint: %s (training run %s)", outcome.checkpoint_id, trained.training_run_id
    )
    await link_objects(
        store,
        checkpoint_prefix(outcome.checkpoint_id) + "/",
        artifact=artifact_key("checkpoint", str(outcome.checkpoint_id)),
        text="Checkpoint (the HF model directory)",
        description=f"Checkpoint {outcome.checkpoint_id} of training run {trained.training_run_id}",
    )
    return outcome.checkpoint_id


def training_markdown(result: TrainFlowResult) -> str:
    """The Prefect training artifact: what was trained, and the evaluation run that followed."""
    lines = ["# Training run", ""]
    dumped = result.model_dump(mode="json", exclude={"evaluation", "flow_run_id", "warnings"})
    for k, v in dumped.items():
        lines.append(f"- **{k}**: {v}")
    if result.warnings:
        lines += ["", "## Warnings", ""] + [f"- ⚠ {w}" for w in result.warnings]
    if result.evaluation is not None:
        e = result.evaluation
        lines += [
            "",
            f"Evaluation: {flow_run_link(e.flow_run_id)} — completion {e.completion_rate:.3f}"
            + (
                f" ({e.delta.get('completion_rate', 0.0):+.3f} against the previous checkpoint)"
                if e.previous is not None
                else ""
            ),
        ]
    return "\n".join(lines) + "\n"


@flow(name="train", flow_run_name="train-{algo}", log_prints=False, persist_result=False)
async def train(
    algo: Algo = Algo.SFT,
    dataset: str | None = None,
    from_run: str | None = None,
    qc_run: str | list[str] | None = None,
    base_checkpoint: str | None = None,
    max_steps: int | None = None,
    max_time_s: float | None = None,
    save_steps: int | None = None,
    recipe: str | None = None,
    evaluation: EvaluationOptions = EvaluationOptions(instances=0),  # noqa: B008 - frozen
    templates: list[str] | None = None,
) -> TrainFlowResult:
    """Train with TRL and register the checkpoint; exactly one of `dataset`, `from_run`,
    `qc_run` selects the data.

    Args:
        algo: Training algorithm: sft (supervised), dpo and kto (preferences), grpo (online
            RL over whole episodes in the sandbox, gated per batch; the snapshot gives the
            tasks).
        dataset: Id of a stored dataset snapshot to train on.
        from_run: Build the snapshot from this collection run (key or id).
        qc_run: Build the snapshot from the run this QC gate judged, with its verdicts
            (or from several gate runs, e.g. an oracle and a noisy collection).
        base_checkpoint: Checkpoint to start from (default: the newest base model; with a
            recipe, a base built for the snapshot).
        max_steps: Optimizer steps (default EPIFLOW_TRAINING_MAX_STEPS; -1 trains by epochs).
        max_time_s: Wall-time budget of training, seconds; it stops at the next step once
            spent (default EPIFLOW_TRAINING_MAX_TIME_S: none).
        save_steps: Also save an intermediate checkpoint every N steps.
        recipe: `training.recipes` preset (`demo`, `loop`): model shape, prompt style,
            schedule and time budget; the arguments above still win.
        evaluation: Held-out evaluation of the new checkpoint against the previous one
            afterwards (instances 0: none); with `promote_alias`, against the alias's
            champion, and promoted when the rule says so.
        templates: grpo: train on the snapshot's tasks of these templates only.
    """
    route_library_logs()
    if sum(x is not None for x in (dataset, from_run, qc_run)) != 1:
        raise DatasetSelectionError(
            "give exactly one of dataset, from_run, qc_run", setting="--dataset"
        )
    chosen = Algo(algo)
    settings = load_settings()
    qc_config = load_qc_config() if chosen is Algo.GRPO else None
    overrides = {
        name: value
        for name, value in (
            ("max_steps", max_steps),
            ("max_time_s", max_time_s),
            ("save_steps", save_steps),
        )
        if value is not None
    }
    training = (
        get_recipe(recipe).training_settings(TrainingSettings()) if recipe else TrainingSettings()
    ).model_copy(update=overrides)
    # Removed on any exit; a killed training's folder (model copies) is swept by the next.
    with scratch_dir("epiflow-train-") as work:
        dataset_id = await dataset_snapshot(settings, chosen, dataset, from_run, qc_run, training)
        base = await base_model(
            settings, training, base_checkpoint, work, dataset_id if recipe else None
        )
        trained = await train_task(
            settings, training, chosen, dataset_id, base, work, qc_config, templates
        )
        checkpoint_id = await register_checkpoint_task(settings, training, trained)
    result = TrainFlowResult(
        training_run_id=trained.training_run_id,
        checkpoint_id=checkpoint_id,
        dataset_id=dataset_id,
        base_checkpoint_id=base,
        algo=chosen,
        steps=trained.result.steps,
        train_loss=trained.result.train_loss,
        tokens=trained.result.tokens,
        tokens_per_s=trained.result.tokens_per_s,
        stopped_by_time=trained.result.stopped_by_time,
        warnings=trained.result.warnings,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    if evaluation.instances > 0:
        from flows.evaluate import evaluate

        # Tagged like the evaluate deployment's runs: a failed evaluation is announced.
        with tags(NOTIFY_TAG):
            result.evaluation = await evaluate(
                checkpoint=str(checkpoint_id),
                instances=evaluation.instances,
                suite=evaluation.suite,
                templates=evaluation.templates,
                max_steps=evaluation.max_steps,
                max_new_tokens=evaluation.max_new_tokens,
                promote_alias=evaluation.promote_alias,
                promotion=evaluation.promotion,
            )
    await acreate_markdown_artifact(
        markdown=training_markdown(result),
        key=artifact_key("train", str(dataset_id)),
        description="Training run",
    )
    return result
