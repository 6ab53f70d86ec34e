"""Token-budgeted GRPO batches (seed 000 §4.4: batches counted in tokens, 32k–128k).

TRL's `GRPOTrainer` fixes the rollouts of an optimiser step when it is built (the
per-device batch, the gradient accumulation and with them the generation batch), so a
budget in tokens cannot resize each step as its rollouts come in. It is converted once,
before the trainer is built, into whole groups:

    groups per step = max(1, round(tokens_per_step / (rollouts_per_task × mean rollout tokens)))

(rounded to the nearest whole group, halves up).

The mean rollout length is measured from the data, not assumed: each source episode of
the `grpo` snapshot's tasks (the collection episode a task row was built from) rendered as
the trainer sees a rollout, the training chat template over the episode's chat in the
run's prompt style (`training.conversations.episode_messages`, the same chat SFT trains
on), its prompt and completion tokens counted (`rollout_token_counts`). With no stored
episode to measure, `TrainingSettings.rl_rollout_tokens_estimate` (600: the measured SFT
examples of the smollm2 recipe's episodes, 400–650 tokens) stands in, and the plan says so.

The step's rollouts are fed to the model one group per micro-batch, the step's groups
accumulated (`gradient_accumulation_steps` = groups, TRL's `steps_per_generation` equal to
it): one generation batch per optimiser step as before, but a 32k-token step never goes
through the model at once (its logits alone, 32k × SmolLM2's 49,152-entry vocabulary, are
~6 GB in fp32). With TRL's `dapo` loss, normalised over the whole generation batch's
tokens, the accumulated gradient is the one-batch gradient.

Each step's actual tokens (prompt + completion of every rollout generated, trained or
dropped) are logged as `grpo/rollout_tokens`; one outside half to twice the budget gets
one warning a run (`budget_drift_warning`) saying what to change.

Pure: no SQL, no TRL; the tokenizer is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.prompt import PromptStyle
from agent.trajectory import Trajectory
from training.conversations import episode_messages
from training.errors import TrainerError
from training.settings import TrainingSettings

__all__ = [
    "DRIFT_FACTOR",
    "TokenBudget",
    "budget_drift_warning",
    "groups_per_step",
    "plan_token_budget",
    "recorded_rollout_tokens",
    "rollout_token_counts",
]

DRIFT_FACTOR = 2.0
"""A step whose rollouts hold more than this many times the budget, or less than its
inverse, warns: the measured mean no longer describes the rollouts."""


def groups_per_step(
    tokens_per_step: int, rollouts_per_task: int, mean_rollout_tokens: float
) -> int:
    """Whole groups that fill `tokens_per_step` at `mean_rollout_tokens` a rollout: the
    nearest whole number (halves up), at least one group.

    Raises:
        TrainerError: a budget, group size or mean that is not positive.
    """
    if tokens_per_step < 1 or rollouts_per_task < 1 or not mean_rollout_tokens > 0:
        raise TrainerError(
            "a GRPO token budget needs positive tokens per step, rollouts per task and mean "
            f"rollout tokens, got {tokens_per_step}, {rollouts_per_task} and {mean_rollout_tokens}"
        )
    return max(1, math.floor(tokens_per_step / (rollouts_per_task * mean_rollout_tokens) + 0.5))


class TokenBudget(BaseModel):
    """A token budget converted into groups per optimiser step (see the module)."""

    model_config = ConfigDict(frozen=True)

    tokens_per_step: int = Field(ge=1)
    """The budget: rollout tokens (prompt + completion) per optimiser step."""
    rollouts_per_task: int = Field(ge=1)
    """Rollouts per group."""
    mean_rollout_tokens: float = Field(gt=0)
    """Tokens of a rollout the conversion assumed."""
    measured_episodes: int = Field(ge=0)
    """Source episodes the mean was measured over; 0: the estimate
    (`rl_rollout_tokens_estimate`) was used."""
    groups_per_step: int = Field(ge=1)
    """Groups per optimiser step the budget became."""

    @property
    def source(self) -> Literal["measured", "estimate"]:
        """Where the mean rollout length came from."""
        return "measured" if self.measured_episodes else "estimate"

    @property
    def rollouts_per_step(self) -> int:
        """Rollouts per optimiser step."""
        return self.groups_per_step * self.rollouts_per_task

    @property
    def planned_tokens(self) -> int:
        """Tokens a step holds when its rollouts are as long as the mean."""
        return round(self.rollouts_per_step * self.mean_rollout_tokens)

    def applied(self, settings: TrainingSettings) -> TrainingSettings:
        """`settings` with the step's batch the budget decided: one group per micro-batch
        (`batch_size` = `rollouts_per_task`), `groups_per_step` micro-batches accumulated
        into one optimiser step (see the module). Applying it twice changes nothing."""
        return settings.model_copy(
            update={
                "batch_size": self.rollouts_per_task,
                "gradient_accumulation_steps": self.groups_per_step,
            }
        )

    def describe(self) -> str:
        """One line: the budget, the mean and where it came from, the groups."""
        where = (
            f"measured over {self.measured_episodes} source episodes"
            if self.measured_episodes
            else "the estimate rl_rollout_tokens_estimate: no stored source episode to measure"
        )
        return (
            f"GRPO token budget {self.tokens_per_step:,} tokens a step ÷ "
            f"({self.rollouts_per_task} rollouts × {self.mean_rollout_tokens:,.0f} tokens a "
            f"rollout, {where}) = {self.groups_per_step} groups "
            f"({self.rollouts_per_step} rollouts, ~{self.planned_tokens:,} tokens) a step"
        )

    def as_config(self) -> dict[str, Any]:
        """What the training run's config and `bench/loop.py`'s JSON record."""
        return {
            "tokens_per_step": self.tokens_per_step,
            "mean_rollout_tokens": round(self.mean_rollout_tokens, 1),
            "rollout_tokens_source": self.source,
            "measured_episodes": self.measured_episodes,
            "groups_per_step": self.groups_per_step,
            "rollouts_per_step": self.rollouts_per_step,
            "planned_tokens_per_step": self.planned_tokens,
        }


def plan_token_budget(
    settings: TrainingSettings, rollout_tokens: Sequence[int]
) -> TokenBudget | None:
    """The budget of `settings.rl_tokens_per_step` as groups per step, from the token
    counts of the measured source episodes (`rollout_token_counts`), or from
    `settings.rl_rollout_tokens_estimate` when there are none; None when no budget is set.

    Raises:
        TrainerError: a count is not positive.
    """
    budget = settings.rl_tokens_per_step
    if budget is None:
        return None
    if any(n < 1 for n in rollout_tokens):
        raise TrainerError("a measured rollout has no token: cannot size the GRPO batch from it")
    mean = (
        sum(rollout_tokens) / len(rollout_tokens)
        if rollout_tokens
        else float(settings.rl_rollout_tokens_estimate)
    )
    return TokenBudget(
        tokens_per_step=budget,
        rollouts_per_task=settings.rollouts_per_task,
        mean_rollout_tokens=mean,
        measured_episodes=len(rollout_tokens),
        groups_per_step=groups_per_step(budget, settings.rollouts_per_task, mean),
    )


def rollout_token_counts(
    trajectories: Iterable[Trajectory], tokenizer: Any, style: PromptStyle | str
) -> list[int]:
    """Prompt and completion tokens of each episode as a rollout of it would be: the
    episode's chat up to its last assistant turn, system prompt in `style`, rendered with
    `tokenizer`'s chat template (the trainer's: `load_tokenizer`) and encoded as the `hf:`
    policy encodes its prompts (`agent.policies.hf_tokens.ChatTokens`). An episode without
    an assistant turn is left out."""
    counts: list[int] = []
    for trajectory in trajectories:
        messages = episode_messages(trajectory, style)
        if not any(m["role"] == "assistant" for m in messages):
            continue
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        counts.append(len(tokenizer(str(text), add_special_tokens=False)["input_ids"]))
    return counts


def recorded_rollout_tokens(trajectory: Trajectory) -> int:
    """Prompt and completion tokens of a rollout as its policy recorded them: the last
    turn's prompt ids (which extend every earlier turn's prompt and completion) and its
    completion ids; 0 when no turn recorded both (an infrastructure outcome)."""
    for step in reversed(trajectory.steps):
        if step.prompt_token_ids is not None and step.completion_token_ids is not None:
            return len(step.prompt_token_ids) + len(step.completion_token_ids)
    return 0


def budget_drift_warning(budget: TokenBudget, *, step: int, tokens: int) -> str | None:
    """The warning when optimiser step `step`'s rollouts held `tokens` tokens, more than
    `DRIFT_FACTOR` times the budget or less than its inverse; None within. It names the
    groups per step that would hold the budget at the step's rollout length."""
    if budget.tokens_per_step / DRIFT_FACTOR <= tokens <= budget.tokens_per_step * DRIFT_FACTOR:
        return None
    longer = tokens > budget.tokens_per_step
    advice = "check the rollouts' token ids (none were recorded)"
    if tokens > 0:
        mean = tokens / budget.rollouts_per_step
        fit = groups_per_step(budget.tokens_per_step, budget.rollouts_per_task, mean)
        advice = (
            f"at {mean:,.0f} tokens a rollout, {fit} groups a step hold the budget: give them "
            "directly (bench/loop.py --rl-groups; EPIFLOW_TRAINING_BATCH_SIZE = groups × "
            "rollouts_per_task with no token budget), or set EPIFLOW_TRAINING_RL_TOKENS_PER_STEP "
            f"(--rl-tokens-per-step) {'lower' if longer else 'higher'}"
        )
        if longer:
            advice += "; to shorten rollouts, lower max_completion_length or the episode's turns"
    return (
        f"GRPO step {step}: its {budget.rollouts_per_step} rollouts held {tokens:,} tokens "
        f"against a budget of {budget.tokens_per_step:,} a step ({budget.groups_per_step} "
        f"groups planned at {budget.mean_rollout_tokens:,.0f} tokens a rollout, "
        f"{budget.source}): the rollouts run {'longer' if longer else 'shorter'} than the "
        f"episodes the batch was sized from; {advice}"
    )
