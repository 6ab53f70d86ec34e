"""Which tasks a GRPO batch draws: uniformly, or toward templates the policy half solves.

A GRPO group teaches only when its rollouts disagree. TRL's own draw (`RepeatSampler`,
uniform over the tasks) spends a step's groups alike on templates the policy already
solves and on templates it cannot solve yet, where most groups come out all successes or
all failures. Seed 000 §5.3 wants tasks at 30-70 % success. With
`TrainingSettings.task_sampling = "success_variance"` each group's template is drawn with
weight p̂(1 − p̂), the variance of its success:

    p̂ = (successes + 1) / (outcomes + 2)

over this run's rollouts of the template so far (a Beta(1, 1) prior: a template not yet
tried has p̂ 0.5 and the largest weight; an infrastructure outcome is not an outcome and
is not counted). A template at 0.5 weighs 0.25; at 0.9 or 0.1, 0.09; after 30 failures
in a row, 0.03. No template's weight reaches 0, so none is dropped for good. Then a task
of that template: each template's tasks in their own shuffled cycle, so a batch does not
repeat a task while the template has others.

`TaskOutcomes` holds the counts: the rollout function (`training.trainers.episode_grpo`)
adds each judged batch's episodes. `SuccessVarianceSampler` is what the trainer's data loader
draws the tasks with instead of `RepeatSampler`, with its batch shape (whole groups,
each batch repeated for the micro-batches and iterations that train on it). It draws a
batch's templates when the loader reaches the batch, so the weights follow the run; the
loader reads ahead (a whole optimiser step's micro-batches, then one more), so a batch's
draw sees the outcomes of the batches two before it and earlier: the first two batches
draw from the prior, uniformly over the templates.

`suites.curriculum` is the offline side of the same seed section: it sorts a policy's
stored episodes into the 30-70 % band to choose what to collect next; this module
weighs the templates online, while one GRPO run learns.

Pure logic: no trainer, no SQL.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["SuccessVarianceSampler", "TaskOutcomes", "TaskSampling", "success_variance"]


class TaskSampling(StrEnum):
    """How GRPO draws a batch's tasks (`TrainingSettings.task_sampling`)."""

    UNIFORM = "uniform"
    """TRL's draw: a shuffled pass over the tasks, each equally likely."""
    SUCCESS_VARIANCE = "success_variance"
    """Each group's template by the variance of its success so far (this module)."""


def success_variance(successes: int, outcomes: int) -> float:
    """p̂(1 − p̂) with p̂ = (successes + 1) / (outcomes + 2): a template's draw weight.

    Raises:
        ValueError: negative counts, or more successes than outcomes.
    """
    if successes < 0 or outcomes < successes:
        raise ValueError(f"{successes} successes of {outcomes} outcomes")
    p = (successes + 1) / (outcomes + 2)
    return p * (1 - p)


@dataclass
class TaskOutcomes:
    """Successes and outcomes per template over a run's rollouts so far."""

    successes: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, template: str, success: bool) -> None:
        """Count one rollout's outcome (not an infrastructure failure's)."""
        self.outcomes[template] = self.outcomes.get(template, 0) + 1
        self.successes[template] = self.successes.get(template, 0) + int(success)

    def weights(self, templates: Sequence[str]) -> list[float]:
        """Each of `templates`' draw weight (`success_variance`), in order."""
        return [
            success_variance(self.successes.get(t, 0), self.outcomes.get(t, 0)) for t in templates
        ]

    def success_rates(self) -> dict[str, float]:
        """Each counted template's success rate (not the smoothed p̂)."""
        return {t: self.successes[t] / n for t, n in self.outcomes.items() if n}


@dataclass
class SuccessVarianceSampler:
    """Dataset indices in `RepeatSampler`'s shape, each group's template drawn by
    `outcomes` (see the module).

    Yields, for each batch: `groups` task indices, each repeated `rollouts_per_task`
    times in a row, the batch repeated `batch_repeats` times (TRL's micro-batches and
    iterations over one generation batch). `len()` is `RepeatSampler`'s for the same
    shape: an epoch has `len(templates) // groups` batches.
    """

    templates: Sequence[str]
    """The template of each dataset row (task), by index."""
    outcomes: TaskOutcomes
    groups: int
    """Groups (tasks) in a generation batch."""
    rollouts_per_task: int
    batch_repeats: int = 1
    seed: int = 0
    rng: random.Random = field(init=False)
    by_template: dict[str, list[int]] = field(init=False)
    order: list[str] = field(init=False)

    def __post_init__(self) -> None:
        if self.groups < 1 or self.rollouts_per_task < 1 or self.batch_repeats < 1:
            raise ValueError(
                f"a batch needs at least one group, rollout and repeat: {self.groups} groups, "
                f"{self.rollouts_per_task} rollouts, {self.batch_repeats} repeats"
            )
        if len(self.templates) < self.groups:
            raise ValueError(f"{len(self.templates)} tasks cannot fill a batch of {self.groups}")
        self.rng = random.Random(self.seed)
        self.by_template = {}
        for index, template in enumerate(self.templates):
            self.by_template.setdefault(template, []).append(index)
        self.order = sorted(self.by_template)
        self._cycles: dict[str, list[int]] = {t: [] for t in self.order}

    def __len__(self) -> int:
        batches = len(self.templates) // self.groups
        return batches * self.groups * self.rollouts_per_task * self.batch_repeats

    def draw(self) -> list[int]:
        """One batch's task indices: each group's template by the weights now, then the
        next task of that template's shuffled cycle (a new shuffle when it runs out)."""
        chosen = self.rng.choices(
            self.order, weights=self.outcomes.weights(self.order), k=self.groups
        )
        batch: list[int] = []
        for template in chosen:
            cycle = self._cycles[template]
            if not cycle:
                cycle.extend(self.by_template[template])
                self.rng.shuffle(cycle)
            batch.append(cycle.pop())
        return batch

    def __iter__(self) -> Iterator[int]:
        for _ in range(len(self.templates) // self.groups):
            batch = self.draw()
            for _ in range(self.batch_repeats):
                for index in batch:
                    for _ in range(self.rollouts_per_task):
                        yield index
