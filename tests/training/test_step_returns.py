"""Per-turn advantages handed to TRL's loss: the rollout function's judging and the mixin.

The slow end-to-end check (TRL training on rollouts in real jails, the (B, T) advantages
its loss received) is `test_episode_grpo.py::test_grpo_with_per_turn_returns_in_real_jails`.
"""

from __future__ import annotations

import uuid
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from agent.trajectory import Trajectory
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from tests.training.factory import call_step, episode, final_step
from training.errors import TrainerError
from training.groups import GroupFate
from training.returns import token_advantages
from training.rollout_tokens import token_rollout
from training.trainers.episode_grpo import EpisodeRollouts, JudgedBatch, RolloutBatch
from training.trainers.step_returns import (
    StepReturnsMixin,
    slot_advantages,
    slot_start_advantages,
)

torch = pytest.importorskip("torch")


def _tokened(task: int, rollout: int, *, success: bool, calls: int, first: int) -> Trajectory:
    """`calls` tool calls then a final answer; turn k samples [first + k, 9] and the tool
    result adds [50, 51]."""
    steps = [call_step(k, f"cat f{k}") for k in range(calls)] + [final_step(calls)]
    t = episode(task=task, rollout=rollout, success=success, steps=steps)
    prompt = [1, 2, 3]
    for k, step in enumerate(t.steps):
        sampled = [first + k, 9]
        step.prompt_token_ids, step.completion_token_ids = list(prompt), sampled
        step.logprobs = [-1.0, -2.0]
        prompt = [*prompt, *sampled, 50, 51]
    return apply_rewards(t, RewardSettings())


class _Source:
    def __init__(
        self, groups: list[list[Trajectory]], discard: frozenset[uuid.UUID] = frozenset()
    ) -> None:
        self.groups, self.discard = groups, discard
        self.recorded: list[JudgedBatch] = []

    def generate(self, batch: RolloutBatch) -> list[list[Trajectory]]:
        return self.groups

    def admit(self, batch: RolloutBatch, groups: list[list[Trajectory]]) -> frozenset[uuid.UUID]:
        return self.discard

    def record(self, judged: JudgedBatch) -> None:
        self.recorded.append(judged)


class _ScoringTrainer:
    """Stands in for TRL's `GRPOTrainer._generate_and_score_completions` (no model in the
    fast lane): calls the rollout function, pads the completion ids on the right to a
    multiple of 8 as TRL does, logs one advantage per completion, returns shape (B,)."""

    def __init__(self, rollout_func: Any, *, scramble: bool = False) -> None:
        self.rollout_func = rollout_func
        self.scramble = scramble
        self._logs: dict[str, Any] = {"advantages": deque([7.0], maxlen=16)}
        self.processing_class = SimpleNamespace(pad_token_id=0)
        self.state = SimpleNamespace(global_step=0)
        self.accelerator = SimpleNamespace(unwrap_model=lambda m: m, gather=lambda t: t)
        self.model = "the model"

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = self.rollout_func([x["prompt"] for x in inputs], self)
        ids = [list(c) for c in out["completion_ids"]]
        if self.scramble:
            ids.reverse()
        width = -(-max(len(c) for c in ids) // 8) * 8
        padded = [c + [0] * (width - len(c)) for c in ids]
        self._logs["advantages"].extend([9.0] * len(ids))
        return {
            "completion_ids": torch.tensor(padded),
            "advantages": torch.full((len(ids),), 9.0),
        }


class _Trainer(StepReturnsMixin, _ScoringTrainer):
    pass


def _batch() -> tuple[list[list[Trajectory]], list[str]]:
    mixed = [
        _tokened(0, 0, success=True, calls=1, first=10),
        _tokened(0, 1, success=True, calls=3, first=20),
        _tokened(0, 2, success=False, calls=2, first=30),
    ]
    flat = [_tokened(1, i, success=False, calls=1, first=40 + 5 * i) for i in range(3)]
    prompts = [mixed[0].task_id] * 3 + [flat[0].task_id] * 3
    return [mixed, flat], prompts


def test_the_trainer_gets_each_tokens_turn_advantage() -> None:
    groups, prompts = _batch()
    source = _Source(groups, discard=frozenset({groups[0][2].episode_id}))
    rollouts = EpisodeRollouts(source=source, rollouts_per_task=3, returns_gamma=0.9)
    trainer = _Trainer(rollouts)
    output = trainer._generate_and_score_completions([{"prompt": p} for p in prompts])

    (judged,) = source.recorded
    mixed, flat = judged.groups
    assert (mixed.fate, flat.fate) == (GroupFate.TRAINED, GroupFate.ZERO_VARIANCE)
    assert mixed.turn_advantages is not None
    advantages = output["advantages"]
    assert advantages.shape == output["completion_ids"].shape
    assert advantages.shape[1] % 8 == 0
    rows = advantages.tolist()
    for slot in (0, 1):
        tokens = token_rollout(groups[0][slot])
        turns = mixed.turn_advantages[slot]
        assert turns is not None and len(turns) == groups[0][slot].n_steps
        n = len(tokens.completion_ids)
        assert rows[slot][:n] == pytest.approx(token_advantages(tokens, turns))
        assert rows[slot][n:] == [0.0] * (len(rows[slot]) - n)  # padding
        sampled = [a for a, m in zip(rows[slot], tokens.env_mask, strict=False) if m]
        expected = [turns[k] for k, m in zip(tokens.turn_index, tokens.env_mask, strict=True) if m]
        assert sampled == pytest.approx(expected)
    for slot in (2, 3, 4, 5):  # the discarded rollout, the zero-variance group
        assert rows[slot] == [0.0] * len(rows[slot])
    # The longer success's later turns earn more than its first, less than the short one.
    long_turns = mixed.turn_advantages[1]
    short_turns = mixed.turn_advantages[0]
    assert long_turns is not None and short_turns is not None
    assert long_turns[0] < long_turns[-1] and long_turns[0] < short_turns[0]
    # The completions table logs each rollout's stored advantage, A_{i,0}, not TRL's.
    assert list(trainer._logs["advantages"]) == [7.0, *slot_start_advantages(judged)]
    assert slot_start_advantages(judged)[:3] == [short_turns[0], long_turns[0], 0.0]


def test_the_mixin_refuses_a_batch_it_cannot_align() -> None:
    groups, prompts = _batch()
    rollouts = EpisodeRollouts(source=_Source(groups), rollouts_per_task=3, returns_gamma=0.9)
    trainer = _Trainer(rollouts, scramble=True)
    with pytest.raises(TrainerError, match="cannot be aligned"):
        trainer._generate_and_score_completions([{"prompt": p} for p in prompts])

    episodic = EpisodeRollouts(source=_Source(groups), rollouts_per_task=3)
    with pytest.raises(TrainerError, match="without per-turn returns"):
        _Trainer(episodic)._generate_and_score_completions([{"prompt": p} for p in prompts])
    assert episodic.last is not None
    with pytest.raises(TrainerError, match="needs returns_gamma"):
        slot_advantages(episodic.last)
