"""Which task a session runs: a reset's task columns resolved against the suites.

A reset names its task by `task_id` (`suite/template@version#seed-digest`, as stored),
or by `suite`, `template` and `instance_seed` (OpenEnv's `seed` stands in for
`instance_seed`); what it leaves out comes from the server's defaults (its `--suite`,
its first `--templates` entry, seed 0). A Harbor task is a template of its suite.

A server loads its suite once (`LoadedSuites`, one per hub): a reset resolves against the
suite as it was loaded, as a collection run's plan does, instead of reading and hashing a
Harbor dataset's task folders again on every reset.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from environment.errors import BadMessage, UnknownTask
from suites.errors import SuiteError
from suites.suite import Suite
from tasks.types import TaskInstance

__all__ = ["LoadedSuites", "SuiteLoader", "TaskSelection", "resolve_task"]

SuiteLoader = Callable[[str], Suite]
"""Loads a suite by name (the hub's: `suites.registry.load_suite` with the entry point's
suites and sandbox settings). Raises `SuiteError`."""

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


class LoadedSuites:
    """The suites a hub has loaded, by name: each loaded by `load` on first use and kept
    for the hub's life. A suite that fails to load is not kept (the next reset tries
    again). Resets resolve in worker threads: a suite is loaded, and its instances
    generated, under that suite's lock (a user generator's draft cache is not
    thread-safe)."""

    def __init__(self, load: SuiteLoader) -> None:
        self._load = load
        self._suites: dict[str, Suite] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def using(self, name: str) -> Iterator[Suite]:
        """Suite `name`, loaded once, held under its lock for the `with` body.

        Raises:
            SuiteError: the suite does not exist or cannot be loaded.
        """
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._suites:
                self._suites[name] = self._load(name)
            yield self._suites[name]


def resolve_task(
    selection: TaskSelection,
    *,
    suite: str,
    templates: list[str] | None,
    suites: LoadedSuites,
) -> TaskInstance:
    """The task instance `selection` names, within the server's `suite` and `templates`,
    from the hub's loaded `suites`.

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
        with suites.using(name) as loaded:
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
