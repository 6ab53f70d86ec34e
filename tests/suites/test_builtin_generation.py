"""Generation of built-in instances: determinism, seed ranges, reference solutions' shape."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.tool_specs import BUILTIN_TOOLS
from suites.builtin import BUILTIN_TEMPLATES, builtin_suite
from suites.errors import SeedRangeError, TemplateNotFound
from suites.suite import HELDOUT_SEED_BASE, is_heldout_seed
from suites.user_suite import tool_args_problems

SUITE = builtin_suite()
NAMES = [t.name for t in BUILTIN_TEMPLATES]


def test_suite_spans_at_least_twelve_templates_and_every_difficulty():
    assert len(SUITE.templates) >= 12
    assert {t.difficulty for t in SUITE.templates.values()} == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**40))
def test_same_seed_same_instance_regardless_of_global_random_state(name, seed):
    random.seed(1)
    first = SUITE.generate(name, seed)
    random.seed(2)
    second = SUITE.generate(name, seed)
    assert first == second
    assert first.task_id == second.task_id
    assert first.model_dump_json() == second.model_dump_json()


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_give_different_tasks(name):
    ids = {SUITE.generate(name, seed).task_id for seed in range(6)}
    assert len(ids) == 6


@pytest.mark.parametrize("name", NAMES)
def test_instance_metadata(name):
    task = SUITE.generate(name, 7)
    template = SUITE.templates[name]
    assert (task.suite, task.template, task.seed) == ("builtin", name, 7)
    assert task.template_version == template.version
    assert task.difficulty == template.difficulty
    assert task.task_id.startswith(f"builtin/{name}@{template.version}#7-")


@pytest.mark.parametrize("name", NAMES)
def test_reference_solution_uses_only_the_four_tools_with_valid_args(name):
    for seed in range(3):
        task = SUITE.generate(name, seed)
        assert task.reference_solution
        for call in task.reference_solution:
            assert call.tool in BUILTIN_TOOLS
            assert tool_args_problems(call.tool, call.args) == []


@pytest.mark.parametrize("name", NAMES)
def test_workspace_paths_are_relative_and_verifier_runs_isolated(name):
    task = SUITE.generate(name, 0)
    assert all(not p.startswith("/") and ".." not in p.split("/") for p in task.files)
    # -I: a module planted in /workspace cannot shadow the verifier's stdlib imports.
    assert task.verifier.argv[:2] == ["python3", "-I"]
    assert task.verifier.stdin


def test_easy_templates_are_short_and_hard_ones_longer():
    for template in SUITE.templates.values():
        lengths = [len(SUITE.generate(template.name, s).reference_solution) for s in range(3)]
        if template.difficulty == 1:
            assert max(lengths) <= 3, template.name
        assert max(lengths) <= 16, template.name
    hardest = [t for t in SUITE.templates.values() if t.difficulty == 5]
    assert all(len(SUITE.generate(t.name, 0).reference_solution) >= 10 for t in hardest)


def test_instances_are_n_per_template_with_consecutive_seeds():
    tasks = SUITE.instances(3, seed=10)
    assert len(tasks) == 3 * len(SUITE.templates)
    for name in SUITE.templates:
        assert [t.seed for t in tasks if t.template == name] == [10, 11, 12]
    assert SUITE.instances(3, seed=10) == tasks


def test_heldout_instances_never_overlap_training_seeds():
    held = SUITE.heldout_instances(2, templates=["csv_to_json"])
    assert [t.seed for t in held] == [HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + 1]
    assert all(is_heldout_seed(t.seed) for t in held)
    train_ids = {t.task_id for t in SUITE.instances(2, templates=["csv_to_json"])}
    assert train_ids.isdisjoint(t.task_id for t in held)
    with pytest.raises(SeedRangeError, match="held-out"):
        SUITE.instances(2, seed=HELDOUT_SEED_BASE - 1)


def test_unknown_template_is_a_clear_error():
    with pytest.raises(TemplateNotFound, match=r"no template 'nope'.*csv_to_json"):
        SUITE.generate("nope", 0)


def test_generation_does_not_depend_on_the_interpreter_hash_seed():
    # Set iteration order changes with PYTHONHASHSEED; a template that leaked it into its
    # output would generate different tasks in different worker processes.
    script = (
        "import hashlib\n"
        "from suites.builtin import builtin_suite\n"
        "s = builtin_suite()\n"
        "print(hashlib.sha256(''.join(t.model_dump_json() for t in s.instances(3)).encode()).hexdigest())\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(digests) == 1
