"""An episode as one GRPO rollout of TRL's `rollout_func`, token for token.

TRL's `GRPOTrainer(rollout_func=…)` takes, per rollout, `prompt_ids`, `completion_ids`,
`logprobs` and (optionally) `env_mask`: 1 on tokens the model sampled, 0 on tokens the
environment wrote, which stay out of the loss. A multi-turn episode maps onto that as

    prompt_ids     = the first turn's prompt ids (system prompt + task, as rendered)
    completion_ids = c_0 + o_0 + c_1 + o_1 + … + c_{n-1}
    env_mask       = 1…1 + 0…0 + 1…1 + 0…0 + … + 1…1
    logprobs       = the recorded logprob of each sampled token, 0.0 on observation tokens

where `c_k` is turn k's `Step.completion_token_ids` (exactly as sampled) and `o_k` is what
turn k+1's prompt adds after `prompt_k + c_k`: the tool result and the chat template's
turn markers. Nothing after the last turn is part of the rollout (the model never saw it).
Each completion id also carries its turn k (`turn_index`: c_k and o_k are k), which
per-turn returns (`training.returns`) use to give a turn's tokens its advantage.

This needs a policy whose prompts extend: turn k+1's prompt ids start with turn k's prompt
ids followed by its completion ids. That is checked on every turn, and a turn that breaks
it raises `TokenPrefixError` naming the episode and the step: re-tokenizing sampled text
to repair it is the multi-turn RL bug this module exists to avoid. Observation tokens get
logprob 0.0, as TRL's own tool loop gives tool-result tokens; a turn whose policy recorded
no logprobs gets None on its sampled tokens (TRL reads None as "unknown" and leaves the
token out of its importance-sampling correction).

Pure: no torch, no TRL, no sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.trajectory import Trajectory
from training.errors import MissingTokenIds, TokenPrefixError

__all__ = ["TokenRollout", "placeholder_rollout", "rollout_func_output", "token_rollout"]


@dataclass(frozen=True)
class TokenRollout:
    """One episode as the trainer sees it (all four lists of a rollout, aligned)."""

    episode_id: str
    """The episode it came from ('' for a placeholder)."""
    prompt_ids: list[int]
    """The first turn's prompt ids."""
    completion_ids: list[int]
    """Every turn's sampled ids and the observation ids between turns, in order."""
    env_mask: list[int]
    """1 on sampled ids (trained), 0 on observation ids (kept out of the loss)."""
    logprobs: list[float | None]
    """The sampling logprob of each sampled id (None where the policy recorded none),
    0.0 on observation ids."""
    turn_index: list[int]
    """The assistant turn k (the episode's k-th step) of each completion id: its sampled ids and
    the observation ids that follow them (its tool result) are k. Per-turn advantages
    (`training.returns`) are given to tokens by it."""

    @property
    def sampled_ids(self) -> list[int]:
        """The completion ids the loss covers, in order (what the model sampled)."""
        return [t for t, m in zip(self.completion_ids, self.env_mask, strict=True) if m]


def token_rollout(trajectory: Trajectory) -> TokenRollout:
    """The rollout of `trajectory`, checked token for token.

    Raises:
        MissingTokenIds: the episode has no step, or a step recorded no prompt or completion
            ids, or logprobs of another length than its completion ids.
        TokenPrefixError: a turn's prompt ids are not the previous turn's prompt ids, its
            completion ids, then observation ids.
    """
    episode = str(trajectory.episode_id)
    if not trajectory.steps:
        raise MissingTokenIds(
            f"episode {episode} has no step: no turn to train on",
            episode_id=episode,
            step_index=0,
        )
    completion: list[int] = []
    mask: list[int] = []
    turns: list[int] = []
    logprobs: list[float | None] = []
    first_prompt: list[int] = []
    seen: list[int] = []  # prompt + completion of the previous turn
    for turn, step in enumerate(trajectory.steps):
        prompt, sampled = step.prompt_token_ids, step.completion_token_ids
        if prompt is None or sampled is None:
            missing = "prompt" if prompt is None else "completion"
            raise MissingTokenIds(
                f"episode {episode} step {step.index} recorded no {missing} token ids: its "
                f"policy ({trajectory.policy}) does not capture what it sampled",
                episode_id=episode,
                step_index=step.index,
            )
        if step.logprobs is not None and len(step.logprobs) != len(sampled):
            raise MissingTokenIds(
                f"episode {episode} step {step.index} recorded {len(step.logprobs)} logprobs "
                f"for {len(sampled)} completion ids",
                episode_id=episode,
                step_index=step.index,
            )
        if step is trajectory.steps[0]:
            first_prompt = list(prompt)
        else:
            if prompt[: len(seen)] != seen:
                at = next(
                    (i for i, (a, b) in enumerate(zip(prompt, seen, strict=False)) if a != b),
                    min(len(prompt), len(seen)),
                )
                raise TokenPrefixError(
                    f"episode {episode} step {step.index}: the prompt does not extend the "
                    f"previous turn's prompt and completion ids (first difference at token "
                    f"{at} of {len(seen)})",
                    episode_id=episode,
                    step_index=step.index,
                )
            observation = prompt[len(seen) :]
            completion += observation
            mask += [0] * len(observation)
            turns += [turn - 1] * len(observation)  # the previous turn's tool result
            logprobs += [0.0] * len(observation)
        completion += sampled
        mask += [1] * len(sampled)
        turns += [turn] * len(sampled)
        logprobs += list(step.logprobs) if step.logprobs is not None else [None] * len(sampled)
        seen = [*prompt, *sampled]
    return TokenRollout(
        episode_id=episode,
        prompt_ids=first_prompt,
        completion_ids=completion,
        env_mask=mask,
        logprobs=logprobs,
        turn_index=turns,
    )


def placeholder_rollout(token_id: int) -> TokenRollout:
    """A one-token rollout with nothing trained (`env_mask` all 0): what fills the place of
    a rollout that is not trained on (a dropped group) in TRL's fixed-size batch."""
    return TokenRollout(
        episode_id="",
        prompt_ids=[token_id],
        completion_ids=[token_id],
        env_mask=[0],
        logprobs=[0.0],
        turn_index=[0],
    )


def rollout_func_output(rollouts: Sequence[TokenRollout]) -> dict[str, list[Any]]:
    """TRL's `rollout_func` return value for `rollouts` (one per prompt slot, in order)."""
    return {
        "prompt_ids": [r.prompt_ids for r in rollouts],
        "completion_ids": [r.completion_ids for r in rollouts],
        "logprobs": [r.logprobs for r in rollouts],
        "env_mask": [r.env_mask for r in rollouts],
    }
