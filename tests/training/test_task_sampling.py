"""`training.task_sampling`: the success-variance draw of GRPO's tasks, and its trainer mixin."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from trl.trainer.utils import RepeatSampler

from training.errors import TrainerError
from training.task_sampling import SuccessVarianceSampler, TaskOutcomes, success_variance
from training.trainers.task_sampler import TaskSamplerMixin


def test_success_variance_is_the_smoothed_success_rates_variance() -> None:
    assert success_variance(0, 0) == 0.25  # untried: p̂ 0.5, the largest weight
    assert success_variance(15, 30) == 0.25
    assert success_variance(0, 30) == pytest.approx((1 / 32) * (31 / 32))
    assert success_variance(30, 30) == success_variance(0, 30)  # solved weighs as unsolved
    assert success_variance(27, 30) < success_variance(20, 30) < success_variance(15, 30)
    for successes, outcomes in ((-1, 3), (4, 3)):
        with pytest.raises(ValueError, match="successes of"):
            success_variance(successes, outcomes)


def test_task_outcomes_count_per_template() -> None:
    outcomes = TaskOutcomes()
    for success in (True, False, False, True):
        outcomes.add("csv_to_json", success)
    outcomes.add("checksums", False)
    assert outcomes.success_rates() == {"csv_to_json": 0.5, "checksums": 0.0}
    assert outcomes.weights(["csv_to_json", "checksums", "dir_tree"]) == [
        success_variance(2, 4),
        success_variance(0, 1),
        0.25,
    ]


def _batches(sampler: SuccessVarianceSampler | RepeatSampler, size: int) -> list[list[int]]:
    drawn = list(sampler)
    return [drawn[i : i + size] for i in range(0, len(drawn), size)]


def test_the_sampler_has_trls_batch_shape_and_length() -> None:
    templates = ["a"] * 5 + ["b"] * 4 + ["c"] * 3  # 12 tasks
    shape = {"rollouts_per_task": 3, "groups": 2, "batch_repeats": 2}
    ours = SuccessVarianceSampler(templates=templates, outcomes=TaskOutcomes(), seed=1, **shape)
    trls = RepeatSampler(list(range(12)), mini_repeat_count=3, batch_size=2, repeat_count=2, seed=1)
    assert len(ours) == len(trls) == len(list(ours)) == 6 * 2 * 3 * 2
    # A generation batch: 2 tasks, each 3 times in a row; the batch then comes again (the
    # micro-batches or iterations that train on it), as TRL's sampler lays it out.
    for sampler in (ours, trls):
        for batch in _batches(sampler, 2 * 3 * 2):
            first, again = batch[:6], batch[6:]
            assert first == again
            assert first[0:3] == [first[0]] * 3 and first[3:6] == [first[3]] * 3


def test_the_draw_favours_templates_near_half_success() -> None:
    outcomes = TaskOutcomes()
    for template, successes in (("half", 150), ("solved", 300), ("unsolved", 0)):
        for i in range(300):
            outcomes.add(template, i < successes)
    templates = ["half"] * 10 + ["solved"] * 10 + ["unsolved"] * 10
    sampler = SuccessVarianceSampler(
        templates=templates, outcomes=outcomes, groups=1, rollouts_per_task=1, seed=3
    )
    drawn = Counter(templates[sampler.draw()[0]] for _ in range(600))
    # Weights 0.25 against 0.0033 twice: ~97 % of the draws.
    assert drawn["half"] > 0.9 * 600
    assert drawn["solved"] > 0 and drawn["unsolved"] > 0  # never weight 0


def test_each_batch_is_drawn_by_the_outcomes_when_the_loader_reaches_it() -> None:
    outcomes = TaskOutcomes()
    for _ in range(1000):
        outcomes.add("a", False)  # a: hopeless so far; b: untried
    templates = ["a"] * 8 + ["b"] * 8
    sampler = SuccessVarianceSampler(
        templates=templates, outcomes=outcomes, groups=4, rollouts_per_task=2, seed=0
    )
    stream = iter(sampler)
    first = [next(stream) for _ in range(8)]
    assert {templates[i] for i in first} == {"b"}
    for i in range(1000):  # b turns out solved, a turns out half solved
        outcomes.add("b", True)
        outcomes.add("a", i % 2 == 0)
    second = [next(stream) for _ in range(8)]
    assert {templates[i] for i in second} == {"a"}


def test_a_template_s_tasks_come_back_only_after_its_others() -> None:
    templates = ["a", "b", "a", "a"]
    outcomes = TaskOutcomes()
    for _ in range(10_000):
        outcomes.add("b", True)  # b: weight ~1e-4, a: 0.25
    sampler = SuccessVarianceSampler(
        templates=templates, outcomes=outcomes, groups=3, rollouts_per_task=1, seed=5
    )
    assert sorted(sampler.draw()) == [0, 2, 3]  # a's three tasks, none twice


def test_the_sampler_refuses_a_batch_its_tasks_cannot_fill() -> None:
    with pytest.raises(ValueError, match="2 tasks cannot fill a batch of 3"):
        SuccessVarianceSampler(
            templates=["a", "b"], outcomes=TaskOutcomes(), groups=3, rollouts_per_task=2
        )
    with pytest.raises(ValueError, match="at least one group"):
        SuccessVarianceSampler(
            templates=["a"], outcomes=TaskOutcomes(), groups=1, rollouts_per_task=0
        )


class _Dataset:
    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows = rows
        self.column_names = list(rows[0])

    def __getitem__(self, column: str) -> list[str]:
        return [r[column] for r in self.rows]


def _trainer(dataset: _Dataset, outcomes: TaskOutcomes) -> SimpleNamespace:
    return SimpleNamespace(
        train_dataset=dataset,
        num_generations=3,
        num_iterations=2,
        args=SimpleNamespace(generation_batch_size=6, steps_per_generation=4, seed=7),
        task_outcomes=outcomes,
    )


def test_the_mixin_gives_the_trainer_a_sampler_of_its_batch_shape() -> None:
    outcomes = TaskOutcomes()
    rows = [{"prompt": f"t{i}", "template": "ab"[i % 2]} for i in range(6)]
    trainer = _trainer(_Dataset(rows), outcomes)
    sampler = TaskSamplerMixin._get_train_sampler(trainer)  # type: ignore[arg-type]
    assert isinstance(sampler, SuccessVarianceSampler)
    assert sampler.outcomes is outcomes and list(sampler.templates) == ["a", "b"] * 3
    assert (sampler.groups, sampler.rollouts_per_task, sampler.batch_repeats) == (2, 3, 8)
    assert sampler.seed == 7
    untagged = _trainer(_Dataset([{"prompt": "t0"}]), outcomes)
    with pytest.raises(TrainerError, match="needs each task's template"):
        TaskSamplerMixin._get_train_sampler(untagged)  # type: ignore[arg-type]
