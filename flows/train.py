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
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.runtime import flow_run
from sqlalchemy import Engine, select
from sqlmodel import col

from collection.errors import TrainFlowError
from config.settings import load_settings
from models import Checkpoint, QcRun
from storage.db import make_engine
from storage.exchange import resolve_run
from storage.migrate import ensure_current
from storage.objects import ObjectStore, make_object_store
from suites.registry import load_suite
from training.base_model import protocol_corpus
from training.pipeline import (
    DEFAULT_KIND,
    prepare_base_for_snapshot,
    prepare_base_model,
    train_checkpoint,
)
from training.recipes import get_recipe
from training.settings import TrainingSettings
from training.snapshots import build_snapshot
from training.trainers import Algo


def newest_base_model(engine: Engine) -> uuid.UUID | None:
    with engine.connect() as conn:
        found = conn.execute(
            select(col(Checkpoint.id))
            .where(col(Checkpoint.training_run_id).is_(None))
            .order_by(col(Checkpoint.created_at).desc())
            .limit(1)
        ).scalar_one_or_none()
    return found


def ensure_base_model(
    engine: Engine, store: ObjectStore, settings: TrainingSettings, work: Path
) -> uuid.UUID:
    """The newest registered base model, or a new tiny one built from the protocol corpus."""
    found = newest_base_model(engine)
    if found is not None:
        return found
    tasks = load_suite("builtin").instances(2)
    return prepare_base_model(
        engine, store, work_dir=work, corpus=protocol_corpus(tasks), settings=settings
    )


def _qc_run(engine: Engine, qc_run: str) -> tuple[uuid.UUID, uuid.UUID]:
    try:
        qc_id = uuid.UUID(qc_run)
    except ValueError as e:
        raise TrainFlowError(f"qc_run {qc_run!r} is not a qc run id") from e
    with engine.connect() as conn:
        run_id = conn.execute(
            select(col(QcRun.run_id)).where(col(QcRun.id) == qc_id)
        ).scalar_one_or_none()
    if run_id is None:
        raise TrainFlowError(f"no qc run {qc_run}")
    return qc_id, run_id


@flow(name="train", log_prints=True, persist_result=True)
async def train(
    algo: str = "sft",
    dataset: str | None = None,
    from_run: str | None = None,
    qc_run: str | list[str] | None = None,
    base_checkpoint: str | None = None,
    max_steps: int | None = None,
    evaluate_instances: int = 0,
    recipe: str | None = None,
) -> dict[str, Any]:
    """Train `algo` (sft, dpo, kto, grpo) and register the checkpoint.

    Exactly one of `dataset` (snapshot id), `from_run` (run key or id) or `qc_run` (gate
    run id, or several: e.g. an oracle and a noisy collection gated separately) selects
    the data. `recipe` (`training.recipes`: `loop`, `demo`) sets the model shape, prompt
    style, schedule and time budget; without `base_checkpoint` it builds a base model for
    the snapshot (tokenizer from its texts, copy warm-up). With `evaluate_instances > 0`
    the `evaluate` flow runs on the new checkpoint afterwards.
    """
    logger = get_run_logger()
    if sum(x is not None for x in (dataset, from_run, qc_run)) != 1:
        raise TrainFlowError("give exactly one of dataset, from_run, qc_run")
    chosen = Algo(algo)
    settings = load_settings()
    training = get_recipe(recipe).training_settings() if recipe else TrainingSettings()
    if max_steps is not None:
        training = training.model_copy(update={"max_steps": max_steps})
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    with tempfile.TemporaryDirectory(prefix="epiflow-train-") as tmp:
        work = Path(tmp)
        if dataset is not None:
            dataset_id = uuid.UUID(dataset)
        else:
            if qc_run is not None:
                gated = [
                    _qc_run(engine, q) for q in ([qc_run] if isinstance(qc_run, str) else qc_run)
                ]
                qc_ids: list[uuid.UUID] | None = [q for q, _ in gated]
                run_ids = [r for _, r in gated]
            else:
                qc_ids, run_ids = None, [resolve_run(engine, str(from_run))]
            info = build_snapshot(
                engine,
                store,
                kind=DEFAULT_KIND[chosen],
                run_ids=run_ids,
                qc_run_id=qc_ids,
                prompt_style=training.prompt_style,
            )
            dataset_id = info.id
            logger.info(
                "snapshot %s: %s rows from %s episodes", info.id, info.n_rows, info.n_episodes
            )
        if base_checkpoint:
            base = uuid.UUID(base_checkpoint)
        elif recipe:
            base = prepare_base_for_snapshot(
                engine, store, dataset_id=dataset_id, work_dir=work, settings=training
            )
        else:
            base = ensure_base_model(engine, store, training, work)
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
    result: dict[str, Any] = {
        "training_run_id": str(outcome.training_run_id),
        "checkpoint_id": str(outcome.checkpoint_id),
        "dataset_id": str(outcome.dataset_id),
        "base_checkpoint_id": str(base),
        "algo": chosen.value,
        "steps": outcome.result.steps,
        "train_loss": outcome.result.train_loss,
        "tokens": outcome.result.tokens,
        "tokens_per_s": outcome.result.tokens_per_s,
    }
    await acreate_markdown_artifact(
        markdown="# Training run\n\n"
        + "\n".join(f"- **{k}**: {v}" for k, v in result.items())
        + "\n",
        key=f"train-{str(outcome.training_run_id)[:8]}",
        description="Training run",
    )
    engine.dispose()
    if evaluate_instances > 0:
        from flows.evaluate import evaluate

        result["evaluation"] = await evaluate(
            checkpoint=result["checkpoint_id"], instances=evaluate_instances
        )
    return result
