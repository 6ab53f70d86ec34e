"""Which task a session runs: a reset's task columns resolved against the suites.

A reset names its task by `task_id` (`suite/template@version#seed-digest`, as stored),
or by `suite`, `template` and `instance_seed` (OpenEnv's `seed` stands in for
`instance_seed`); what it leaves out comes from the server's defaults (its `--suite`,
its first `--templates` entry, seed 0). A Harbor task is a template of its suite.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from environment.errors import BadMessage, UnknownTask
from suites.errors import SuiteError
from suites.registry import load_suite
from suites.settings import SuitesSettings
from tasks.types import TaskInstance

__all__ = ["TaskSelection", "resolve_task"]

_TASK_ID = re.compile(r"^(?P<suite>[^/]+)/(?P<template>[^@]+)@[^#]*#(?P<seed>\d+)-[0-9a-f]+$")


class TaskSelection(BaseModel):
    """A reset's task columns (every other key of a reset is refused)."""

    model_config = ConfigDict(extra="forbid")

    suite: str | None = None
    """Suite name (default: the server's)."""
    template: str | None = None
    """Template (or Harbor task) name (default: the server's first)."""
    instance_seed: int | None = Field(default=None, ge=0)
    """Instance seed (default: `seed`, else 0)."""
    task_id: str | None = None
    """A stored task id; overrides suite, template and seed."""
    seed: int | None = Field(default=None, ge=0)
    """OpenEnv's seed: the instance seed when `instance_seed` is absent."""
    episode_id: str | None = None
    """OpenEnv's episode id: accepted and ignored (epiflow's ids are deterministic)."""


def parse_selection(data: Any) -> TaskSelection:
    """The selection a reset's `data` (or a dataset row) describes.

    Raises:
        BadMessage: `data` is not a JSON object of known task columns (`bad_reset`).
    """
    if data is None:
        return TaskSelection()
    if not isinstance(data, dict):
        raise BadMessage("a reset's data must be a JSON object", code="bad_reset")
    try:
        return TaskSelection.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise BadMessage(f"invalid reset: {problems}", code="bad_reset") from e


def resolve_task(
    selection: TaskSelection,
    *,
    suite: str,
    templates: list[str] | None,
    settings: SuitesSettings,
) -> TaskInstance:
    """The task instance `selection` names, within the server's `suite` and `templates`.

    Raises:
        UnknownTask: the suite, template or task id does not exist here, or is not served.
    """
    name, template, seed = selection.suite or suite, selection.template, selection.instance_seed
    if seed is None:
        seed = selection.seed or 0
    if selection.task_id is not None:
        match = _TASK_ID.match(selection.task_id)
        if match is None:
            raise UnknownTask(f"task_id {selection.task_id!r} is not an epiflow task id")
        name, template, seed = match["suite"], match["template"], int(match["seed"])
    if name != suite:
        raise UnknownTask(f"suite {name!r} is not served here (this server serves {suite!r})")
    try:
        loaded = load_suite(name, settings=settings)
        if template is None:
            template = templates[0] if templates else next(iter(loaded.templates))
        if templates is not None and template not in templates:
            raise UnknownTask(
                f"template {template!r} is not served here (served: {', '.join(templates)})"
            )
        task = loaded.generate(template, seed)
    except SuiteError as e:
        raise UnknownTask(f"{name}/{template}: {e}") from e
    if selection.task_id is not None and task.task_id != selection.task_id:
        raise UnknownTask(
            f"task_id {selection.task_id!r} is not this server's version of it ({task.task_id})"
        )
    return task
