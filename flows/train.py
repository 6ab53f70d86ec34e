"""The `train` flow: dataset snapshot → TRL trainer → checkpoint, rows and metrics.

Thin composition over `training/`. The dataset is a stored snapshot, or one built now from
a collection run (`from_run`) or from the run a QC gate judged (`qc_run`, as the gate's
trigger passes it). Without `base_checkpoint`, the newest base model is used, and one is
built from the protocol corpus when none exists yet (no download, ever).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from config.settings import load_settings
from flows.evaluate import EvaluationResult
from training.errors import DatasetSelectionError
from training.trainers import Algo


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
    evaluation: EvaluationResult | None = None
    """The evaluation that followed (with `evaluate_instances > 0`)."""


@flow(name="train", log_prints=True, persist_result=True)
async def train(
    algo: Algo = Algo.SFT,
    dataset: str | None = None,
    from_run: str | None = None,
    qc_run: str | None = None,
    base_checkpoint: str | None = None,
    max_steps: int | None = None,
    evaluate_instances: int = 0,
) -> TrainFlowResult:
    """Train `algo` (sft, dpo, kto, grpo) and register the checkpoint.

    Exactly one of `dataset` (snapshot id), `from_run` (run key or id) or `qc_run` (gate
    run id) selects the data. With `evaluate_instances > 0` the `evaluate` flow runs on the
    new checkpoint afterwards.
    """
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.qc import gated_run_selection
    from storage.runs import resolve_run
    from training.pipeline import DEFAULT_KIND, ensure_base_model, train_checkpoint
    from training.settings import TrainingSettings
    from training.snapshots import build_snapshot

    logger = get_run_logger()
    if sum(x is not None for x in (dataset, from_run, qc_run)) != 1:
        raise DatasetSelectionError(
            "give exactly one of dataset, from_run, qc_run", setting="--dataset"
        )
    chosen = Algo(algo)
    settings = load_settings()
    training = TrainingSettings()
    if max_steps is not None:
        training = training.model_copy(update={"max_steps": max_steps})
    engine = make_engine(settings.database)
    try:
        ensure_current(engine)
        store = make_object_store(settings.objects)
        with tempfile.TemporaryDirectory(prefix="epiflow-train-") as tmp:
            work = Path(tmp)
            if dataset is not None:
                dataset_id = uuid.UUID(dataset)
            else:
                if qc_run is not None:
                    qc_id, run_id = gated_run_selection(engine, qc_run)
                else:
                    qc_id, run_id = None, resolve_run(engine, str(from_run))
                info = build_snapshot(
                    engine, store, kind=DEFAULT_KIND[chosen], run_ids=[run_id], qc_run_id=qc_id
                )
                dataset_id = info.id
                logger.info(
                    "snapshot %s: %s rows from %s episodes", info.id, info.n_rows, info.n_episodes
                )
            base = (
                uuid.UUID(base_checkpoint)
                if base_checkpoint
                else ensure_base_model(engine, store, training, work)
            )
            outcome = train_checkpoint(
                engine,
                store,
                algo=chosen,
                dataset_id=dataset_id,
                work_dir=work,
                settings=training,
                base_checkpoint_id=base,
                prefect_flow_run_id=str(flow_run.id) if flow_run.id else None,
            )
    finally:
        engine.dispose()
    result = TrainFlowResult(
        training_run_id=outcome.training_run_id,
        checkpoint_id=outcome.checkpoint_id,
        dataset_id=outcome.dataset_id,
        base_checkpoint_id=base,
        algo=chosen,
        steps=outcome.result.steps,
        train_loss=outcome.result.train_loss,
        tokens=outcome.result.tokens,
        tokens_per_s=outcome.result.tokens_per_s,
    )
    await acreate_markdown_artifact(
        markdown="# Training run\n\n"
        + "\n".join(f"- **{k}**: {v}" for k, v in result.model_dump(mode="json").items())
        + "\n",
        key=f"train-{str(outcome.training_run_id)[:8]}",
        description="Training run",
    )
    if evaluate_instances > 0:
        from flows.evaluate import evaluate

        result.evaluation = await evaluate(
            checkpoint=str(result.checkpoint_id), instances=evaluate_instances
        )
    return result
