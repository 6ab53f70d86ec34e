"""The GRPO update of `bench/train.py`: TRL's `GRPOTrainer` against a bare torch loop.

Both train the same model on the same fixed batch of rollouts, so the figure measures the
update (reference forward, policy forward and backward, clip, AdamW), not generation:

- the batch: `groups × rollouts_per_task` oracle-style chats (`bench/train.py`'s
  `conversations`), each tokenized by the training chat template and cut where the first
  assistant turn starts: the system prompt and the task are the rollout's `prompt_ids`,
  the rest its `completion_ids`, with `env_mask` 0 on everything the assistant mask does
  not cover (tool results, turn markers); the rewards are fixed (half the rollouts of each
  group succeed), the advantages `training.groups.group_advantages` of them. Every step
  trains on the same batch.
- TRL: `GRPOTrainer` built as `run_episode_grpo` builds it (its trainer class
  `episode_grpo_trainer`: on CPU, log-probabilities without TRL's fused LM head,
  `training.trainers.cpu_logps`; `grpo_config`, `train_with`, the reference from the
  base, `episode_reward` reading the rollout's reward field) with
  a `rollout_func` returning the fixed batch through `rollout_func_output`;
  tokens / wall time of `trainer.train()`.
- bare torch: TRL's objective written out on the same tensors: the same padding (prompts
  left, completions right), log-probabilities of the completion tokens at the sampling
  temperature, the per-token ratio to the old log-probabilities clipped at 1 ± ε times the
  advantage, β × the k3 KL estimate to a frozen reference, summed over the loss mask
  (completion ∧ `env_mask`) and divided by its token count (TRL's default `dapo`
  normalisation); then clip to `max_grad_norm` and AdamW.

The old log-probabilities are the policy's own, detached, in both: with one optimiser step
per generation batch and no vLLM, TRL takes them so (the ratio is 1 and the clipped
objective's gradient is A·∇log π); the sampling log-probabilities a rollout carries only
feed vLLM's importance-sampling correction, so the fixed batch carries none (None: "not
recorded", as a policy without logprobs gives).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.groups import group_advantages
from training.rollout_tokens import TokenRollout, rollout_func_output
from training.settings import TrainingSettings

__all__ = [
    "FixedRollouts",
    "GrpoRun",
    "fixed_rollouts",
    "grpo_report",
    "rl_settings_of",
    "torch_grpo",
    "trl_grpo",
]


@dataclass(frozen=True)
class FixedRollouts:
    """One generation batch, trained on at every step: whole groups, in order."""

    rollouts: list[TokenRollout]
    """Group after group, `group_size` each."""
    rewards: list[float]
    """Each rollout's episode reward."""
    advantages: list[float]
    """Each rollout's group-normalised advantage (`training.groups.group_advantages`)."""
    group_size: int
    """Rollouts per group (the recipe's `rollouts_per_task`)."""

    @property
    def tokens(self) -> int:
        """Non-padding tokens of one step: prompts and completions."""
        return sum(len(r.prompt_ids) + len(r.completion_ids) for r in self.rollouts)

    @property
    def trained_tokens(self) -> int:
        """Tokens of one step inside the loss mask (sampled tokens)."""
        return sum(sum(r.env_mask) for r in self.rollouts)


