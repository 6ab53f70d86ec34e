"""TRL's GRPO trainer drawing its tasks with `task_sampling = "success_variance"`.

The trainer, TRL's data loader and the success-variance draw are real (the tiny model trains
three steps); the rollouts come from a test double of the rollout collection that
answers by template, without a jail: the jail path of the same trainer is
`test_episode_grpo`'s, and it does not depend on how the tasks were drawn.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from agent.trajectory import Trajectory
from tests.training.factory import episode, tokened_episode
from tests.training.grpo_setup import tiny_grpo_training
from training.errors import TrainerError
from training.task_sampling import SuccessVarianceSampler, TaskSampling
from training.trainers.common import TrainJob
from training.trainers.episode_grpo import JudgedBatch, RolloutBatch, run_episode_grpo


class _TemplateSource:
    """`solved` tasks succeed on every rollout, `mixed` ones on every other."""

    def __init__(self, templates: dict[str, str]) -> None:
        self.templates = templates
        self.batches: list[RolloutBatch] = []

    def generate(self, batch: RolloutBatch) -> list[list[Trajectory]]:
        self.batches.append(batch)
        return [
            [
                tokened_episode(
                    task=int(task_id.rsplit("#", 1)[1].split("-")[0]),
                    rollout=r,
                    success=self.templates[task_id] == "solved" or r % 2 == 0,
                    sampled=10 + r,
                    template=self.templates[task_id],
                )
                for r in range(batch.rollouts_per_task)
            ]
            for task_id in batch.task_ids
        ]

    def admit(self, batch: RolloutBatch, groups: list[list[Trajectory]]) -> frozenset[uuid.UUID]:
        return frozenset()

    def record(self, judged: JudgedBatch) -> None:
        pass


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_trainer_trains_on_the_tasks_the_sampler_drew(
    tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = {
        episode(task=i, template=name).task_id: name
        for i, name in enumerate(["solved"] * 4 + ["mixed"] * 4)
    }
    drawn: list[list[int]] = []
    draw = SuccessVarianceSampler.draw

    def spy(sampler: SuccessVarianceSampler) -> list[int]:
        drawn.append(draw(sampler))
        return drawn[-1]

    monkeypatch.setattr(SuccessVarianceSampler, "draw", spy)
    training = tiny_grpo_training(
        max_steps=3, batch_size=4, rollouts_per_task=2, task_sampling=TaskSampling.SUCCESS_VARIANCE
    )
    job = TrainJob(base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training)
    source = _TemplateSource(templates)
    task_ids = list(templates)

    result, rollouts = run_episode_grpo(
        task_ids, job, source, templates=[templates[t] for t in task_ids]
    )

    assert result.steps == 3 and len(source.batches) == 3
    # Every batch the trainer asked for is a batch the sampler drew, in order (the
    # loader may have drawn one more ahead).
    assert len(drawn) >= 3
    for batch, indices in zip(source.batches, drawn, strict=False):
        assert batch.task_ids == [task_ids[i] for i in indices]
    # The outcomes it draws by are the rollouts' own.
    generated = [templates[t] for b in source.batches for t in b.task_ids for _ in range(2)]
    assert sum(rollouts.outcomes.outcomes.values()) == len(generated) == 12
    assert rollouts.outcomes.outcomes.get("solved", 0) == generated.count("solved")
    if generated.count("mixed"):
        assert rollouts.outcomes.success_rates()["mixed"] == 0.5


def test_success_variance_needs_each_task_s_template(tmp_path: Path) -> None:
    training = tiny_grpo_training(task_sampling=TaskSampling.SUCCESS_VARIANCE)
    job = TrainJob(base_model_dir=tmp_path, output_dir=tmp_path / "rl", settings=training)
    source: Any = _TemplateSource({})
    with pytest.raises(TrainerError, match="draws tasks by template"):
        run_episode_grpo(["t0", "t1"], job, source)
    with pytest.raises(TrainerError, match="1 templates for 2 tasks"):
        run_episode_grpo(["t0", "t1"], job, source, templates=["a"])
