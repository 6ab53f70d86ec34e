"""Token-budgeted GRPO batches (`training.token_budget`): the conversion of a budget into
whole groups, the measured mean and its fallback, the batch the trainer is given, and the
warning when a step's rollouts leave the budget far behind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from agent.policies.hf_tokens import ChatTokens
from agent.prompt import PromptStyle
from storage.objects import LocalObjectStore
from tests.training.factory import episode
from training.conversations import episode_messages
from training.errors import TrainerError
from training.settings import TrainingSettings
from training.token_budget import (
    TokenBudget,
    budget_drift_warning,
    groups_per_step,
    plan_token_budget,
    recorded_rollout_tokens,
    rollout_token_counts,
)
from training.trainers.common import TrainJob


def _budget(**update: Any) -> TokenBudget:
    fields: dict[str, Any] = {
        "tokens_per_step": 32_768,
        "rollouts_per_task": 6,
        "mean_rollout_tokens": 600.0,
        "measured_episodes": 180,
        "groups_per_step": 9,
    }
    return TokenBudget(**(fields | update))


def test_a_budget_becomes_the_nearest_whole_number_of_groups() -> None:
    assert groups_per_step(32_768, 6, 600) == 9  # 9.10 groups: the recipe's at ~600 tokens
    assert groups_per_step(32_768, 6, 450) == 12  # 12.14
    assert groups_per_step(1_000, 4, 100) == 3  # 2.5: halves up
    assert groups_per_step(1_000, 4, 111) == 2  # 2.25
    assert groups_per_step(100, 6, 600) == 1  # less than one group: still one


@pytest.mark.parametrize(("tokens", "rollouts", "mean"), [(0, 6, 600), (100, 0, 600), (100, 6, 0)])
def test_a_conversion_without_a_positive_budget_group_or_mean_is_refused(
    tokens: int, rollouts: int, mean: float
) -> None:
    with pytest.raises(TrainerError, match="positive"):
        groups_per_step(tokens, rollouts, mean)


def test_the_plan_uses_the_measured_mean_and_falls_back_to_the_estimate() -> None:
    settings = TrainingSettings(rl_tokens_per_step=8_000, rollouts_per_task=4)
    measured = plan_token_budget(settings, [400, 500, 600])
    assert measured is not None
    assert (measured.mean_rollout_tokens, measured.measured_episodes) == (500.0, 3)
    assert (measured.source, measured.groups_per_step, measured.rollouts_per_step) == (
        "measured",
        4,
        16,
    )
    assert "measured over 3 source episodes" in measured.describe()
    assert measured.as_config()["rollout_tokens_source"] == "measured"

    estimated = plan_token_budget(
        settings.model_copy(update={"rl_rollout_tokens_estimate": 250}), []
    )
    assert estimated is not None
    assert (estimated.source, estimated.measured_episodes) == ("estimate", 0)
    assert (estimated.mean_rollout_tokens, estimated.groups_per_step) == (250.0, 8)
    assert "rl_rollout_tokens_estimate" in estimated.describe()
    # The documented default estimate: the smollm2 recipe's SFT examples (~600 tokens).
    assert TrainingSettings().rl_rollout_tokens_estimate == 600

    assert plan_token_budget(TrainingSettings(), [400]) is None  # no budget set


def test_the_budget_setting_is_validated_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for bad in ("0", "-5", "lots", "1.5"):
        monkeypatch.setenv("EPIFLOW_TRAINING_RL_TOKENS_PER_STEP", bad)
        with pytest.raises(ValidationError, match="EPIFLOW_TRAINING_RL_TOKENS_PER_STEP"):
            TrainingSettings()
    monkeypatch.setenv("EPIFLOW_TRAINING_RL_TOKENS_PER_STEP", "65536")
    assert TrainingSettings().rl_tokens_per_step == 65_536


def test_the_budget_sets_one_group_per_micro_batch_and_the_groups_per_step(
    tmp_path: Path,
) -> None:
    """What TRL is configured with: a generation batch of every group of the step, fed to
    the model one group at a time and accumulated into one optimiser step."""
    from training.trainers.grpo import grpo_config

    budget = _budget()
    settings = budget.applied(TrainingSettings(rollouts_per_task=6, batch_size=24))
    assert (settings.batch_size, settings.gradient_accumulation_steps) == (6, 9)
    assert budget.applied(settings) == settings  # applying it again changes nothing
    config = grpo_config(TrainJob(base_model_dir=tmp_path, output_dir=tmp_path, settings=settings))
    assert config.per_device_train_batch_size == 6 and config.num_generations == 6
    assert config.gradient_accumulation_steps == config.steps_per_generation == 9
    assert config.generation_batch_size == 54 == budget.rollouts_per_step
    assert config.num_iterations == 1  # one optimiser step per generation batch
    twice = settings.model_copy(update={"grpo_iterations": 2})
    config = grpo_config(TrainJob(base_model_dir=tmp_path, output_dir=tmp_path, settings=twice))
    assert config.num_iterations == 2 and config.generation_batch_size == 54


class _Built(Exception):
    """Raised by the stand-in for `train_with`: the trainer is not built."""


def test_run_episode_grpo_hands_trl_the_budgets_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`run_episode_grpo(budget=…)` builds TRL's trainer with the budget's batch. Only
    `train_with` (model loading and `trainer.train()`) is replaced, to see what it is given:
    training with it is the slow `test_episode_grpo.py` tests' part."""
    from training.trainers import episode_grpo

    seen: dict[str, Any] = {}

    def capture(algo: Any, trainer_cls: Any, config: Any, dataset: Any, job: TrainJob, **kw: Any):
        seen.update(config=config, job=job, rollout_func=kw["rollout_func"], rows=len(dataset))
        raise _Built

    monkeypatch.setattr(episode_grpo, "train_with", capture)
    unused: Any = None  # no rollout is generated: the trainer is never built
    budget = _budget(tokens_per_step=4_000, rollouts_per_task=2, mean_rollout_tokens=500.0,
                     groups_per_step=4)  # fmt: skip
    job = TrainJob(
        base_model_dir=tmp_path,
        output_dir=tmp_path / "out",
        settings=TrainingSettings(rollouts_per_task=2, batch_size=2, rl_tokens_per_step=4_000),
    )
    with pytest.raises(_Built):
        episode_grpo.run_episode_grpo(["t1", "t2", "t3", "t4"], job, unused, budget=budget)
    config = seen["config"]
    assert config.per_device_train_batch_size == 2
    assert config.gradient_accumulation_steps == 4 and config.generation_batch_size == 8
    assert seen["job"].settings.gradient_accumulation_steps == 4
    assert seen["rollout_func"].budget == budget and seen["rows"] == 4

    with pytest.raises(TrainerError, match="3 rollouts per task"):
        episode_grpo.run_episode_grpo(
            ["t1"],
            job,
            unused,
            budget=budget.model_copy(update={"rollouts_per_task": 3}),
        )


