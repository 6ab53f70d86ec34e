"""DPO and KTO through TRL, each with an explicit, frozen reference model.

The reference model is loaded from `ref_model_dir` (default: the base model directory)
and passed to the trainer: TRL would otherwise rebuild it from the policy's path, which a
model built in memory does not have. Both use the RL learning rate and `beta` of the
settings (seed 000 §4.4).
"""

from __future__ import annotations

from typing import Any

from training.errors import TrainerError
from training.trainers import common
from training.trainers.common import Algo, TrainJob, TrainResult

__all__ = ["run_preference"]


def _require(rows: list[dict[str, Any]], columns: tuple[str, ...], algo: str) -> None:
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise TrainerError(f"a {algo} dataset needs the columns {', '.join(missing)}")


def _dpo(trl: Any, rows: list[dict[str, Any]], job: TrainJob) -> tuple[Any, Any, Any]:
    """DPOTrainer, its config and dataset: `prompt` / `chosen` / `rejected` rows."""
    from datasets import Dataset

    _require(rows, ("prompt", "chosen", "rejected"), "DPO")
    keys = ("prompt", "chosen", "rejected")
    settings = job.settings
    config = trl.DPOConfig(
        **common.base_args(settings, job.output_dir, learning_rate=settings.rl_learning_rate),
        beta=settings.beta,
        max_length=settings.max_length,
    )
    return trl.DPOTrainer, config, Dataset.from_list([{k: r[k] for k in keys} for r in rows])


def _kto(trl: Any, rows: list[dict[str, Any]], job: TrainJob) -> tuple[Any, Any, Any]:
    """KTOTrainer, its config and dataset: unpaired `prompt` / `completion` / `label` rows
    with both labels present."""
    from datasets import Dataset

    _require(rows, ("prompt", "completion", "label"), "KTO")
    if len({bool(r["label"]) for r in rows}) < 2:
        raise TrainerError("a KTO dataset needs both desirable and undesirable examples")
    settings = job.settings
    config = trl.KTOConfig(
        **common.base_args(settings, job.output_dir, learning_rate=settings.rl_learning_rate),
        beta=settings.beta,
        max_length=settings.max_length,
        desirable_weight=settings.kto_desirable_weight,
        undesirable_weight=settings.kto_undesirable_weight,
    )
    examples = [
        {"prompt": r["prompt"], "completion": r["completion"], "label": bool(r["label"])}
        for r in rows
    ]
    return trl.KTOTrainer, config, Dataset.from_list(examples)


def run_preference(algo: Algo, rows: list[dict[str, Any]], job: TrainJob) -> TrainResult:
    """DPO or KTO on `rows` against a frozen reference (`job.ref_model_dir`, default the
    base model, never rebuilt from a path); save to `job.output_dir`.

    Raises:
        TrainerError: missing columns, a single-label KTO dataset, or a failure in the trainer.
    """
    if algo not in (Algo.DPO, Algo.KTO):
        raise TrainerError(f"{algo.value} is not a preference algorithm (dpo, kto)")
    trainer_cls, config, dataset = (_dpo if algo == Algo.DPO else _kto)(
        common.module("trl"), rows, job
    )
    return common.train_with(
        algo,
        trainer_cls,
        config,
        dataset,
        job,
        n_examples=len(rows),
        ref_model=common.load_frozen(job.ref_model_dir or job.base_model_dir),
    )
