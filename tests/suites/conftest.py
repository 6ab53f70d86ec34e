"""Fixtures for the suites tests: real nsjail sandboxes (no doubles).

Tests are plain functions that `asyncio.run` their body (no asyncio plugin). Verifiers
and reference solutions run in real jails: that is what the suites promise.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from sandbox.interface import Sandbox

OpenSandbox = Callable[[Mapping[str, str]], Awaitable[Sandbox]]


@pytest.fixture(scope="session")
def open_task_sandbox() -> OpenSandbox:
    """`await open_task_sandbox(files)`: a fresh real nsjail sandbox with `files` in /workspace."""
    try:
        sandbox_pkg: Any = importlib.import_module("sandbox")
        open_sandbox = sandbox_pkg.open_sandbox
        spec = sandbox_pkg.SandboxSpec()
        settings = sandbox_pkg.SandboxSettings()
    except (ImportError, AttributeError) as e:
        pytest.skip(f"sandbox.open_sandbox is not importable yet ({e}); suites need real nsjail")

    async def opener(files: Mapping[str, str]) -> Sandbox:
        box: Sandbox = await open_sandbox(spec, files=dict(files), settings=settings)
        return box

    return opener
