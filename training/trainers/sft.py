"""SFT through TRL: assistant-only loss on chat snapshots, weighted sampling by quality score.

Chat snapshots (`sft`, `distill`) train on assistant turns only: TRL swaps the tokenizer's
verbatim `qwen2_5.jinja` for its `{% generation %}` twin and masks system, task and
observation tokens. Plain-text snapshots (`cpt`) train on every token.

Quality scores become sampling weights: the train sampler draws rows with probability
proportional to their `weight` column (with replacement, seeded), so a downweighted
episode is seen less often rather than with a scaled loss. `template_weights` multiplies
them per task template (the data mix: a template that takes longer to learn is drawn
more often).

On CPU the loss comes from a plain forward (backbone, then the LM head over the trained
positions only) instead of TRL's fused LM head: `training.trainers.cpu_sft_loss`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.settings import TrainingSettings
from training.trainers.common import Algo, TrainJob, TrainResult, base_args, module, train_with

__all__ = ["run_sft", "sft_config"]


def sft_config(settings: TrainingSettings, output_dir: Path, *, conversational: bool) -> Any:
    """The `SFTConfig` for these settings."""
    return module("trl").SFTConfig(
        **base_args(settings, output_dir, learning_rate=settings.sft_learning_rate),
        max_length=settings.max_length,
        assistant_only_loss=conversational,
        packing=False,
        dataset_num_proc=None,
        include_num_input_tokens_seen="non_padding",
    )


def _weighted_trainer_class() -> Any:
    import torch

    from training.trainers.cpu_sft_loss import PlainSFTLossMixin

    class WeightedSFTTrainer(PlainSFTLossMixin, module("trl").SFTTrainer):  # type: ignore[misc]
        """`SFTTrainer` whose train sampler draws rows in proportion to their weights and
        whose loss, on CPU, skips TRL's fused LM head (`training.trainers.cpu_sft_loss`)."""

        def __init__(self, *args: Any, sample_weights: list[float], seed: int, **kwargs: Any):
            self._sample_weights = sample_weights
            self._sample_seed = seed
            super().__init__(*args, **kwargs)

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            weights = self._sample_weights
            if all(w == weights[0] for w in weights):
                return super()._get_train_sampler(train_dataset)
            generator = torch.Generator().manual_seed(self._sample_seed)
            return torch.utils.data.WeightedRandomSampler(
                weights,
                num_samples=len(self._sample_weights),
                replacement=True,
                generator=generator,
            )

    return WeightedSFTTrainer


def run_sft(rows: list[dict[str, Any]], job: TrainJob) -> TrainResult:
    """Train on `rows` (`messages` or `text` column, optional `weight`); save to `job.output_dir`.

    Raises:
        TrainerError: unusable rows or a failure inside the trainer.
    """
    from datasets import Dataset

    from training.errors import TrainerError

    conversational = "messages" in rows[0]
    if not conversational and "text" not in rows[0]:
        raise TrainerError("an SFT dataset needs a `messages` (chat) or a `text` column")
    column = "messages" if conversational else "text"
    settings = job.settings
    weights = [
        max(float(r.get("weight", 1.0) or 0.0), 0.0)
        * settings.template_weights.get(str(r.get("template")), 1.0)
        for r in rows
    ]
    if not any(weights):
        raise TrainerError("every row of the SFT dataset has weight 0")
    return train_with(
        Algo.SFT,
        _weighted_trainer_class(),
        sft_config(settings, job.output_dir, conversational=conversational),
        Dataset.from_list([{column: r[column]} for r in rows]),
        job,
        n_examples=len(rows),
        sample_weights=weights,
        seed=settings.seed,
    )
