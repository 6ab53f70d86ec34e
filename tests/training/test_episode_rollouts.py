"""GRPO over whole episodes: the rollout function TRL calls (`EpisodeRollouts`) on
hand-built episodes, and the trainer's settings; no model, no jail
(`test_episode_grpo` trains in real jails)."""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from tests.training.factory import episode, tokened_episode
from training.errors import TrainerError
from training.groups import GroupFate
from training.settings import TrainingSettings
from training.trainers.episode_grpo import (
    REWARD_FIELD,
    EpisodeRollouts,
    JudgedBatch,
    RolloutBatch,
    episode_grpo_settings,
    episode_reward,
)


def _tokened(task: int, rollout: int, *, success: bool, sampled: int) -> Trajectory:
    return tokened_episode(task=task, rollout=rollout, success=success, sampled=sampled)


def _infra(task: int, rollout: int) -> Trajectory:
    t = episode(task=task, rollout=rollout, success=False, steps=[])
    t.status, t.failure_category = EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR
    return apply_rewards(t, RewardSettings())


class _ListSource:
    def __init__(
        self, groups: list[list[Trajectory]], discard: frozenset[uuid.UUID] = frozenset()
    ) -> None:
        self.groups = groups
        self.discard = discard
        self.batches: list[RolloutBatch] = []
        self.gated: list[list[list[Trajectory]]] = []
        self.recorded: list[JudgedBatch] = []

    def generate(self, batch: RolloutBatch) -> list[list[Trajectory]]:
        self.batches.append(batch)
        return self.groups

    def admit(self, batch: RolloutBatch, groups: list[list[Trajectory]]) -> frozenset[uuid.UUID]:
        self.gated.append(groups)
        return self.discard

    def record(self, judged: JudgedBatch) -> None:
        self.recorded.append(judged)


def _trainer(step: int = 3) -> Any:
    logged: dict[str, float] = {}
    return SimpleNamespace(
        processing_class=SimpleNamespace(pad_token_id=0),
        state=SimpleNamespace(global_step=step),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        model="the model",
        logged=logged,
        _log_metric=logged.__setitem__,
    )


def test_rollout_func_trains_mixed_groups_and_masks_dropped_ones() -> None:
    mixed = [_tokened(0, 0, success=True, sampled=10), _tokened(0, 1, success=False, sampled=20)]
    flat = [_tokened(1, i, success=False, sampled=30) for i in range(2)]
    broken = [_tokened(2, 0, success=True, sampled=40), _infra(2, 1)]
    source = _ListSource([mixed, flat, broken])
    rollouts = EpisodeRollouts(source=source, rollouts_per_task=2)
    prompts = [t[0].task_id for t in (mixed, mixed, flat, flat, broken, broken)]
    trainer = _trainer(step=3)
    out = rollouts(prompts, trainer)

    batch = source.batches[0]
    assert batch.task_ids == [mixed[0].task_id, flat[0].task_id, broken[0].task_id]
    assert (batch.policy_version, batch.rollouts_per_task, batch.model) == (3, 2, "the model")
    assert out["completion_ids"][0] == [10, 9, 50, 51, 11, 9]
    assert out["env_mask"][0] == [1, 1, 0, 0, 1, 1]
    assert out["logprobs"][0] == [-1.0, -2.0, 0.0, 0.0, -1.0, -2.0]
    assert out["prompt_ids"][1] == [1, 2, 3]
    for slot in (2, 3, 4, 5):  # zero variance and infrastructure: nothing trained
        assert out["env_mask"][slot] == [0] and out["completion_ids"][slot] == [0]
    rewards = out[REWARD_FIELD]
    assert rewards[:2] == [mixed[0].total_reward, mixed[1].total_reward]
    assert rewards[2:] == [None] * 4
    assert episode_reward(prompts, [None] * 6, **{REWARD_FIELD: rewards}) == rewards

    judged = source.recorded[0]
    assert [g.fate for g in judged.groups] == [
        GroupFate.TRAINED,
        GroupFate.ZERO_VARIANCE,
        GroupFate.INFRASTRUCTURE,
    ]
    assert judged.rollouts[1] == [None, None]
    assert rollouts.counts.as_dict()["groups_dropped_zero_variance"] == 1
    assert rollouts.counts.infrastructure_rollouts == 1
    # What task_sampling success_variance draws by: the outcomes, infrastructure aside.
    assert rollouts.outcomes.outcomes == {"csv_to_json": 5}
    assert rollouts.outcomes.successes == {"csv_to_json": 2}
    assert rollouts.last is judged
    assert trainer.logged == {
        "grpo/success_rate": 2 / 5,  # the infrastructure rollout aside
        "grpo/groups_used": 1.0,
        "grpo/groups_dropped_zero_variance": 1.0,
        "grpo/groups_dropped_infrastructure": 1.0,
        "grpo/infrastructure_rollouts": 1.0,
        "grpo/groups_dropped_qc": 0.0,
        "grpo/qc_discarded_rollouts": 0.0,
        "grpo/sampled_tokens": 8.0,
        "grpo/rollout_tokens": 45.0,  # 5 rollouts of 7 + 2 ids, dropped ones too; none infra
    }
    assert source.gated == [[mixed, flat, broken]]  # the gate saw the batch before judging


