"""Train end to end: snapshot → trainer → checkpoint, with the SQL bookkeeping (what `flows/train` calls).

`prepare_base_model` builds the local base model and registers it as a checkpoint (no
training run). `train_checkpoint` (= `train_model` + `register_checkpoint`, the train
flow's two stages) trains on a stored snapshot from a base checkpoint (or
any local HF directory), writes the `training_run` row (running → completed / failed),
uploads the checkpoint with its training config, and returns the ids and the metrics.
Every step is a plain function; the flow wraps them as tasks.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel
from sqlalchemy import Engine

from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec
from storage.objects import ObjectStore
from training.base_model import build_base_model
from training.builders import DatasetKind
from training.errors import TrainerError
from training.pretrain import warm_up_copying
from training.registry import (
    fail_training_run,
    fetch_checkpoint,
    finish_training_run,
    register_base_model,
    save_checkpoint,
    start_training_run,
)
from training.rewards import RewardFunction
from training.settings import TrainingSettings
from training.snapshots import fetch_snapshot, get_snapshot, read_snapshot
from training.token_budget import TokenBudget
from training.trainers import Algo, TrainResult, run_training
from training.training_config import build_training_config

if TYPE_CHECKING:
    from training.callbacks import MetricsHook

__all__ = [
    "COMPATIBLE_KINDS",
    "DEFAULT_KIND",
    "TrainedModel",
    "TrainingOutcome",
    "prepare_base_for_snapshot",
    "prepare_base_model",
    "register_checkpoint",
    "snapshot_corpus",
    "train_checkpoint",
    "train_model",
]

COMPATIBLE_KINDS: dict[Algo, tuple[DatasetKind, ...]] = {
    Algo.SFT: (DatasetKind.SFT, DatasetKind.DISTILL, DatasetKind.CPT),
    Algo.DPO: (DatasetKind.DPO,),
    Algo.KTO: (DatasetKind.KTO,),
    Algo.GRPO: (DatasetKind.GRPO,),
}
"""Snapshot kinds each algorithm trains on."""

DEFAULT_KIND: dict[Algo, DatasetKind] = {
    Algo.SFT: DatasetKind.SFT,
    Algo.DPO: DatasetKind.DPO,
    Algo.KTO: DatasetKind.KTO,
    Algo.GRPO: DatasetKind.GRPO,
}
"""Snapshot kind to build for an algorithm when training straight from a collection run."""


class TrainingOutcome(BaseModel):
    """What `train_checkpoint` produced."""

    training_run_id: uuid.UUID
    """The `training_run` row."""
    checkpoint_id: uuid.UUID
    """The new checkpoint."""
    dataset_id: uuid.UUID
    """Snapshot trained on."""
    result: TrainResult
    """Steps, loss, tokens, metrics."""


def prepare_base_model(
    engine: Engine,
    store: ObjectStore,
    *,
    work_dir: Path,
    corpus: Iterable[str],
    settings: TrainingSettings,
    tools: Sequence[ToolSpec] | None = None,
    on_metrics: MetricsHook | None = None,
) -> uuid.UUID:
    """Build the tiny local base model from `corpus` and register it; returns its checkpoint id.

    With `settings.copy_warmup_s`, the fresh model is first warmed up on synthetic copying
    (`training.pretrain`) and the warmed model is registered; the warm-up's numbers are
    the checkpoint's metrics.
    """
    texts = list(corpus)
    model_dir = build_base_model(work_dir / "base_model", texts, settings=settings)
    metrics: dict[str, object] = {}
    if settings.copy_warmup_s or settings.copy_warmup_steps:
        warm = warm_up_copying(
            model_dir,
            texts,
            output_dir=work_dir / "base_model_warm",
            settings=settings,
            on_metrics=on_metrics,
        )
        model_dir = warm.output_dir
        metrics = {"copy_warmup": warm.model_dump(mode="json", exclude={"output_dir"})}
    config = build_training_config(
        model_dir,
        tools=tools if tools is not None else list(BUILTIN_TOOLS.values()),
        settings=settings,
    )
    return register_base_model(engine, store, model_dir, config=config, metrics=metrics)


class TrainedModel(BaseModel):
    """A model trained and not registered yet (between `train_model` and
    `register_checkpoint`); its `training_run` row is `running`."""

    training_run_id: uuid.UUID
    """The `training_run` row."""
    dataset_id: uuid.UUID
    """Snapshot trained on."""
    algo: Algo
    """Algorithm."""
    base_name: str
    """Base checkpoint id or model directory, as recorded."""
    base_checkpoint_id: uuid.UUID | None
    """The base checkpoint (None for a local directory)."""
    result: TrainResult
    """Steps, loss, tokens, metrics, the model directory."""
    settings: TrainingSettings | None = None
    """The settings the trainer ran with, where it derived some from the caller's
    (agentic GRPO's batch from a token budget): `register_checkpoint` records these. None:
    the caller's."""
    token_budget: TokenBudget | None = None
    """Agentic GRPO's token budget as groups per step (None: no budget)."""


def train_checkpoint(
    engine: Engine,
    store: ObjectStore,
    *,
    algo: Algo | str,
    dataset_id: uuid.UUID,
    work_dir: Path,
    settings: TrainingSettings,
    base_checkpoint_id: uuid.UUID | None = None,
    base_model_dir: Path | None = None,
    reward_fn: RewardFunction | Sequence[RewardFunction] | None = None,
    tools: Sequence[ToolSpec] | None = None,
    prefect_flow_run_id: str | None = None,
    on_metrics: MetricsHook | None = None,
) -> TrainingOutcome:
    """Train on snapshot `dataset_id` from a base checkpoint (or a local HF directory) and
    register the checkpoint: `train_model` then `register_checkpoint`.

    Exactly one of `base_checkpoint_id` / `base_model_dir` is given. The training run is
    recorded as failed (with the reason) when training raises — or is cancelled or
    interrupted: no `training_run` row stays `running`. The snapshot's prompt style must be
    the settings' (`prompt_style`): the model is deployed with the style it is trained
    with. `on_metrics(step, max_steps, logs)` gets every TRL log event
    (`training.callbacks`). GRPO needs `reward_fn` (`run_training`).

    Raises:
        TrainerError: bad algorithm/kind combination, or the trainer failed.
        SnapshotError: the snapshot is missing or corrupt.
        RegistryError, CheckpointNotFound: the base checkpoint cannot be fetched or the
            new one cannot be stored.
    """
    trained = train_model(
        engine,
        store,
        algo=algo,
        dataset_id=dataset_id,
        work_dir=work_dir,
        settings=settings,
        base_checkpoint_id=base_checkpoint_id,
        base_model_dir=base_model_dir,
        reward_fn=reward_fn,
        prefect_flow_run_id=prefect_flow_run_id,
        on_metrics=on_metrics,
    )
    return register_checkpoint(engine, store, trained, settings=settings, tools=tools)


def train_model(
    engine: Engine,
    store: ObjectStore,
    *,
    algo: Algo | str,
    dataset_id: uuid.UUID,
    work_dir: Path,
    settings: TrainingSettings,
    base_checkpoint_id: uuid.UUID | None = None,
    base_model_dir: Path | None = None,
    reward_fn: RewardFunction | Sequence[RewardFunction] | None = None,
    prefect_flow_run_id: str | None = None,
    on_metrics: MetricsHook | None = None,
    stop: threading.Event | None = None,
) -> TrainedModel:
    """The training half of `train_checkpoint`: the `training_run` row (running) and the
    trained model in `work_dir/model`; the row is closed failed if training does not end.
    Setting `stop` ends training at its next micro-batch (`TrainingStopped`).

    Raises:
        TrainerError, SnapshotError, RegistryError, CheckpointNotFound: as `train_checkpoint`.
    """
    if (base_checkpoint_id is None) == (base_model_dir is None):
        raise TrainerError("give exactly one of base_checkpoint_id and base_model_dir")
    try:
        chosen = Algo(algo)
    except ValueError as e:
        raise TrainerError(f"unknown training algorithm {algo!r}") from e
    info = get_snapshot(engine, dataset_id)
    if info.kind not in COMPATIBLE_KINDS[chosen]:
        allowed = ", ".join(k.value for k in COMPATIBLE_KINDS[chosen])
        raise TrainerError(f"{chosen.value} trains on {allowed} snapshots, not {info.kind.value}")
    if info.kind != DatasetKind.CPT and info.prompt_style != settings.prompt_style:
        raise TrainerError(
            f"snapshot {info.id} holds {info.prompt_style.value}-style prompts but the settings "
            f"train {settings.prompt_style.value} (set EPIFLOW_TRAINING_PROMPT_STYLE="
            f"{info.prompt_style.value}, or build the snapshot with "
            f"prompt_style={settings.prompt_style.value!r})"
        )
    if base_checkpoint_id is not None:
        base_dir = fetch_checkpoint(engine, store, base_checkpoint_id, work_dir / "base")
        base_name = str(base_checkpoint_id)
    else:
        assert base_model_dir is not None
        base_dir, base_name = base_model_dir, str(base_model_dir)
    run_id = start_training_run(
        engine,
        dataset_id=info.id,
        algo=chosen.value,
        base_model=base_name,
        config=settings.model_dump(mode="json"),
        prefect_flow_run_id=prefect_flow_run_id,
    )
    try:
        parquet = fetch_snapshot(store, info, work_dir / "dataset.parquet")
        result = run_training(
            chosen,
            dataset=parquet,
            base_model_dir=base_dir,
            output_dir=work_dir / "model",
            settings=settings,
            reward_fn=reward_fn,
            on_metrics=on_metrics,
            stop=stop,
        )
    except BaseException as e:  # cancelled or interrupted runs are closed too
        fail_training_run(engine, run_id, error=f"{type(e).__name__}: {e}")
        raise
    return TrainedModel(
        training_run_id=run_id,
        dataset_id=info.id,
        algo=chosen,
        base_name=base_name,
        base_checkpoint_id=base_checkpoint_id,
        result=result,
    )


def register_checkpoint(
    engine: Engine,
    store: ObjectStore,
    trained: TrainedModel,
    *,
    settings: TrainingSettings,
    tools: Sequence[ToolSpec] | None = None,
) -> TrainingOutcome:
    """The registration half of `train_checkpoint`: the training config, the checkpoint
    uploaded and its row, the `training_run` row completed (failed if this raises). The
    config records `trained.settings` where the trainer derived its own, else `settings`.

    Raises:
        RegistryError: the checkpoint cannot be stored.
    """
    info = get_snapshot(engine, trained.dataset_id)
    result = trained.result
    try:
        config = build_training_config(
            result.output_dir,
            tools=tools if tools is not None else list(BUILTIN_TOOLS.values()),
            settings=trained.settings if trained.settings is not None else settings,
            algo=trained.algo.value,
            base_model=trained.base_name,
            dataset_id=info.id,
            dataset_kind=info.kind.value,
            dataset_sha256=info.sha256,
        )
        metrics = result.model_dump(mode="json", exclude={"output_dir"})
        checkpoint_id = save_checkpoint(
            engine,
            store,
            training_run_id=trained.training_run_id,
            model_dir=result.output_dir,
            config=config,
            parent_checkpoint_id=trained.base_checkpoint_id,
            metrics=metrics,
        )
    except BaseException as e:
        fail_training_run(engine, trained.training_run_id, error=f"{type(e).__name__}: {e}")
        raise
    finish_training_run(engine, trained.training_run_id, metrics=metrics)
    return TrainingOutcome(
        training_run_id=trained.training_run_id,
        checkpoint_id=checkpoint_id,
        dataset_id=info.id,
        result=result,
    )


def ensure_base_model(
    engine: Engine, store: ObjectStore, settings: TrainingSettings, work: Path
) -> uuid.UUID:
    """The newest registered base model, or a new tiny one built from the protocol corpus of
    the built-in suite (no download, ever)."""
    from suites.builtin import builtin_suite
    from training.base_model import protocol_corpus
    from training.registry import newest_base_model

    found = newest_base_model(engine)
    if found is not None:
        return found
    tasks = builtin_suite().instances(2)
    return prepare_base_model(
        engine, store, work_dir=work, corpus=protocol_corpus(tasks), settings=settings
    )


def snapshot_corpus(store: ObjectStore, dataset_id: uuid.UUID, engine: Engine) -> list[str]:
    """Every text a snapshot's chats hold (system prompts, tasks, turns, observations): the
    tokenizer corpus of a base model built for that data."""
    info = get_snapshot(engine, dataset_id)
    frame = read_snapshot(store, info)
    texts: set[str] = set()
    for column in ("messages", "prompt", "chosen", "rejected", "completion"):
        if column in frame.columns:
            for chat in frame[column].to_list():
                texts.update(str(m["content"]) for m in chat if m.get("content"))
    if "text" in frame.columns:
        texts.update(str(t) for t in frame["text"].to_list())
    # Sorted: the tokenizer (and so the model) must not depend on set order.
    return sorted(texts)


def prepare_base_for_snapshot(
    engine: Engine,
    store: ObjectStore,
    *,
    dataset_id: uuid.UUID,
    work_dir: Path,
    settings: TrainingSettings,
    on_metrics: MetricsHook | None = None,
) -> uuid.UUID:
    """A base model built for the data it will be trained on: tokenizer from the snapshot's
    texts, the settings' shape, architecture and split, the copy warm-up when set.

    What a recipe's training uses when no base checkpoint is given: a registered base
    built under other settings (another tokenizer split or prompt style) would not fit.
    """
    return prepare_base_model(
        engine,
        store,
        work_dir=work_dir,
        corpus=snapshot_corpus(store, dataset_id, engine),
        settings=settings,
        on_metrics=on_metrics,
    )
