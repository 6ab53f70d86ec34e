"""GRPO through TRL, online: rollouts sampled from the policy, rewarded in the sandbox.

Each `grpo` snapshot row is a task prompt (system prompt + task). TRL samples
`rollouts_per_task` completions per prompt, the reward functions score them
(`training.rewards`: by default the sandbox and the task's verifier), and the group's
normalised rewards are the advantages. KL toward a frozen reference (the base model,
passed explicitly) uses `beta`; the clip range is `clip_epsilon` (seed 000 §4.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.errors import TrainerError
from training.rewards import RewardFunction
from training.trainers.common import (
    Algo,
    TrainJob,
    TrainResult,
    base_args,
    load_model,
    module,
    train_with,
)

__all__ = ["grpo_config", "run_grpo", "use_reference"]

_TASK_COLUMNS = ("task_id", "suite", "template", "instance_seed")


def run_grpo(
    rows: list[dict[str, Any]], job: TrainJob, reward_fns: Sequence[RewardFunction]
) -> TrainResult:
    """GRPO on task-prompt rows with `reward_fns`; save to `job.output_dir`.

    Raises:
        TrainerError: no prompt column, no reward function, or a failure in the trainer.
    """
    from datasets import Dataset

    trl = module("trl")

    if "prompt" not in rows[0]:
        raise TrainerError("a GRPO dataset needs a `prompt` column")
    if not reward_fns:
        raise TrainerError("GRPO needs at least one reward function")
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], **{c: r[c] for c in _TASK_COLUMNS if c in r}} for r in rows]
    )
    settings = job.settings
    config = grpo_config(job)
    reference = job.ref_model_dir if settings.beta > 0 else None
    return train_with(
        Algo.GRPO,
        trl.GRPOTrainer,
        config,
        dataset,
        job,
        n_examples=len(rows),
        prepare=(lambda trainer: use_reference(trainer, reference)) if reference else None,
        reward_funcs=list(reward_fns),
    )


def grpo_config(job: TrainJob) -> Any:
    """TRL's `GRPOConfig` of `job` (the one-turn and the episode GRPO alike): seed 000
    §4.4's knobs from its settings (learning rate, β, ε, rollouts per task). One optimiser
    step consumes `batch_size` completions, rounded down to whole groups, times
    `gradient_accumulation_steps`: TRL generates once per optimiser step (its
    `steps_per_generation` defaults to the accumulation steps) and feeds the generation
    batch to the model in `batch_size` slices; a token budget sets both
    (`training.token_budget.TokenBudget.applied`)."""
    settings = job.settings
    generations = settings.rollouts_per_task
    batch = max(settings.batch_size, generations)
    batch -= batch % generations
    args = base_args(settings, job.output_dir, learning_rate=settings.rl_learning_rate)
    args["per_device_train_batch_size"] = batch
    return module("trl").GRPOConfig(
        **args,
        num_generations=generations,
        max_completion_length=settings.max_completion_length,
        temperature=settings.temperature,
        beta=settings.beta,
        epsilon=settings.clip_epsilon,
        num_iterations=settings.grpo_iterations,
        remove_unused_columns=False,
    )


def use_reference(trainer: Any, path: Path) -> None:
    """Load the reference weights from `path`.

    TRL's GRPO builds its reference from the policy's own path (the base model directory
    here, since the policy is loaded from it); a different reference is loaded into it.
    """
    ref = getattr(trainer, "ref_model", None)
    if ref is None:
        return
    state = load_model(path).state_dict()
    ref.load_state_dict(state)
