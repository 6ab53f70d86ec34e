"""Fixtures of the CLI tests that run `epiflow` as a subprocess: one shared local Prefect
server home and one sandbox state dir per test module (a module's commands share them, as
one user's consecutive commands would)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.local import local_prefect_home, sandbox_state_dir


@pytest.fixture(scope="module")
def prefect_home() -> Iterator[Path]:
    with local_prefect_home() as home:
        yield home


@pytest.fixture(scope="module")
def state_dir() -> Iterator[Path]:
    with sandbox_state_dir() as state:
        yield state
