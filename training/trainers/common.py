"""What every trainer shares: the result type, data loading, model loading, common TRL args.

TRL, transformers and torch import lazily (seconds each): importing `training` stays cheap
for the CLI and the flows.
"""

from __future__ import annotations

import importlib
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, Field

from training.errors import TrainerError
from training.settings import TrainingSettings

__all__ = [
    "Algo",
    "TrainResult",
    "base_args",
    "load_model",
    "load_tokenizer",
    "module",
    "read_rows",
    "summarize",
    "timed_train",
]


def module(name: str) -> Any:
    """A heavy, partially typed library (trl, transformers), imported on first use and typed loosely."""
    return importlib.import_module(name)


class Algo(StrEnum):
    """Training algorithms."""

    SFT = "sft"
    DPO = "dpo"
    KTO = "kto"
    GRPO = "grpo"


class TrainResult(BaseModel):
    """What a training run produced and measured."""

    algo: Algo
    """Algorithm used."""
    output_dir: Path
    """HF model directory written (model, tokenizer, chat template)."""
    steps: int
    """Optimizer steps taken."""
    train_loss: float | None
    """Mean training loss reported by the trainer."""
    tokens: int
    """Tokens the model was trained on (input tokens seen, padding excluded where known)."""
    runtime_s: float
    """Wall time of `trainer.train()`, seconds."""
    tokens_per_s: float
    """`tokens / runtime_s`."""
    n_examples: int
    """Rows of the training dataset."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Last logged value of every numeric metric (loss, rewards, kl, …)."""
    stopped_by_time: bool = False
    """Training ended at `TrainingSettings.max_time_s`, before its step budget."""


def read_rows(dataset: Path | pl.DataFrame) -> list[dict[str, Any]]:
    """The snapshot's rows from a parquet path or a polars frame.

    Raises:
        TrainerError: the file cannot be read or holds no rows.
    """
    if isinstance(dataset, pl.DataFrame):
        frame = dataset
    else:
        try:
            frame = pl.read_parquet(dataset)
        except (OSError, pl.exceptions.PolarsError) as e:
            raise TrainerError(f"cannot read the dataset {dataset}: {e}") from e
    if frame.height == 0:
        raise TrainerError("the dataset has no rows")
    return frame.to_dicts()


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a local HF directory (never the hub).

    Raises:
        TrainerError: the directory has no loadable tokenizer.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise TrainerError(f"cannot load the tokenizer from {path}: {e}") from e


def load_model(path: Path) -> Any:
    """A causal LM from a local HF directory, in float32 on CPU (or wherever torch puts it).

    Raises:
        TrainerError: the directory has no loadable model.
    """
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise TrainerError(f"cannot load the model from {path}: {e}") from e


def base_args(
    settings: TrainingSettings, output_dir: Path, *, learning_rate: float
) -> dict[str, Any]:
    """Arguments every TRL config takes, from the settings."""
    return {
        "output_dir": str(output_dir),
        "learning_rate": learning_rate,
        "num_train_epochs": settings.epochs,
        "max_steps": settings.max_steps,
        "per_device_train_batch_size": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "warmup_steps": settings.warmup_ratio,
        "weight_decay": settings.weight_decay,
        "max_grad_norm": settings.max_grad_norm,
        "seed": settings.seed,
        "data_seed": settings.seed,
        "logging_steps": settings.logging_steps,
        "save_strategy": "steps" if settings.save_steps else "no",
        "save_steps": settings.save_steps or 500,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": not _accelerator_available(),
        "activation_checkpointing": settings.activation_checkpointing,
    }


def _accelerator_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def summarize(
    algo: Algo,
    trainer: Any,
    output: Any,
    *,
    output_dir: Path,
    runtime_s: float,
    tokens: int,
    n_examples: int,
) -> TrainResult:
    """Save the model and tokenizer to `output_dir` and collect the metrics."""
    trainer.save_model(str(output_dir))
    processing = getattr(trainer, "processing_class", None)
    if processing is not None:
        processing.save_pretrained(str(output_dir))
    metrics: dict[str, float] = {}
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = float(value)
    loss = getattr(output, "training_loss", None)
    if tokens <= 0:
        tokens = int(getattr(trainer.state, "num_input_tokens_seen", 0) or 0)
    if tokens <= 0:
        tokens = int(metrics.get("num_tokens", 0.0))
    return TrainResult(
        algo=algo,
        output_dir=output_dir,
        steps=int(trainer.state.global_step),
        train_loss=float(loss) if loss is not None else None,
        tokens=tokens,
        runtime_s=runtime_s,
        tokens_per_s=tokens / runtime_s if runtime_s > 0 else 0.0,
        n_examples=n_examples,
        metrics=metrics,
        stopped_by_time=bool(getattr(trainer.state, "stopped_by_time", False)),
    )


def timed_train(trainer: Any) -> tuple[Any, float]:
    """`trainer.train()` and its wall time, with the current `training.callbacks` hooks
    (metrics hook, wall-time budget) attached.

    Raises:
        TrainerError: training failed (shapes, NaNs, out of memory, …).
    """
    from training.callbacks import attach

    callback = attach(trainer)
    started = time.perf_counter()
    try:
        output = trainer.train()
    except (RuntimeError, ValueError, IndexError, KeyError) as e:
        raise TrainerError(f"{type(trainer).__name__} failed: {e}") from e
    trainer.state.stopped_by_time = callback.stopped_by_time
    return output, time.perf_counter() - started
