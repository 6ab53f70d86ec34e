"""What every trainer shares: the result type, data loading, common TRL args, and `train_with`.

`train_with` is the one preamble and epilogue of every algorithm: load the tokenizer and
the model from the base directory, build the TRL trainer with epiflow's schedule and
callbacks (wall-time budget, metrics hook, thread tuning; no metric dicts on stdout),
train, save and summarise. Each algorithm module only builds its dataset and config.

TRL, transformers and torch import lazily (seconds each): importing `training` stays cheap
for the CLI and the flows.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import BaseModel, Field

from training.errors import TrainerError
from training.precision import use_bf16
from training.settings import TrainingSettings

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from training.callbacks import MetricsHook

__all__ = [
    "UNBOUNDED_STEPS",
    "Algo",
    "TrainJob",
    "TrainResult",
    "base_args",
    "load_frozen",
    "load_model",
    "load_tokenizer",
    "module",
    "read_rows",
    "saves_dir",
    "summarize",
    "timed_train",
    "train_with",
    "use_bf16",
]

UNBOUNDED_STEPS = 1_000_000_000
"""`max_steps` under a wall-time budget without a step limit: the budget ends training."""


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
    """True when `max_time_s`, not the step count or the epochs, ended training."""
    threads: list[int] = Field(default_factory=list)
    """Intra-op thread counts used, in order (automatic mode may change it mid-run)."""
    bf16: bool = False
    """Whether bf16 autocast was on."""
    cpu_s: float = 0.0
    """CPU time of this process during `trainer.train()` (all threads), seconds:
    `cpu_s / runtime_s` is the share of a core training actually got on a shared machine."""
    warnings: list[str] = Field(default_factory=list)
    """What the logs say went wrong beyond the loss (`training.diagnostics`), one sentence
    each with what to change; also logged as WARNING."""


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


def _from_local(auto_class: str, what: str, path: Path) -> Any:
    """`transformers.<auto_class>.from_pretrained(path)`, local files only (never the hub).

    Raises:
        TrainerError: the directory has nothing loadable of that kind.
    """
    loader = getattr(module("transformers"), auto_class)
    try:
        return loader.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise TrainerError(f"cannot load the {what} from {path}: {e}") from e


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a local HF directory, its chat template replaced by the training
    twin when `training.chat_templates` has one (same rendering, `{% generation %}` marks).

    Raises:
        TrainerError: the directory has no loadable tokenizer.
    """
    from training.chat_templates import training_twin

    tokenizer = _from_local("AutoTokenizer", "tokenizer", path)
    twin = training_twin(getattr(tokenizer, "chat_template", None))
    if twin is not None:
        tokenizer.chat_template = twin
    return tokenizer


def load_model(path: Path) -> Any:
    """A causal LM from a local HF directory, in float32 on CPU (or wherever torch puts it).

    Raises:
        TrainerError: the directory has no loadable model.
    """
    return _from_local("AutoModelForCausalLM", "model", path)


def load_frozen(path: Path) -> Any:
    """A causal LM from a local HF directory in eval mode with no gradients: a reference model."""
    model = load_model(path)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def base_args(
    settings: TrainingSettings, output_dir: Path, *, learning_rate: float
) -> dict[str, Any]:
    """Arguments every TRL config takes, from the settings.

    The learning-rate schedule is epiflow's (`train_with` replaces the trainer's), so
    `lr_scheduler_type` here only names it for the logs.
    """
    max_steps = settings.max_steps
    if max_steps <= 0 and settings.max_time_s is not None:
        max_steps = UNBOUNDED_STEPS
    return {
        # TRL's own directory: intermediate saves (`checkpoint-<step>`). The final model is
        # saved to `output_dir` itself, which stays a clean HF directory to register.
        "output_dir": str(saves_dir(output_dir)),
        "learning_rate": learning_rate,
        "num_train_epochs": settings.epochs,
        "max_steps": max_steps,
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
        "bf16": use_bf16(settings),
        "activation_checkpointing": bool(settings.activation_checkpointing),
    }


def saves_dir(output_dir: Path) -> Path:
    """Where the intermediate saves of a run writing `output_dir` go: a sibling directory,
    so the registry's upload of `output_dir` holds the final model only."""
    return output_dir.parent / f"{output_dir.name}-saves"


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
    **extra: Any,
) -> TrainResult:
    """Save the model and tokenizer to `output_dir`, collect the metrics and the warnings
    the logs give (logged as WARNING)."""
    from training.diagnostics import training_warnings

    trainer.save_model(str(output_dir))
    processing = getattr(trainer, "processing_class", None)
    if processing is not None:
        processing.save_pretrained(str(output_dir))
    metrics: dict[str, float] = {}
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = float(value)
    warnings = training_warnings(trainer.state.log_history)
    for warning in warnings:
        logger.warning("%s: %s", algo.value, warning)
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
        warnings=warnings,
        **extra,
    )


def timed_train(trainer: Any) -> tuple[Any, float]:
    """`trainer.train()` and its wall time.

    Raises:
        TrainerError: training failed (shapes, NaNs, out of memory, …).
    """
    started = time.perf_counter()
    try:
        output = trainer.train()
    except (RuntimeError, ValueError, IndexError, KeyError) as e:
        raise TrainerError(f"{type(trainer).__name__} failed: {e}") from e
    return output, time.perf_counter() - started