def test_a_step_far_from_its_budget_says_what_to_change() -> None:
    budget = _budget()
    assert budget_drift_warning(budget, step=1, tokens=32_768 * 2) is None
    assert budget_drift_warning(budget, step=1, tokens=32_768 // 2) is None
    longer = budget_drift_warning(budget, step=3, tokens=97_200)  # 1,800 tokens a rollout
    assert longer is not None
    assert "GRPO step 3" in longer and "97,200 tokens" in longer and "longer" in longer
    assert "3 groups a step hold the budget" in longer  # 32,768 / (6 × 1,800) = 3.03
    assert "EPIFLOW_TRAINING_RL_TOKENS_PER_STEP" in longer and "--rl-groups" in longer
    shorter = budget_drift_warning(budget, step=1, tokens=10_800)  # 200 tokens a rollout
    assert shorter is not None and "shorter" in shorter and "27 groups" in shorter


def test_a_recorded_rollout_counts_its_last_turns_prompt_and_completion() -> None:
    t = episode(task=0)
    assert recorded_rollout_tokens(t) == 0  # no token ids recorded (an infrastructure outcome)
    t.steps[0].prompt_token_ids, t.steps[0].completion_token_ids = [1, 2, 3], [4, 5]
    t.steps[-1].prompt_token_ids, t.steps[-1].completion_token_ids = [1, 2, 3, 4, 5, 6, 7], [8]
    assert recorded_rollout_tokens(t) == 8


def test_source_episodes_are_counted_as_the_policy_encodes_them(tiny_base_model: Path) -> None:
    """The count of an episode is the `hf:` policy's encoding of the chat the trainer's
    chat template renders (`ChatTokens`), the whole episode up to its last assistant turn."""
    from training.trainers.common import load_tokenizer

    tokenizer = load_tokenizer(tiny_base_model)
    episodes = [episode(task=i) for i in range(3)]
    counts = rollout_token_counts(episodes, tokenizer, PromptStyle.COMPACT)
    chat = ChatTokens(tokenizer)
    expected = [
        len(chat.encode(chat.render(episode_messages(t, "compact"), generation_prompt=False)))
        for t in episodes
    ]
    assert counts == expected and all(n > 50 for n in counts)
    full = rollout_token_counts(episodes, tokenizer, PromptStyle.FULL)
    assert all(f > c for f, c in zip(full, counts, strict=True))  # the style is the run's


def test_the_budget_is_measured_on_the_snapshots_source_episodes(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """`collection.grpo_training.plan_rollout_budget`: the source episodes of the grpo
    snapshot's tasks (of the templates trained), read from storage; none of them: the
    estimate, said in the log line."""
    from collection.grpo_training import plan_rollout_budget
    from storage.episodes import persist_episodes
    from training.snapshots import build_snapshot
    from training.trainers.common import load_tokenizer

    collected = [episode(task=i, template=("dir_tree", "checksums")[i % 2]) for i in range(4)]
    persist_episodes(engine, store, collected)
    snapshot = build_snapshot(engine, store, kind="grpo", prompt_style="compact")
    training = TrainingSettings(
        rl_tokens_per_step=2_000, rollouts_per_task=2, prompt_style=PromptStyle.COMPACT
    )
    dir_tree = [t for t in collected if t.template == "dir_tree"]
    counts = rollout_token_counts(dir_tree, load_tokenizer(tiny_base_model), "compact")
    with caplog.at_level(logging.INFO, logger="collection.grpo_training"):
        budget = plan_rollout_budget(
            engine,
            store,
            dataset_id=snapshot.id,
            base_dir=tiny_base_model,
            training=training,
            templates=["dir_tree"],
        )
    assert budget is not None and budget.measured_episodes == 2
    assert budget.mean_rollout_tokens == sum(counts) / 2
    assert budget.groups_per_step == groups_per_step(2_000, 2, sum(counts) / 2)
    assert any("measured over 2 source episodes" in r.getMessage() for r in caplog.records)

    none = plan_rollout_budget(
        engine,
        store,
        dataset_id=snapshot.id,
        base_dir=tiny_base_model,
        training=training,
        templates=["csv_to_json"],
    )
    assert none is not None and none.source == "estimate"
    assert none.mean_rollout_tokens == training.rl_rollout_tokens_estimate
    unset = plan_rollout_budget(
        engine,
        store,
        dataset_id=snapshot.id,
        base_dir=tiny_base_model,
        training=TrainingSettings(),
    )
    assert unset is None
