"""TRL trainers behind one entry point: `run_training(algo, …) -> TrainResult`.

| algo | dataset kinds | trainer |
|---|---|---|
| `sft` | `sft`, `distill` (chat, assistant-only loss), `cpt` (plain text) | `SFTTrainer`, weighted sampling |
| `dpo` | `dpo` | `DPOTrainer`, explicit frozen reference |
| `kto` | `kto` | `KTOTrainer`, explicit frozen reference |
| `grpo` | `grpo` | `GRPOTrainer`, online rollouts rewarded in the sandbox |
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from training.errors import TrainerError
from training.rewards import RewardFunction
from training.settings import TrainingSettings
from training.trainers.common import Algo, TrainJob, TrainResult, read_rows

if TYPE_CHECKING:
    from training.callbacks import MetricsHook

__all__ = ["Algo", "TrainResult", "run_training", "write_training_config"]


def run_training(
    algo: Algo | str,
    *,
    dataset: Path | pl.DataFrame,
    base_model_dir: Path,
    output_dir: Path,
    settings: TrainingSettings,
    reward_fn: RewardFunction | Sequence[RewardFunction] | None = None,
    ref_model_dir: Path | None = None,
    on_metrics: MetricsHook | None = None,
    stop: threading.Event | None = None,
) -> TrainResult:
    """Train `base_model_dir` on `dataset` (a snapshot's parquet file or frame) with `algo`.

    The trained model and its tokenizer (chat template included) are saved to
    `output_dir`, an HF directory the `hf:` policy loads. `reward_fn` is GRPO's reward,
    required for GRPO and built by the entry point (`training.rewards.SandboxReward` with its
    settings: real sandboxes and verifiers);
    `ref_model_dir` is the frozen reference of DPO, KTO and GRPO (default: the base model).
    `on_metrics(step, max_steps, logs)` is called on every TRL log event (loss, learning
    rate, grad norm, tokens/s, …); nothing is printed on stdout. Setting `stop` ends
    training with `TrainingStopped` at the next micro-batch (`TrainJob.stop`).

    Raises:
        TrainerError: unknown algorithm, unusable dataset, GRPO without `reward_fn`, or a
            failure inside the trainer.
    """
    try:
        chosen = Algo(algo)
    except ValueError as e:
        known = ", ".join(a.value for a in Algo)
        raise TrainerError(f"unknown training algorithm {algo!r} (known: {known})") from e
    rows = read_rows(dataset)
    output_dir.mkdir(parents=True, exist_ok=True)
    job = TrainJob(base_model_dir, output_dir, settings, on_metrics, ref_model_dir, stop)
    result = _run(chosen, rows, job, reward_fn)
    write_training_config(output_dir, settings=settings, algo=chosen.value)
    return result


def write_training_config(model_dir: Path, *, settings: TrainingSettings, algo: str | None) -> None:
    """`training_config.json` in `model_dir`, so the directory alone is a complete `hf:` policy
    (its prompt style included); the pipeline's registry upload rewrites it with the
    dataset's lineage."""
    from sandbox.tool_specs import BUILTIN_TOOLS
    from training.training_config import CONFIG_FILE, build_training_config

    config = build_training_config(
        model_dir, tools=list(BUILTIN_TOOLS.values()), settings=settings, algo=algo
    )
    (model_dir / CONFIG_FILE).write_text(config.model_dump_json(indent=2), encoding="utf-8")


def _run(
    chosen: Algo,
    rows: list[dict[str, Any]],
    job: TrainJob,
    reward_fn: RewardFunction | Sequence[RewardFunction] | None,
) -> TrainResult:
    if chosen == Algo.SFT:
        from training.trainers.sft import run_sft

        return run_sft(rows, job)
    if chosen in (Algo.DPO, Algo.KTO):
        from training.trainers.preference import run_preference

        return run_preference(chosen, rows, job)
    from training.trainers.grpo import run_grpo

    if reward_fn is None:
        raise TrainerError(
            "grpo needs reward_fn: the entry point builds it (training.rewards.SandboxReward "
            "with its reward, loop, sandbox and suites settings, or ProtocolReward)"
        )
    reward_fns: list[RewardFunction] = [reward_fn] if callable(reward_fn) else list(reward_fn)
    return run_grpo(rows, job, reward_fns)
