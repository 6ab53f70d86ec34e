"""Executor answers → `CommandResult` / `ToolResult`; injected faults → `ToolResult`."""

from __future__ import annotations

import base64
from typing import Any

from sandbox.types import CommandResult, FileChange, InjectedFault, ResourceUsage, ToolResult


def _clean(path: str) -> str:
    # Names that are not valid UTF-8 arrive as lone surrogates; keep them printable.
    return path.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def command_result(answer: dict[str, Any]) -> CommandResult:
    """A `CommandResult` from the executor's `exec` answer."""
    return CommandResult(
        exit_code=answer["exit_code"],
        signal=answer["signal"],
        timed_out=answer["timed_out"],
        stdout=base64.b64decode(answer["stdout"]),
        stderr=base64.b64decode(answer["stderr"]),
        stdout_truncated=answer["stdout_truncated"],
        stderr_truncated=answer["stderr_truncated"],
        duration_ms=answer["duration_ms"],
        resources=ResourceUsage(cpu_ms=answer["cpu_ms"], max_rss_kib=answer["max_rss_kib"]),
    )


def file_changes(answer: dict[str, Any]) -> list[FileChange]:
    """The `changes` the executor reported with an answer."""
    return [
        FileChange(path=_clean(c["path"]), change=c["change"], size=c["size"], sha256=c["sha256"])
        for c in answer.get("changes", [])
    ]


def shell_tool_result(answer: dict[str, Any], *, duration_ms: float) -> ToolResult:
    """`execute_shell`'s result: ok on exit code 0; a typed error otherwise."""
    cmd = command_result(answer)
    if cmd.timed_out:
        error_type: str | None = "timeout"
    elif cmd.signal is not None:
        error_type = "signaled"
    elif cmd.exit_code != 0:
        error_type = "command_not_found" if cmd.exit_code == 127 else "nonzero_exit"
    else:
        error_type = None
    return ToolResult(
        tool="execute_shell",
        ok=error_type is None,
        exit_code=cmd.exit_code,
        signal=cmd.signal,
        timed_out=cmd.timed_out,
        error_type=error_type,
        stdout=cmd.stdout,
        stderr=cmd.stderr,
        stdout_truncated=cmd.stdout_truncated,
        stderr_truncated=cmd.stderr_truncated,
        duration_ms=duration_ms,
        resources=cmd.resources,
        files_changed=file_changes(answer),
        extra={"changes_truncated": True} if answer.get("changes_truncated") else {},
    )


def file_tool_result(tool: str, answer: dict[str, Any], *, duration_ms: float) -> ToolResult:
    """`read_file` / `write_file` / `list_dir`: exit code 0 when ok, 1 with a typed error otherwise."""
    changes = file_changes(answer)
    if not answer["ok"]:
        return ToolResult(
            tool=tool,
            ok=False,
            exit_code=1,
            error_type=answer["error_type"],
            stderr=str(answer["message"]).encode("utf-8", "replace") + b"\n",
            duration_ms=duration_ms,
            files_changed=changes,
        )
    extra: dict[str, Any] = {}
    stdout = b""
    truncated = False
    if tool == "read_file":
        stdout = base64.b64decode(answer["content"])
        truncated = answer["truncated"]
        extra["size"] = answer["size"]
    elif tool == "write_file":
        extra["bytes_written"] = answer["bytes_written"]
    elif tool == "list_dir":
        entries = answer["entries"]
        stdout = "".join(f"{_clean(e)}\n" for e in entries).encode("utf-8")
        extra["entries"] = len(entries)
    return ToolResult(
        tool=tool,
        ok=True,
        exit_code=0,
        stdout=stdout,
        stdout_truncated=truncated,
        duration_ms=duration_ms,
        files_changed=changes,
        extra=extra,
    )


_FAULT_MESSAGES = {
    "permission_denied": (b"Permission denied\n", 126),
    "network_failure": (b"Network is unreachable\n", 1),
}


def fault_tool_result(tool: str, fault: InjectedFault, *, duration_ms: float) -> ToolResult:
    """The result of a call an injected fault replaced (the call never ran)."""
    if fault.kind == "tool_timeout":
        return ToolResult(
            tool=tool,
            ok=False,
            exit_code=None,
            signal=9,
            timed_out=True,
            error_type="timeout",
            stderr=b"Tool call timed out\n",
            duration_ms=duration_ms,
            injected_fault=fault,
        )
    message, code = _FAULT_MESSAGES[fault.kind]
    return ToolResult(
        tool=tool,
        ok=False,
        exit_code=code,
        error_type=fault.kind,
        stderr=message,
        duration_ms=duration_ms,
        injected_fault=fault,
    )


def invalid_argument(tool: str, message: str) -> ToolResult:
    """A call whose arguments do not fit the tool's schema (nothing ran)."""
    return ToolResult(
        tool=tool,
        ok=False,
        exit_code=1,
        error_type="invalid_argument",
        stderr=message.encode("utf-8", "replace") + b"\n",
    )