def fixed_rollouts(
    examples: list[dict[str, Any]], *, group_size: int, groups: int
) -> FixedRollouts:
    """`groups × group_size` rollouts from tokenized chats (`input_ids` and the assistant
    `mask`), reusing them in order when there are fewer; in each group the first half of
    the rollouts get reward 1.0, the rest 0.0."""
    usable = [e for e in examples if any(e["mask"])]
    if not usable:
        raise ValueError("no example has an assistant token to train on")
    rollouts, rewards = [], []
    for i in range(groups * group_size):
        ids, mask = usable[i % len(usable)]["input_ids"], usable[i % len(usable)]["mask"]
        start = list(mask).index(1)
        completion = list(ids[start:])
        env_mask = [int(m) for m in mask[start:]]
        rollouts.append(
            TokenRollout(
                episode_id=f"fixed-{i}",
                prompt_ids=list(ids[:start]),
                completion_ids=completion,
                env_mask=env_mask,
                logprobs=[None if m else 0.0 for m in env_mask],
                turn_index=[0] * len(completion),
            )
        )
        rewards.append(1.0 if i % group_size < (group_size + 1) // 2 else 0.0)
    advantages = [
        a
        for g in range(groups)
        for a in group_advantages(rewards[g * group_size : (g + 1) * group_size])
    ]
    return FixedRollouts(rollouts, rewards, advantages, group_size)


@dataclass
class GrpoRun:
    """What one timed run of either path measured."""

    tokens_per_s: float
    """`steps × FixedRollouts.tokens` / wall time."""
    losses: list[float] = field(default_factory=list)
    """The loss of each optimiser step, in order."""
    grad_norms: list[float] = field(default_factory=list)
    """The gradient norm before clipping of each step."""
    threads: list[int] = field(default_factory=list)
    """Intra-op thread counts used."""
    cpu_s: float = 0.0
    """CPU time of the process during the steps."""
    runtime_s: float = 0.0
    """Wall time of the steps."""


def grpo_settings(settings: TrainingSettings, batch: FixedRollouts, steps: int) -> TrainingSettings:
    """`settings` with the batch of one step (whole groups), `steps` steps, one log per step."""
    return settings.model_copy(
        update={
            "max_steps": steps,
            "batch_size": len(batch.rollouts),
            "rollouts_per_task": batch.group_size,
            "gradient_accumulation_steps": 1,
            "max_time_s": None,
            "logging_steps": 1,
            "save_steps": None,
            "save_every_s": None,
        }
    )


def trl_grpo(
    base: Path, batch: FixedRollouts, settings: TrainingSettings, output_dir: Path, *, steps: int
) -> GrpoRun:
    """`steps` optimiser steps of TRL's `GRPOTrainer` on `batch`, set up as the project's
    episode GRPO sets it up (`training.trainers.episode_grpo.run_episode_grpo`)."""
    import warnings

    from datasets import Dataset

    from training.trainers.common import Algo, TrainJob, train_with
    from training.trainers.episode_grpo import REWARD_FIELD, episode_grpo_trainer, episode_reward
    from training.trainers.grpo import grpo_config

    losses: list[float] = []
    grad_norms: list[float] = []

    def on_metrics(step: int, max_steps: int, logs: dict[str, float]) -> None:
        if "loss" in logs:
            losses.append(float(logs["loss"]))
        if "grad_norm" in logs:
            grad_norms.append(float(logs["grad_norm"]))

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        output = rollout_func_output(batch.rollouts)
        output[REWARD_FIELD] = list(batch.rewards)
        return output

    job = TrainJob(
        base_model_dir=base,
        output_dir=output_dir,
        settings=grpo_settings(settings, batch, steps),
        on_metrics=on_metrics,
    )
    groups = len(batch.rollouts) // batch.group_size
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
        result = train_with(
            Algo.GRPO,
            episode_grpo_trainer(),
            grpo_config(job),
            Dataset.from_list([{"prompt": f"task-{g}"} for g in range(groups)]),
            job,
            n_examples=groups,
            reward_funcs=[episode_reward],
            rollout_func=rollout_func,
        )
    return GrpoRun(
        tokens_per_s=steps * batch.tokens / result.runtime_s if result.runtime_s else 0.0,
        losses=losses,
        grad_norms=grad_norms,
        threads=result.threads,
        cpu_s=result.cpu_s,
        runtime_s=result.runtime_s,
    )


def _padded(batch: FixedRollouts, pad_id: int) -> dict[str, Any]:
    """TRL's layout: prompts padded on the left, completions on the right."""
    import torch

    rollouts = batch.rollouts
    width_p = max(len(r.prompt_ids) for r in rollouts)
    width_c = max(len(r.completion_ids) for r in rollouts)
    n = len(rollouts)
    prompt = torch.full((n, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)
    completion = torch.full((n, width_c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width_c), dtype=torch.long)
    env_mask = torch.ones((n, width_c), dtype=torch.long)
    for row, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        prompt[row, width_p - p :] = torch.tensor(r.prompt_ids)
        prompt_mask[row, width_p - p :] = 1
        completion[row, :c] = torch.tensor(r.completion_ids)
        completion_mask[row, :c] = 1
        env_mask[row, :c] = torch.tensor(r.env_mask)
    return {
        "input_ids": torch.cat([prompt, completion], dim=1),
        "attention_mask": torch.cat([prompt_mask, completion_mask], dim=1),
        "completion_ids": completion,
        "loss_mask": (completion_mask * env_mask).float(),
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32).unsqueeze(1),
    }


def completion_logps(model: Any, inputs: dict[str, Any], *, temperature: float) -> Any:
    """Log-probabilities of the completion tokens (logits of the completion positions only)."""
    import torch

    width = inputs["completion_ids"].size(1)
    logits = model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        logits_to_keep=width + 1,
    ).logits[:, :-1, :]
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def grpo_loss(
    logps: Any,
    old_logps: Any,
    ref_logps: Any | None,
    inputs: dict[str, Any],
    *,
    epsilon: float,
    beta: float,
) -> Any:
    """TRL's GRPO objective (`loss_type="dapo"`, token-level ratio) on one batch."""
    import torch

    ratio = torch.exp(logps - old_logps)
    advantages = inputs["advantages"]
    per_token = -torch.min(
        ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages
    )
    if ref_logps is not None and beta:
        per_token = per_token + beta * (torch.exp(ref_logps - logps) - (ref_logps - logps) - 1)
    mask = inputs["loss_mask"]
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def torch_grpo(
    base: Path,
    batch: FixedRollouts,
    settings: TrainingSettings,
    *,
    steps: int,
    pad_id: int,
    bf16: bool,
    threads: int,
) -> GrpoRun:
    """`steps` steps of a bare GRPO loop on `batch` (the module's objective), timed."""
    import torch

    from training.trainers.common import load_frozen, load_model

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    model = load_model(base)
    model.train()
    reference = load_frozen(base) if settings.beta > 0 else None
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.rl_learning_rate, weight_decay=settings.weight_decay
    )
    inputs = _padded(batch, pad_id)
    run = GrpoRun(tokens_per_s=0.0, threads=[threads])
    cpu_started, started = time.process_time(), time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            ref_logps = None
            if reference is not None:
                with torch.no_grad():
                    ref_logps = completion_logps(
                        reference, inputs, temperature=settings.temperature
                    )
            logps = completion_logps(model, inputs, temperature=settings.temperature)
        loss = grpo_loss(
            logps,
            logps.detach(),
            ref_logps,
            inputs,
            epsilon=settings.clip_epsilon,
            beta=settings.beta,
        )
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.losses.append(float(loss.detach()))
        run.grad_norms.append(float(norm))
    run.runtime_s = time.perf_counter() - started
    run.cpu_s = time.process_time() - cpu_started
    run.tokens_per_s = steps * batch.tokens / run.runtime_s if run.runtime_s > 0 else math.inf
    torch.set_num_threads(previous)
    return run


