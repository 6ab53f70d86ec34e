"""The named recipes (`training.recipes`) are valid and wired: every template exists in the
built-in suite, a step budget (not seconds), and the smollm2 recipe trains the shipped
base on the compact prompt that its `openai:` evaluation sends."""

from __future__ import annotations

import pytest

from agent.policies import make_policy
from agent.prompt import PromptStyle, render_system_prompt
from agent.settings import PolicySettings
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.builtin import builtin_suite
from training.errors import TrainerError
from training.pretrained import PRETRAINED
from training.recipes import RECIPES
from training.settings import TrainingSettings
from training.task_sampling import TaskSampling


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_validates_and_budgets_in_steps(name: str) -> None:
    recipe = RECIPES[name]
    settings = recipe.training_settings(TrainingSettings())
    assert settings.max_steps > 0 and settings.max_time_s is None
    suite = builtin_suite()
    assert recipe.templates and set(recipe.templates) <= set(suite.templates)
    heldout = suite.heldout_instances(recipe.heldout, templates=recipe.templates)
    training_seeds = {
        t.seed
        for t in suite.instances(
            recipe.oracle_tasks + recipe.noisy_tasks, templates=recipe.templates
        )
    }
    assert not {t.seed for t in heldout} & training_seeds


def test_the_smollm2_recipe_evaluates_what_it_trains() -> None:
    recipe = RECIPES["smollm2"]
    assert recipe.pretrained in PRETRAINED
    assert len(recipe.templates) >= 6 and recipe.eval_policy == "openai"
    style = recipe.training_settings(TrainingSettings()).prompt_style
    # bench/loop.py's spec for the served checkpoint carries the style it was trained on.
    policy = make_policy(
        f"openai:http://127.0.0.1:1/v1#m?prompt_style={style.value}", settings=PolicySettings()
    )
    assert policy.system_prompt(BUILTIN_TOOLS.values()) == render_system_prompt(
        BUILTIN_TOOLS.values(), style
    )
    assert style == PromptStyle.COMPACT


def test_the_smollm2_rl_recipe_declares_seed_grpo_defaults_in_steps_and_tokens() -> None:
    """Seed 000 §4.4's ranges, a budget of optimiser steps and tokens per step (its 32k
    minimum; never seconds), and the 48 held-out episodes (8 per template) that base, SFT
    and RL are evaluated on."""
    recipe = RECIPES["smollm2-rl"]
    sft = recipe.training_settings(TrainingSettings())
    assert sft == RECIPES["smollm2"].training_settings(TrainingSettings())
    assert recipe.rl is not None and recipe.heldout == recipe.base_heldout == 8
    assert recipe.heldout * len(recipe.templates) == 48
    rl = recipe.rl_settings(sft)
    assert 1e-6 <= rl.rl_learning_rate <= 5e-6
    assert 0.01 <= rl.beta <= 0.1
    assert 0.2 <= rl.clip_epsilon <= 0.3
    assert 4 <= rl.rollouts_per_task <= 8
    assert rl.max_steps == recipe.rl.steps and rl.max_time_s is None
    assert recipe.rl.groups_per_step is None
    assert rl.rl_tokens_per_step == recipe.rl.tokens_per_step == 32_768
    assert rl.gradient_accumulation_steps == 1  # the budget sets it before the trainer
    assert rl.prompt_style == sft.prompt_style == PromptStyle.COMPACT
    # Seed 000 §5.3: groups drawn where the policy's success varies (runs K, L, M).
    assert rl.task_sampling == TaskSampling.SUCCESS_VARIANCE
    assert sft.task_sampling == TaskSampling.UNIFORM  # the SFT stage draws no groups


def test_rl_groups_win_over_tokens_and_tokens_over_the_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step's batch: `--rl-groups` first (the budget then unset), then
    `--rl-tokens-per-step`, then EPIFLOW_TRAINING_RL_TOKENS_PER_STEP, then the recipe's."""
    recipe = RECIPES["smollm2-rl"]
    sft = recipe.training_settings(TrainingSettings())
    by_groups = recipe.rl_settings(sft, groups_per_step=3, tokens_per_step=65_536)
    assert by_groups.rl_tokens_per_step is None
    assert by_groups.batch_size == 3 * by_groups.rollouts_per_task
    assert recipe.rl_settings(sft, tokens_per_step=65_536).rl_tokens_per_step == 65_536
    monkeypatch.setenv("EPIFLOW_TRAINING_RL_TOKENS_PER_STEP", "40000")
    base = TrainingSettings()
    from_env = recipe.rl_settings(recipe.training_settings(base), explicit=base.model_fields_set)
    assert from_env.rl_tokens_per_step == 40_000
    loop = RECIPES["loop-rl"]  # a recipe in groups: the explicit variable wins over it too
    assert (
        loop.rl_settings(
            loop.training_settings(base), explicit=base.model_fields_set
        ).rl_tokens_per_step
        == 40_000
    )
    monkeypatch.delenv("EPIFLOW_TRAINING_RL_TOKENS_PER_STEP")
    plain = loop.rl_settings(loop.training_settings(TrainingSettings()))
    assert loop.rl is not None and loop.rl.groups_per_step is not None
    assert plain.rl_tokens_per_step is None
    assert plain.batch_size == loop.rl.groups_per_step * plain.rollouts_per_task


def test_an_rl_stage_is_sized_by_tokens_or_groups_not_both() -> None:
    from pydantic import ValidationError

    from training.recipes import RlStage

    with pytest.raises(ValidationError, match="tokens_per_step or groups_per_step"):
        RlStage(steps=1, tokens_per_step=32_768, groups_per_step=2)
    with pytest.raises(ValidationError, match="tokens_per_step or groups_per_step"):
        RlStage(steps=1)


def test_rl_settings_take_the_step_and_group_flags_and_keep_explicit_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recipe = RECIPES["loop-rl"]
    monkeypatch.setenv("EPIFLOW_TRAINING_BETA", "0.08")
    explicit = TrainingSettings().model_fields_set
    rl = recipe.rl_settings(
        recipe.training_settings(TrainingSettings()), explicit=explicit, steps=2, groups_per_step=3
    )
    assert (rl.max_steps, rl.batch_size, rl.beta) == (2, 3 * rl.rollouts_per_task, 0.08)


def test_rl_settings_refuse_an_empty_budget_and_a_recipe_without_rl() -> None:
    recipe = RECIPES["loop-rl"]
    with pytest.raises(TrainerError, match="--rl-steps, --rl-groups"):
        recipe.rl_settings(TrainingSettings(), steps=0)
    with pytest.raises(TrainerError, match="no RL stage"):
        RECIPES["smollm2"].rl_settings(TrainingSettings())
