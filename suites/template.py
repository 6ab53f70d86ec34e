"""Task templates: a name, a version, a difficulty and a seeded generator of task drafts.

A template turns a seed into a `TaskDraft` (prompt, workspace files, reference solution,
verifier) using only `random.Random(seed)`, so the same (template, version, seed) always
yields the same task. The `Suite` wraps drafts into `TaskInstance`s with its own metadata.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from tasks.types import ReferenceCall, VerifierSpec


class TaskDraft(BaseModel):
    """What a template generates for one seed; the suite adds names, versions and the seed."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    """The task as the agent sees it."""
    files: dict[str, str] = Field(default_factory=dict)
    """Workspace-relative path → content of the initial workspace."""
    reference_solution: list[ReferenceCall] = Field(default_factory=list)
    """Tool calls that solve the task (replayed by the oracle policy)."""
    reference_final: str = "Done."
    """The oracle's `<final>` text."""
    verifier: VerifierSpec
    """How the outcome is checked inside the sandbox."""


@dataclass(frozen=True)
class TaskTemplate:
    """A named, versioned generator of tasks of one kind.

    Give `build` (a function of a seeded `Random`, as every built-in template does) or
    `build_seeds` (drafts of several seeds at once: user templates whose generator script
    runs in a jail per seed, started concurrently).
    """

    name: str
    """Template name, unique within its suite."""
    version: str
    """Bumped whenever generated tasks or the verifier change (task ids change with it)."""
    difficulty: int
    """1 (a 2-step chore) … 5 (a ~15-step job with traps)."""
    summary: str
    """One line for `epiflow suites list`."""
    build: Callable[[random.Random], TaskDraft] | None = None
    """Generator; must draw every random choice from the `Random` it is given."""
    build_seeds: Callable[[Sequence[int]], list[TaskDraft]] | None = None
    """Generator of several seeds at once, one draft per seed, in order; deterministic per seed."""

    def __post_init__(self) -> None:
        if not 1 <= self.difficulty <= 5:
            raise ValueError(f"difficulty must be 1..5, got {self.difficulty} ({self.name})")
        if (self.build is None) == (self.build_seeds is None):
            raise ValueError(f"give exactly one of build or build_seeds ({self.name})")

    def draft(self, seed: int) -> TaskDraft:
        """The draft for `seed`; deterministic."""
        return self.drafts([seed])[0]

    def drafts(self, seeds: Sequence[int]) -> list[TaskDraft]:
        """The drafts for `seeds`, in order; each the same as `draft(seed)`."""
        if self.build_seeds is not None:
            return self.build_seeds(list(seeds))
        assert self.build is not None  # __post_init__ allows no third case
        return [self.build(random.Random(seed)) for seed in seeds]


def call(tool: str, **args: object) -> ReferenceCall:
    """Shorthand for one reference tool call: `call("read_file", path="a.csv")`."""
    return ReferenceCall(tool=tool, args=dict(args))