def rl_settings_of(recipe: Any, settings: TrainingSettings) -> TrainingSettings:
    """The GRPO settings of `recipe` over its SFT `settings`: its RL stage's, else those of
    its `-rl` twin (`smollm2` → `smollm2-rl`: the same model and data recipe).

    Raises:
        TrainerError: neither the recipe nor a `-rl` twin has an RL stage.
    """
    from training.errors import TrainerError
    from training.recipes import RECIPES

    rl = recipe if recipe.rl is not None else RECIPES.get(f"{recipe.name}-rl")
    if rl is None or rl.rl is None:
        raise TrainerError(
            f"recipe {recipe.name!r} has no RL stage and no {recipe.name}-rl twin: "
            "measure it with --part sft"
        )
    return rl.rl_settings(settings, steps=1, groups_per_step=1)


def grpo_report(
    base: Path,
    examples: list[dict[str, Any]],
    settings: TrainingSettings,
    root: Path,
    *,
    steps: int,
    groups: int,
    repeat: int,
    pad_id: int,
    bf16: bool,
) -> dict[str, Any]:
    """The GRPO part of `bench/train.py`'s JSON: an untimed one-step warm-up of each path,
    then `repeat` alternating runs of `steps` steps, best of each.

    Both paths run at one thread count, chosen once (`torch_threads`, or the idle cores
    now): the trainer's automatic thread tuning would otherwise move TRL to two threads
    mid-run on a quiet machine while the bare loop kept the first count."""
    from training.threads import choose_threads

    batch = fixed_rollouts(examples, group_size=settings.rollouts_per_task, groups=groups)
    threads = choose_threads(settings.torch_threads)
    settings = grpo_settings(settings, batch, steps).model_copy(update={"torch_threads": threads})

    def trl(name: str, n: int) -> GrpoRun:
        return trl_grpo(base, batch, settings, root / name, steps=n)

    def bare(threads: int, n: int) -> GrpoRun:
        return torch_grpo(base, batch, settings, steps=n, pad_id=pad_id, bf16=bf16, threads=threads)

    trl("grpo-warm", 1)
    bare(threads, 1)
    trl_best: GrpoRun | None = None
    torch_best: GrpoRun | None = None
    for i in range(repeat):
        measured = trl(f"grpo{i}", steps)
        if trl_best is None or measured.tokens_per_s > trl_best.tokens_per_s:
            trl_best = measured
        timed = bare(threads, steps)
        if torch_best is None or timed.tokens_per_s > torch_best.tokens_per_s:
            torch_best = timed
    assert trl_best is not None and torch_best is not None  # repeat >= 1
    return {
        "grpo_trl_tokens_per_s": round(trl_best.tokens_per_s, 1),
        "grpo_torch_tokens_per_s": round(torch_best.tokens_per_s, 1),
        "grpo_ratio": round(trl_best.tokens_per_s / torch_best.tokens_per_s, 3)
        if torch_best.tokens_per_s
        else None,
        "grpo_trl_cpu_share": round(trl_best.cpu_s / trl_best.runtime_s, 2)
        if trl_best.runtime_s
        else 0.0,
        "grpo_first_loss": {"trl": trl_best.losses[:1], "torch": torch_best.losses[:1]},
        "grpo_threads": trl_best.threads,
        "grpo_steps": steps,
        "grpo_rollouts": len(batch.rollouts),
        "grpo_group_size": batch.group_size,
        "grpo_tokens_per_step": batch.tokens,
        "grpo_trained_tokens_per_step": batch.trained_tokens,
        "grpo_beta": settings.beta,
        "grpo_clip_epsilon": settings.clip_epsilon,
        "grpo_learning_rate": settings.rl_learning_rate,
    }
