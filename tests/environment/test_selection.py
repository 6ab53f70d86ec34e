"""A reset's task columns resolved against the hub's suites, each loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import load_settings
from environment.errors import UnknownTask
from environment.selection import LoadedSuites, TaskSelection, resolve_task
from sandbox.settings import SandboxSettings
from suites.builtin import builtin_suite
from suites.registry import load_suite
from suites.settings import SuitesSettings
from suites.suite import Suite
from tests.suites.test_user_suite import VALID, write_suite

SERVED = ["csv_to_json", "dir_tree"]


def test_resets_resolve_against_the_suite_loaded_once() -> None:
    settings = load_settings()
    loads: list[str] = []

    def counted(name: str) -> Suite:
        loads.append(name)
        return load_suite(name, settings=settings.suites, sandbox=settings.sandbox)

    suites = LoadedSuites(counted)
    first = resolve_task(
        TaskSelection(instance_seed=3), suite="builtin", templates=SERVED, suites=suites
    )
    again = resolve_task(
        TaskSelection(task_id=first.task_id), suite="builtin", templates=SERVED, suites=suites
    )
    with pytest.raises(UnknownTask, match="'log_errors' is not served here"):
        resolve_task(
            TaskSelection(template="log_errors"), suite="builtin", templates=SERVED, suites=suites
        )
    assert loads == ["builtin"]
    assert first == again == builtin_suite().generate("csv_to_json", 3)


def test_a_suite_that_failed_to_load_is_loaded_again_on_the_next_reset(tmp_path: Path) -> None:
    """A suite folder that appears after a reset named it is found by the next reset: a
    failed load is not kept."""
    settings = SuitesSettings(path=[tmp_path], include_examples=False)
    loads: list[str] = []

    def counted(name: str) -> Suite:
        loads.append(name)
        return load_suite(name, settings=settings, sandbox=SandboxSettings())

    suites = LoadedSuites(counted)
    with pytest.raises(UnknownTask, match="no suite named 'mini'"):
        resolve_task(TaskSelection(), suite="mini", templates=None, suites=suites)
    write_suite(tmp_path / "mini", VALID)
    task = resolve_task(TaskSelection(), suite="mini", templates=None, suites=suites)
    resolve_task(TaskSelection(instance_seed=1), suite="mini", templates=None, suites=suites)
    assert loads == ["mini", "mini"] and task.template == "hello"