def _scheduled(trainer_cls: Any) -> Any:
    """`trainer_cls` with epiflow's learning-rate schedule (`training.callbacks.lr_lambda`)."""

    class Scheduled(trainer_cls):  # type: ignore[misc]
        def __init__(self, *args: Any, lr_schedule: Callable[..., Any], **kwargs: Any) -> None:
            self._lr_schedule = lr_schedule
            super().__init__(*args, **kwargs)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            import torch

            scheduler = getattr(self, "lr_scheduler", None)
            if scheduler is None:
                scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer if optimizer is not None else self.optimizer,
                    self._lr_schedule(num_training_steps),
                )
                self.lr_scheduler = scheduler
            return scheduler

    Scheduled.__name__ = Scheduled.__qualname__ = trainer_cls.__name__
    return Scheduled


@dataclass(frozen=True)
class TrainJob:
    """What every algorithm is given besides its rows: where it starts and writes, under
    which settings, and who hears its metrics."""

    base_model_dir: Path
    """The HF directory trained from (tokenizer and model)."""
    output_dir: Path
    """Where the trained model is saved (a clean HF directory)."""
    settings: TrainingSettings
    """Every knob."""
    on_metrics: MetricsHook | None = None
    """Called on every TRL log event."""
    ref_model_dir: Path | None = None
    """Frozen reference of DPO, KTO and GRPO (None: the base model)."""
    stop: threading.Event | None = None
    """Set by whoever was waiting for the training when it was cancelled: the trainer ends
    with `TrainingStopped` at its next micro-batch (`training.callbacks.StopWhenAsked`)."""


def train_with(
    algo: Algo,
    trainer_cls: Any,
    config: Any,
    dataset: Any,
    job: TrainJob,
    *,
    n_examples: int,
    model: Any = None,
    prepare: Callable[[Any], None] | None = None,
    **trainer_kwargs: Any,
) -> TrainResult:
    """Build `trainer_cls` on the base model, train it under epiflow's rules, save, summarise.

    Shared by every algorithm: the tokenizer and (unless `model` is given) the model come
    from `job.base_model_dir`; the schedule is `lr_scheduler` with `warmup_ratio` and
    `min_lr_ratio` over steps, or over elapsed time under `max_time_s`; training stops at
    the wall-time budget; every log event goes to `on_metrics` and `logging`, none to
    stdout; a progress line reaches the terminal at least every `progress_every_s`
    (`training.callbacks.TrainingProgress`); the heap each optimiser step freed goes back to
    the kernel and every log event carries the process's memory (`MemoryRelease`); the
    thread count follows `torch_threads`. `prepare` sees the trainer before training (e.g.
    to load a reference model). Extra keyword arguments go to the trainer.

    Raises:
        TrainerError: the model, tokenizer or trainer cannot be built, or training failed.
    """
    from transformers import PrinterCallback, ProgressCallback

    from training.callbacks import (
        MemoryRelease,
        MetricsLogger,
        StopWhenAsked,
        ThreadCallback,
        TimedSaves,
        TrainingProgress,
        WallTimeStop,
        lr_lambda,
    )
    from training.threads import ThreadTuner

    settings, base_model_dir = job.settings, job.base_model_dir
    budget = WallTimeStop(settings.max_time_s) if settings.max_time_s is not None else None

    def schedule(total_steps: int) -> Callable[[int], float]:
        return lr_lambda(
            total_steps=total_steps,
            warmup=settings.warmup_ratio,
            kind=settings.lr_scheduler,
            min_ratio=settings.min_lr_ratio,
            budget=budget,
            step_limited=settings.max_steps > 0,
        )

    tokenizer = load_tokenizer(base_model_dir)
    try:
        trainer = _scheduled(trainer_cls)(
            model=model if model is not None else load_model(base_model_dir),
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            lr_schedule=schedule,
            **trainer_kwargs,
        )
    except (ValueError, TypeError, KeyError) as e:
        raise TrainerError(f"cannot set up {trainer_cls.__name__}: {e}") from e
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    tuner = ThreadTuner(settings.torch_threads)
    trainer.add_callback(MemoryRelease())  # before the readers of the log event it adds to
    trainer.add_callback(MetricsLogger(job.on_metrics, budget=budget))
    trainer.add_callback(ThreadCallback(tuner))
    progress = TrainingProgress(
        f"train {algo.value}", every_s=settings.progress_every_s, budget=budget
    )
    trainer.add_callback(progress)
    if budget is not None:
        trainer.add_callback(budget)
    if job.stop is not None:
        trainer.add_callback(StopWhenAsked(job.stop))
    if settings.save_every_s is not None:
        trainer.add_callback(TimedSaves(settings.save_every_s))
    if prepare is not None:
        prepare(trainer)
    tuner.start()
    cpu_started = time.process_time()
    try:
        output, runtime = timed_train(trainer)
    finally:
        tuner.stop()
        progress.close()
    cpu_s = time.process_time() - cpu_started
    return summarize(
        algo,
        trainer,
        output,
        output_dir=job.output_dir,
        runtime_s=runtime,
        tokens=0,
        n_examples=n_examples,
        stopped_by_time=bool(budget is not None and budget.stopped_early),
        threads=tuner.history,
        bf16=bool(config.bf16),
        cpu_s=cpu_s,
    )
