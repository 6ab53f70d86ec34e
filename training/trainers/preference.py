"""DPO and KTO through TRL, each with an explicit, frozen reference model.

The reference model is loaded from `ref_model_dir` (default: the base model directory)
and passed to the trainer: TRL would otherwise rebuild it from the policy's path, which a
model built in memory does not have. Both use the RL learning rate and `beta` of the
settings (seed 000 §4.4).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import TrainerError
from training.settings import TrainingSettings
from training.trainers.common import Algo, TrainResult, base_args, load_model, module, train_with

if TYPE_CHECKING:
    from training.callbacks import MetricsHook

__all__ = ["run_dpo", "run_kto"]


def _require(rows: list[dict[str, Any]], columns: tuple[str, ...], algo: str) -> None:
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise TrainerError(f"a {algo} dataset needs the columns {', '.join(missing)}")


def _frozen(path: Path) -> Any:
    model = load_model(path)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def run_dpo(
    rows: list[dict[str, Any]],
    *,
    base_model_dir: Path,
    output_dir: Path,
    settings: TrainingSettings,
    ref_model_dir: Path | None = None,
    on_metrics: MetricsHook | None = None,
) -> TrainResult:
    """DPO on `prompt` / `chosen` / `rejected` rows; save to `output_dir`.

    Raises:
        TrainerError: missing columns or a failure inside the trainer.
    """
    from datasets import Dataset

    trl = module("trl")

    _require(rows, ("prompt", "chosen", "rejected"), "DPO")
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
    )
    config = trl.DPOConfig(
        **base_args(settings, output_dir, learning_rate=settings.rl_learning_rate),
        beta=settings.beta,
        max_length=settings.max_length,
    )
    return _train_against_reference(
        Algo.DPO,
        trl.DPOTrainer,
        config,
        dataset,
        len(rows),
        base_model_dir=base_model_dir,
        ref_model_dir=ref_model_dir,
        output_dir=output_dir,
        settings=settings,
        on_metrics=on_metrics,
    )


def run_kto(
    rows: list[dict[str, Any]],
    *,
    base_model_dir: Path,
    output_dir: Path,
    settings: TrainingSettings,
    ref_model_dir: Path | None = None,
    on_metrics: MetricsHook | None = None,
) -> TrainResult:
    """KTO on unpaired `prompt` / `completion` / `label` rows; save to `output_dir`.

    Raises:
        TrainerError: missing columns, a single-label dataset, or a failure in the trainer.
    """
    from datasets import Dataset

    trl = module("trl")

    _require(rows, ("prompt", "completion", "label"), "KTO")
    labels = {bool(r["label"]) for r in rows}
    if len(labels) < 2:
        raise TrainerError("a KTO dataset needs both desirable and undesirable examples")
    dataset = Dataset.from_list(
        [
            {"prompt": r["prompt"], "completion": r["completion"], "label": bool(r["label"])}
            for r in rows
        ]
    )
    config = trl.KTOConfig(
        **base_args(settings, output_dir, learning_rate=settings.rl_learning_rate),
        beta=settings.beta,
        max_length=settings.max_length,
        desirable_weight=settings.kto_desirable_weight,
        undesirable_weight=settings.kto_undesirable_weight,
    )
    return _train_against_reference(
        Algo.KTO,
        trl.KTOTrainer,
        config,
        dataset,
        len(rows),
        base_model_dir=base_model_dir,
        ref_model_dir=ref_model_dir,
        output_dir=output_dir,
        settings=settings,
        on_metrics=on_metrics,
    )


def _train_against_reference(
    algo: Algo,
    trainer_cls: Any,
    config: Any,
    dataset: Any,
    n_examples: int,
    *,
    base_model_dir: Path,
    ref_model_dir: Path | None,
    output_dir: Path,
    settings: TrainingSettings,
    on_metrics: MetricsHook | None,
) -> TrainResult:
    """Train `trainer_cls` with an explicit frozen reference model (never rebuilt from a path)."""
    return train_with(
        algo,
        trainer_cls,
        config,
        dataset,
        base_model_dir=base_model_dir,
        output_dir=output_dir,
        settings=settings,
        n_examples=n_examples,
        on_metrics=on_metrics,
        ref_model=_frozen(ref_model_dir or base_model_dir),
    )
