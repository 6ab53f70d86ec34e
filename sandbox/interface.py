"""The `Sandbox` interface: one live, isolated environment per episode.

`agent/` drives episodes through this interface only, so a trivial in-process
implementation can stand in for nsjail in unit tests of pure logic. The real
implementation (one nsjail per episode with an in-jail executor) lives beside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from sandbox.types import CommandResult, ToolResult


class Sandbox(ABC):
    """A started episode environment. Use as an async context manager; `close` is idempotent."""

    @property
    @abstractmethod
    def spec_hash(self) -> str:
        """Stable hash of the spec this sandbox runs under."""

    @property
    @abstractmethod
    def tool_versions(self) -> dict[str, str]:
        """Version string of each tool this sandbox offers."""

    @abstractmethod
    async def call_tool(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        """Execute one tool call (already validated against the tool's schema).

        A failing command, a missing file, an injected fault: all are `ToolResult`s.

        Raises:
            SandboxCrashed: the executor died; the episode is an environment error.
            EpisodeHardTimeout: the episode's hard timeout fired; the jail was killed.
            KeyError: `tool` is not one of this sandbox's tools.
        """

    @abstractmethod
    async def exec(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run one command inside the jail, in `/workspace` (verifiers use this).

        Raises:
            SandboxCrashed: the executor died.
            EpisodeHardTimeout: the episode's hard timeout fired.
        """

    async def run_python(
        self,
        script: str,
        *,
        args: Sequence[str] = (),
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        """Run a Python script as `python3 -I -S -c SCRIPT ARGS…` would, in `/workspace`.

        Stdlib only: nothing in the workspace (or anywhere the agent could write) is on
        `sys.path`, no `site`, no `PYTHON*` variable read. Verifiers use this. The default
        starts that interpreter through `exec`; a sandbox may run it without a process
        start (the nsjail sandbox forks it from its executor).

        Raises:
            SandboxCrashed: the executor died.
            EpisodeHardTimeout: the episode's hard timeout fired.
        """
        return await self.exec(
            ["python3", "-I", "-S", "-c", script, *args], timeout_s=timeout_s, stdin=stdin
        )

    @abstractmethod
    async def stop_processes(self) -> None:
        """Kill every process still running in the sandbox (what the agent left behind).

        Called before a verifier runs, so that nothing of the agent's can touch the files
        the verifier reads while it reads them.

        Raises:
            SandboxCrashed: the executor died.
            EpisodeHardTimeout: the episode's hard timeout fired.
        """

    @abstractmethod
    async def close(self) -> None:
        """Kill everything in the jail and remove its temp dirs. Safe to call twice."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