def test_a_step_far_from_its_token_budget_warns_once_a_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch whose rollouts hold more than twice the token budget logs one warning for
    the run, kept for `TrainResult.warnings`; the next such batch adds none."""
    from training.token_budget import TokenBudget

    groups = [[_tokened(0, i, success=i == 0, sampled=10) for i in range(2)]]
    budget = TokenBudget(
        tokens_per_step=8, rollouts_per_task=2, mean_rollout_tokens=4.0, measured_episodes=1,
        groups_per_step=1,
    )  # fmt: skip
    rollouts = EpisodeRollouts(source=_ListSource(groups), rollouts_per_task=2, budget=budget)
    prompts = [groups[0][0].task_id] * 2
    with caplog.at_level(logging.WARNING, logger="training.trainers.episode_grpo"):
        rollouts(prompts, _trainer(step=0))
        rollouts(prompts, _trainer(step=1))
    said = [r.getMessage() for r in caplog.records if "token" in r.getMessage()]
    assert len(said) == 1 and said[0] == rollouts.budget_warning
    assert said[0].startswith("GRPO step 1: its 2 rollouts held 18 tokens against a budget of 8")
    unbudgeted = EpisodeRollouts(source=_ListSource(groups), rollouts_per_task=2)
    unbudgeted(prompts, _trainer())
    assert unbudgeted.budget_warning is None


def test_rollout_func_trains_no_rollout_the_gate_discarded() -> None:
    """A discarded episode's slot is masked and unscored (TRL leaves it out of the group's
    baseline); its group is trained on the rest, or dropped when one rollout is left."""
    three = [_tokened(0, i, success=i == 0, sampled=10 + i) for i in range(3)]
    other = [_tokened(1, i, success=i == 0, sampled=30 + i) for i in range(3)]
    source = _ListSource(
        [three, other], discard=frozenset({three[1].episode_id, other[1].episode_id})
    )
    rollouts = EpisodeRollouts(source=source, rollouts_per_task=3)
    prompts = [three[0].task_id] * 3 + [other[0].task_id] * 3
    trainer = _trainer()
    out = rollouts(prompts, trainer)
    judged = source.recorded[0]
    assert [g.fate for g in judged.groups] == [GroupFate.TRAINED, GroupFate.TRAINED]
    assert out["env_mask"][1] == [0] and out["completion_ids"][1] == [0]
    assert out["env_mask"][4] == [0]
    rewards = out[REWARD_FIELD]
    assert rewards[1] is None and rewards[4] is None
    assert rewards[0] == three[0].total_reward and rewards[2] == three[2].total_reward
    assert judged.rollouts[0][1] is None and judged.rollouts[0][0] is not None
    assert trainer.logged["grpo/qc_discarded_rollouts"] == 2.0

    lonely = [_tokened(2, i, success=i == 0, sampled=60 + i) for i in range(3)]
    gone = EpisodeRollouts(
        source=_ListSource([lonely], discard=frozenset(t.episode_id for t in lonely[1:])),
        rollouts_per_task=3,
    )
    out = gone([lonely[0].task_id] * 3, _trainer())
    assert out[REWARD_FIELD] == [None] * 3 and all(m == [0] for m in out["env_mask"])
    assert gone.counts.dropped_qc == 1 and gone.counts.qc_discarded_rollouts == 2


def test_rollout_func_refuses_a_batch_that_is_not_whole_groups() -> None:
    rollouts = EpisodeRollouts(source=_ListSource([]), rollouts_per_task=2)
    with pytest.raises(TrainerError, match="not whole groups of 2"):
        rollouts(["a", "a", "b"], _trainer())
    with pytest.raises(TrainerError, match="mix prompts"):
        rollouts(["a", "b"], _trainer())
    short = EpisodeRollouts(source=_ListSource([[episode()]]), rollouts_per_task=2)
    with pytest.raises(TrainerError, match="returned \\[1\\] episodes for 1 groups of 2"):
        short(["a", "a"], _trainer())


def test_episode_grpo_recomputes_activations_unless_told_and_applies_the_budget() -> None:
    # A micro-batch is a group of whole multi-turn rollouts: SmolLM2's first smollm2-rl step
    # was killed for memory without recomputation (TrainingSettings.activation_checkpointing).
    from training.token_budget import TokenBudget

    settings = TrainingSettings(rollouts_per_task=4)
    assert settings.activation_checkpointing is None
    assert episode_grpo_settings(settings).activation_checkpointing is True
    off = settings.model_copy(update={"activation_checkpointing": False})
    assert episode_grpo_settings(off).activation_checkpointing is False
    budget = TokenBudget(
        tokens_per_step=4_800, rollouts_per_task=4, mean_rollout_tokens=600.0,
        measured_episodes=3, groups_per_step=2,
    )  # fmt: skip
    applied = episode_grpo_settings(settings, budget)
    assert (applied.batch_size, applied.gradient_accumulation_steps) == (4, 2)
    assert applied.activation_checkpointing is True
    with pytest.raises(TrainerError, match="planned for 4 rollouts per task"):
        episode_grpo_settings(TrainingSettings(rollouts_per_task=6), budget)


def test_trl_s_warning_for_a_dropped_slot_s_none_reward_is_filtered(caplog) -> None:
    """Episode GRPO gives None on purpose to the slots of dropped groups and discarded
    rollouts (and counts them); TRL's four-line warning for such a row is dropped, its
    other warnings are not. Logged through TRL's own logger (accelerate's, which prefixes
    `[RANK 0] `), as TRL logs it."""
    from accelerate import PartialState
    from trl.trainer import grpo_trainer

    from training.trainers.episode_grpo import episode_grpo_trainer

    episode_grpo_trainer()
    episode_grpo_trainer()  # one filter, however many trainers are built
    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    assert sum(type(f).__name__ == "_DroppedSlotRewards" for f in trl_logger.filters) == 1
    PartialState()  # accelerate's logger needs its state, as a trainer sets it up
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        grpo_trainer.logger.warning(
            "All reward functions returned None for the following kwargs:\n{}\n"
            "Please ensure that at least one reward function returns a valid reward."
        )
        grpo_trainer.logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] something else"]
