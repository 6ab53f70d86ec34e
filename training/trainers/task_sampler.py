"""Agentic GRPO's tasks drawn by `training.task_sampling`: a mixin over `GRPOTrainer` (opt-in).

With `TrainingSettings.task_sampling = "success_variance"`, `run_episode_grpo` trains
with `type(…, (TaskSamplerMixin, …, GRPOTrainer), {"task_outcomes": outcomes})`. TRL
(1.16) builds its training data loader with `_get_train_sampler`, a `RepeatSampler`
whose batch shape the rest of the trainer relies on: `generation_batch_size //
num_generations` tasks a generation batch, each repeated `num_generations` times in a
row, the batch repeated `num_iterations × steps_per_generation` times (the micro-batches
and iterations that train on it). The mixin returns a `training.task_sampling.SuccessVarianceSampler`
of the same shape and length instead, which reads each task's template from the
dataset's `template` column and the run's outcomes from `task_outcomes` (the object the
rollout function, `EpisodeRollouts.outcomes`, adds each judged batch to).
"""

from __future__ import annotations

from typing import Any

from training.errors import TrainerError
from training.task_sampling import SuccessVarianceSampler, TaskOutcomes

__all__ = ["TaskSamplerMixin"]


class TaskSamplerMixin:
    """`GRPOTrainer._get_train_sampler` replaced by a `SuccessVarianceSampler`."""

    task_outcomes: TaskOutcomes
    """The run's outcomes per template (set on the class `episode_grpo_trainer` builds)."""

    def _get_train_sampler(self, dataset: Any = None) -> SuccessVarianceSampler:
        trainer: Any = self
        dataset = dataset if dataset is not None else trainer.train_dataset
        if "template" not in dataset.column_names:
            raise TrainerError(
                "task_sampling success_variance needs each task's template "
                "(run_episode_grpo(templates=…))"
            )
        generations = int(trainer.num_generations)
        return SuccessVarianceSampler(
            templates=list(dataset["template"]),
            outcomes=self.task_outcomes,
            groups=int(trainer.args.generation_batch_size) // generations,
            rollouts_per_task=generations,
            batch_repeats=int(trainer.num_iterations) * int(trainer.args.steps_per_generation),
            seed=int(trainer.args.seed),
        )
