"""The error contract: every error a package raises on purpose derives from `EpiflowError`,
so the CLI prints it as one line (plus detail lines) and exits 2, none missing."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from cli.app import USER_ERRORS, report_error
from core.errors import EpiflowError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "agent",
    "cli",
    "collection",
    "config",
    "core",
    "environment",
    "expectations",
    "flows",
    "models",
    "orchestration",
    "reports",
    "sandbox",
    "scoring",
    "storage",
    "suites",
    "training",
)
INTERNAL = {
    # Control flow that never leaves its module: caught where it is raised.
    "agent.loop._EpisodeEnd": "ends the episode loop; caught in run_episode",
    "scoring.grm_prompt.AnswerUnparseable": "an unparseable judge answer; recorded as data",
    "suites.builtin.common.Reject": "a generator rejects a seed's draw and draws again",
    "suites.expressions.ExpressionError": "a template fails; suites turns it into a located SuiteFormatError",
    "suites.user_template.ExpansionFailure": "carries the field's location to SuiteFormatError",
    "cli.interrupts.Interrupted": "a signal stopped the command; caught in cli.collect (exit 130/143)",
    # Runs inside the jail as its own process and imports nothing of epiflow.
    "sandbox.jail_executor.ToolFailure": "in-jail executor; becomes a tool result",
}
"""Exception classes that are not user-facing errors, with why."""


def _project_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        names = [package]
        if hasattr(module, "__path__"):
            names += [
                info.name
                for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}.")
                if ".versions." not in info.name
            ]
        for name in names:
            loaded = importlib.import_module(name)
            for _, cls in inspect.getmembers(loaded, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == name:
                    found[f"{name}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


EXCEPTIONS = _project_exceptions()


def test_the_walk_finds_every_package_root() -> None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in EXCEPTIONS}
    for root in (
        "agent.errors.AgentError",
        "collection.errors.CollectError",
        "config.settings.ConfigError",
        "environment.errors.SessionError",
        "expectations.errors.ExpectationsError",
        "sandbox.errors.SandboxError",
        "scoring.errors.ScoringError",
        "storage.errors.StorageError",
        "suites.errors.SuiteError",
        "training.errors.TrainingError",
    ):
        assert root in names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_class_is_mapped_by_the_cli(cls: type[BaseException]) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in INTERNAL:
        assert not issubclass(cls, EpiflowError), (
            f"{name} is user-facing now: drop it from INTERNAL"
        )
        return
    assert issubclass(cls, EpiflowError), f"{name} must derive from core.errors.EpiflowError"
    assert issubclass(cls, USER_ERRORS)


def test_user_message_is_one_line_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    error = EpiflowError("cannot reach the database\nconnection refused", setting="EPIFLOW_X")
    assert error.user_message() == "cannot reach the database (check EPIFLOW_X)"
    assert report_error(error) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: cannot reach the database (check EPIFLOW_X)"
    assert lines[1].strip() == "connection refused"
