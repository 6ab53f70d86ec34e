"""A suite: named, versioned set of templates that generates seeded task instances.

Training instances use seeds below `HELDOUT_SEED_BASE`; evaluation uses
`Suite.heldout_instances`, whose seeds start at that base, so a checkpoint is never
evaluated on an instance it could have been trained on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from suites.errors import SeedRangeError, TemplateNotFound
from suites.template import TaskDraft, TaskTemplate
from tasks.types import TaskInstance

HELDOUT_SEED_BASE = 1_000_000_000
"""First seed of the held-out (evaluation) range; training seeds are in [0, this)."""


class TemplateInfo(BaseModel):
    """What `epiflow suites list` shows for one template."""

    model_config = ConfigDict(frozen=True)

    suite: str
    """Suite name."""
    suite_version: str
    """Suite version."""
    template: str
    """Template name."""
    version: str
    """Template version."""
    difficulty: int
    """1 … 5."""
    summary: str
    """One-line description."""


class Suite:
    """Templates plus the suite's name and version; generates `TaskInstance`s."""

    def __init__(
        self,
        name: str,
        version: str,
        templates: Iterable[TaskTemplate],
        *,
        description: str = "",
        source: Path | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.description = description
        self.source = source
        """The folder the suite was loaded from; None for the built-in suite."""
        by_name: dict[str, TaskTemplate] = {}
        for template in templates:
            if template.name in by_name:
                raise ValueError(f"suite {name!r}: duplicate template name {template.name!r}")
            by_name[template.name] = template
        self._templates = by_name

    def __repr__(self) -> str:
        return f"Suite({self.name!r}, version={self.version!r}, templates={len(self._templates)})"

    @property
    def templates(self) -> Mapping[str, TaskTemplate]:
        """Templates by name, in definition order."""
        return self._templates

    def template(self, name: str) -> TaskTemplate:
        """The template called `name`.

        Raises:
            TemplateNotFound: no such template in this suite.
        """
        try:
            return self._templates[name]
        except KeyError:
            known = ", ".join(self._templates)
            raise TemplateNotFound(
                f"suite {self.name!r} has no template {name!r} (known: {known})"
            ) from None

    def info(self) -> list[TemplateInfo]:
        """One `TemplateInfo` per template, in definition order."""
        return [
            TemplateInfo(
                suite=self.name,
                suite_version=self.version,
                template=t.name,
                version=t.version,
                difficulty=t.difficulty,
                summary=t.summary,
            )
            for t in self._templates.values()
        ]

    def generate(self, template: str, seed: int) -> TaskInstance:
        """The instance of `template` for `seed`; the same arguments always give the same task.

        Raises:
            TemplateNotFound: no such template in this suite.
            GeneratorError: a user template's generator failed for this seed.
            SuiteFormatError: a user template's expression failed on a generator's values.
        """
        tmpl = self.template(template)
        return self._instance(tmpl, seed, tmpl.draft(seed))

    def _instance(self, tmpl: TaskTemplate, seed: int, draft: TaskDraft) -> TaskInstance:
        return TaskInstance(
            suite=self.name,
            suite_version=self.version,
            template=tmpl.name,
            template_version=tmpl.version,
            seed=seed,
            difficulty=tmpl.difficulty,
            prompt=draft.prompt,
            files=draft.files,
            reference_solution=draft.reference_solution,
            reference_final=draft.reference_final,
            verifier=draft.verifier,
        )

    def instances(
        self, n: int, *, seed: int = 0, templates: Iterable[str] | None = None
    ) -> list[TaskInstance]:
        """`n` training instances per template (seeds `seed … seed+n-1`), template-major order.

        Raises:
            SeedRangeError: the seeds would reach into the held-out range.
            TemplateNotFound: a name in `templates` is not in this suite.
            GeneratorError: a user template's generator failed for one of the seeds.
            SuiteFormatError: a user template's expression failed on a generator's values.
        """
        if n < 0 or seed < 0:
            raise SeedRangeError(f"n and seed must be non-negative, got n={n}, seed={seed}")
        if seed + n > HELDOUT_SEED_BASE:
            raise SeedRangeError(
                f"training seeds must stay below {HELDOUT_SEED_BASE} (held-out range); "
                f"got seeds {seed}..{seed + n - 1}"
            )
        return self._instances(n, seed, templates)

    def heldout_instances(
        self, n: int, *, seed: int = 0, templates: Iterable[str] | None = None
    ) -> list[TaskInstance]:
        """`n` evaluation instances per template from the held-out seed range.

        Seeds are `HELDOUT_SEED_BASE + seed …`, disjoint from every `instances()` seed.
        """
        if n < 0 or seed < 0:
            raise SeedRangeError(f"n and seed must be non-negative, got n={n}, seed={seed}")
        return self._instances(n, HELDOUT_SEED_BASE + seed, templates)

    def _instances(
        self, n: int, first_seed: int, templates: Iterable[str] | None
    ) -> list[TaskInstance]:
        names = list(templates) if templates is not None else list(self._templates)
        out: list[TaskInstance] = []
        for name in names:
            tmpl = self.template(name)
            seeds = [first_seed + i for i in range(n)]
            # One call per template, so a user generator can run its seeds' jails together.
            out += [
                self._instance(tmpl, s, d) for s, d in zip(seeds, tmpl.drafts(seeds), strict=True)
            ]
        return out


def is_heldout_seed(seed: int) -> bool:
    """True when `seed` belongs to the held-out evaluation range."""
    return seed >= HELDOUT_SEED_BASE
