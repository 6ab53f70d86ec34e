"""Result types the sandbox hands back: pure data, shared with `agent/` and `storage/`.

A failed command is a result (non-zero exit code, stderr, `error_type`), never an
exception; exceptions (`sandbox.errors`) mean the sandbox itself is unusable.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def output_text(data: bytes) -> str:
    """A command's output bytes as text: UTF-8, U+FFFD for bytes that are not, NULs dropped.

    The one decoding of output: a step's text (`agent.render.decode_step_text`), a stored
    row's (`storage.sanitize.decode_row_text`) and a verifier's (`tasks.verify`) use it.
    """
    return data.decode("utf-8", errors="replace").replace("\x00", "")


class ResourceUsage(BaseModel):
    """Resources one tool call consumed inside the jail (from the executor's rusage)."""

    model_config = ConfigDict(frozen=True)

    cpu_ms: float = 0.0
    """User + system CPU time of the command and its children, milliseconds."""
    max_rss_kib: int = 0
    """Peak resident set size of the command, KiB."""


class FileChange(BaseModel):
    """A workspace file a tool call created, modified or deleted."""

    model_config = ConfigDict(frozen=True)

    path: str
    """Path relative to the workspace root."""
    change: str
    """One of `created`, `modified`, `deleted`."""
    size: int | None = None
    """Size in bytes after the call; None when deleted."""
    sha256: str | None = None
    """sha256 of the content after the call; None when deleted."""


class InjectedFault(BaseModel):
    """A fault the sandbox injected on purpose into this step (seeded, replayable)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    """One of `latency`, `permission_denied`, `network_failure`, `tool_timeout`."""
    detail: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the fault, e.g. `{"latency_ms": 1400}`."""


class CommandResult(BaseModel):
    """One command executed inside a live jail by the in-jail executor."""

    model_config = ConfigDict(frozen=True)

    exit_code: int | None
    """Exit code; None when the command was killed by a signal."""
    signal: int | None = None
    """Signal that ended the command, if any."""
    timed_out: bool = False
    """True when the per-call timeout killed the command."""
    stdout: bytes = b""
    """Standard output, capped at the spec's per-stream cap."""
    stderr: bytes = b""
    """Standard error, capped at the spec's per-stream cap."""
    stdout_truncated: bool = False
    """True when the command wrote more stdout than the cap."""
    stderr_truncated: bool = False
    """True when the command wrote more stderr than the cap."""
    duration_ms: float = 0.0
    """Wall time of the command inside the jail, milliseconds."""
    resources: ResourceUsage = Field(default_factory=ResourceUsage)
    """rusage of the command."""


class ToolResult(BaseModel):
    """The outcome of one tool call (`execute_shell`, `read_file`, `write_file`, `list_dir`)."""

    model_config = ConfigDict(frozen=True)

    tool: str
    """Tool name."""
    ok: bool
    """True when the tool did what was asked (exit code 0, no error type)."""
    exit_code: int | None = None
    """Exit code of the underlying command, when there was one."""
    signal: int | None = None
    """Signal that killed the underlying command, if any."""
    timed_out: bool = False
    """True when the per-call timeout (or an injected tool timeout) ended the call."""
    error_type: str | None = None
    """Typed failure: `not_found`, `permission_denied`, `is_a_directory`, `outside_workspace`,
    `timeout`, `network_failure`, `invalid_argument`, `nonzero_exit`, …; None when ok."""
    stdout: bytes = b""
    """Output the model sees (file content for `read_file`, listing for `list_dir`)."""
    stderr: bytes = b""
    """Error output the model sees."""
    stdout_truncated: bool = False
    """True when the output was capped."""
    stderr_truncated: bool = False
    """True when the error output was capped."""
    duration_ms: float = 0.0
    """Wall time of the call, injected latency included, milliseconds."""
    resources: ResourceUsage = Field(default_factory=ResourceUsage)
    """rusage of the call."""
    files_changed: list[FileChange] = Field(default_factory=list)
    """Workspace files the call created, modified or deleted."""
    injected_fault: InjectedFault | None = None
    """The fault injected into this call, if any."""
    soft_timeout_warning: bool = False
    """True when the episode passed its soft timeout: the observation must warn the agent."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Tool-specific details (e.g. `{"bytes_written": 12}`)."""
