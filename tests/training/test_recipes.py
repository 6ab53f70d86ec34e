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
from training.pretrained import PRETRAINED
from training.recipes import RECIPES
from training.settings import TrainingSettings


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
