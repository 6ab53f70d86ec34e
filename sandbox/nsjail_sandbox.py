"""`NsjailSandbox`: one episode on one jail — tools, faults, clocks, export.

A tool call is one request to the jail's executor (no new jail). The episode clock starts
when the sandbox is handed out (after the workspace is populated): past the soft timeout
every result carries `soft_timeout_warning`; at the hard timeout a timer kills the jail,
and the call in flight, and every later one, raises `EpisodeHardTimeout`.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox.errors import EpisodeHardTimeout, SandboxCrashed
from sandbox.faults import FaultInjector, FaultProfile
from sandbox.host_setup import HostSetup
from sandbox.interface import Sandbox
from sandbox.jail import Jail
from sandbox.results import (
    command_result,
    fault_tool_result,
    file_tool_result,
    invalid_argument,
    shell_tool_result,
)
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.tool_specs import BUILTIN_TOOLS, tool_versions
from sandbox.transfer import (
    ExportReport,
    TransferError,
    WorkdirShape,
    normalize_files,
    readable,
    safe_relative,
    write_export,
)
from sandbox.types import CommandResult, ToolResult

#: Answers to file operations and exports come back within this long, or the executor is hung.
_FILE_OP_TIMEOUT_S = 60.0


def _check_args(tool: str, args: Mapping[str, Any]) -> str | None:
    """Why `args` do not fit the tool's schema, or None (the protocol layer validates too)."""
    schema = BUILTIN_TOOLS[tool].parameters
    allowed = set(schema["properties"])
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        if name not in allowed:
            return f"unexpected argument {name!r}"
        kind = schema["properties"][name]["type"]
        if kind == "string" and not isinstance(value, str):
            return f"argument {name!r} must be a string"
        if kind == "integer" and (
            isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ):
            return f"argument {name!r} must be a positive integer"
    return None


class NsjailSandbox(Sandbox):
    """A started episode on its own jail. Use `open_sandbox` or `WarmPool.acquire`."""

    def __init__(
        self,
        jail: Jail,
        spec: SandboxSpec,
        host: HostSetup,
        settings: SandboxSettings,
        *,
        faults: FaultProfile | None = None,
        fault_seed: int = 0,
    ) -> None:
        self._jail = jail
        self.spec = spec
        self.settings = settings
        self.limit_mode = host.limit_mode
        """`cgroup_v1`, `cgroup_v2` or `rlimit`: how memory and pids are limited."""
        self.fault_profile = faults or FaultProfile()
        self.fault_seed = fault_seed
        self._injector = FaultInjector(self.fault_profile, fault_seed)
        self._lock = asyncio.Lock()
        self._started_at: float | None = None
        self._hard_timer: asyncio.TimerHandle | None = None
        self._kill_task: asyncio.Task[None] | None = None
        self._hard_timed_out = False
        self._closed = False

    # --- identity -------------------------------------------------------------------

    @property
    def spec_hash(self) -> str:
        return self.spec.spec_hash()

    @property
    def tool_versions(self) -> dict[str, str]:
        return tool_versions()

    @property
    def jail(self) -> Jail:
        """The jail under this episode (pids for leak checks)."""
        return self._jail

    def describe(self) -> dict[str, Any]:
        """Episode metadata: spec and its hash, limit mode, tools, fault profile and seed."""
        return {
            "spec": self.spec.model_dump(mode="json"),
            "spec_hash": self.spec_hash,
            "limit_mode": self.limit_mode,
            "tool_versions": self.tool_versions,
            "fault_profile": self.fault_profile.model_dump(mode="json"),
            "fault_seed": self.fault_seed,
        }

    # --- clocks ---------------------------------------------------------------------

    def start_clock(self) -> None:
        """Start the episode's soft and hard timeouts (done once, when handed out)."""
        if self._started_at is not None:
            return
        self._started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._hard_timer = loop.call_later(self.spec.hard_timeout_s, self._on_hard_timeout)

    @property
    def age_s(self) -> float:
        """Seconds since the episode clock started."""
        return 0.0 if self._started_at is None else time.monotonic() - self._started_at

    @property
    def hard_timed_out(self) -> bool:
        """True once the hard timeout killed the jail."""
        return self._hard_timed_out

    def _on_hard_timeout(self) -> None:
        self._hard_timed_out = True
        self._kill_task = asyncio.get_running_loop().create_task(self._jail.kill())

    def _remaining_s(self) -> float:
        return self.spec.hard_timeout_s - self.age_s

    def _soft_warning(self) -> bool:
        return self._started_at is not None and self.age_s >= self.spec.soft_timeout_s

    def _ensure_usable(self) -> None:
        if self._hard_timed_out or (self._started_at is not None and self._remaining_s() <= 0):
            raise EpisodeHardTimeout(
                f"episode passed its hard timeout of {self.spec.hard_timeout_s:g} s"
            )
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")

    async def _request(self, payload: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        self._ensure_usable()
        try:
            async with self._lock:
                return await self._jail.request(
                    payload, timeout_s=timeout_s + self.settings.response_grace_s
                )
        except SandboxCrashed as e:
            if self._hard_timed_out:
                raise EpisodeHardTimeout(
                    f"episode passed its hard timeout of {self.spec.hard_timeout_s:g} s"
                ) from e
            raise

    def _command_timeout(self, requested: float | None) -> float:
        # Not clamped to the episode's remaining time on purpose: a command still running
        # at the hard timeout dies with the jail and its call raises EpisodeHardTimeout.
        return self.spec.call_timeout(requested)

    # --- commands and tools -----------------------------------------------------------

    async def exec(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        if not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise ValueError(f"argv must be a non-empty list of NUL-free strings, got {argv!r}")
        timeout = self._command_timeout(timeout_s)
        answer = await self._request(
            self._process_payload(timeout, stdin, track=False, op="exec", argv=argv),
            timeout_s=timeout,
        )
        return command_result(answer)

    async def run_python(
        self,
        script: str,
        *,
        args: Sequence[str] = (),
        stdin: bytes | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        """Run `script` in a child forked from the jail's executor: no interpreter start.

        The child has the executor's interpreter (`-I -S`: `sys.path` is the read-only
        stdlib, with the modules of `settings.verifier_preload` already imported), its
        limits and its non-dumpability; its own session, pipes, environment (the spec's),
        `__main__` and `sys.argv` (`["-c", *args]`); the call's timeout and output caps.
        """
        if "\x00" in script or not all(isinstance(a, str) and "\x00" not in a for a in args):
            raise ValueError("script and args must be NUL-free strings")
        timeout = self._command_timeout(timeout_s)
        payload = self._process_payload(
            timeout, stdin, track=False, op="run_python", script=script, args=list(args)
        )
        return command_result(await self._request(payload, timeout_s=timeout))

    async def stop_processes(self) -> None:
        """Kill (and reap) every process of the jail but its executor."""
        await self._request({"op": "stop_processes"}, timeout_s=_FILE_OP_TIMEOUT_S)

    def _process_payload(
        self, timeout: float, stdin: bytes | None, *, track: bool, **request: Any
    ) -> dict[str, Any]:
        """A request that runs one process (`exec`, `run_python`): timeout, caps, stdin."""
        return {
            **request,
            "timeout_s": timeout,
            "cap": self.spec.output_cap_bytes,
            "stdin": None if stdin is None else base64.b64encode(stdin).decode("ascii"),
            "track": track,
        }

    async def call_tool(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        if tool not in BUILTIN_TOOLS:
            raise KeyError(tool)
        self._ensure_usable()
        started = time.monotonic()
        fault = self._injector.next_fault(tool)
        problem = _check_args(tool, args)
        if problem is not None:
            result = invalid_argument(tool, f"{tool}: {problem}")
        elif fault is not None and fault.kind != "latency":
            result = fault_tool_result(tool, fault, duration_ms=0.0)
        else:
            if fault is not None:
                await asyncio.sleep(int(fault.detail["latency_ms"]) / 1000.0)
            result = await self._run_tool(tool, args)
        return result.model_copy(
            update={
                "duration_ms": (time.monotonic() - started) * 1000.0,
                "injected_fault": fault if problem is None else None,
                "soft_timeout_warning": self._soft_warning(),
            }
        )

    async def _run_tool(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        if tool == "execute_shell":
            timeout = self._command_timeout(args.get("timeout"))
            payload = self._process_payload(
                timeout, None, track=True, op="exec", argv=["/bin/sh", "-c", args["command"]]
            )
            answer = await self._request(payload, timeout_s=timeout)
            return shell_tool_result(answer, duration_ms=0.0)
        payload = {
            "op": tool,
            "path": args["path"],
            "cap": self.spec.output_cap_bytes,
            "track": True,
        }
        if tool == "write_file":
            payload["content"] = base64.b64encode(
                args["content"].encode("utf-8", "surrogatepass")
            ).decode("ascii")
        answer = await self._request(payload, timeout_s=_FILE_OP_TIMEOUT_S)
        return file_tool_result(tool, answer, duration_ms=0.0)

    # --- workspace --------------------------------------------------------------------

    async def populate(
        self, files: Mapping[str, str | bytes], *, shape: WorkdirShape | None = None
    ) -> None:
        """Write `files` (paths relative to /workspace) into the workspace, then give it
        `shape` (folders, symlinks, permission bits; the owner always keeps read and search
        bits: the jail user is not root, who reads regardless); not reported as changes.

        Raises:
            TransferError: a path would leave the workspace, the files are too large, or a
                file, folder or link could not be made.
        """
        encoded = normalize_files(files, max_bytes=self.settings.populate_max_bytes)
        failed: list[dict[str, str]] = []
        if encoded:
            answer = await self._request(
                {"op": "put_files", "files": encoded}, timeout_s=_FILE_OP_TIMEOUT_S
            )
            failed += answer["failed"]
        if shape is not None and not shape.is_empty():
            for rel in [*shape.modes, *shape.dirs, *shape.symlinks]:
                safe_relative(rel)
            answer = await self._request(
                {"op": "put_shape", **readable(shape).model_dump()}, timeout_s=_FILE_OP_TIMEOUT_S
            )
            failed += answer["failed"]
        if failed:
            problems = "; ".join(f"{f['path']}: {f['error_type']}" for f in failed[:5])
            raise TransferError(f"cannot write {len(failed)} workspace path(s): {problems}")

    async def export(
        self, dest: Path, *, paths: list[str] | None = None, max_bytes: int | None = None
    ) -> ExportReport:
        """Copy the workspace's regular files (or those under `paths`) into host dir `dest`.

        Symlinks are never followed (in the jail or on the host), nothing is written outside
        `dest`, and at most `max_bytes` (default: the settings' cap) are copied.
        """
        cap = self.settings.export_max_bytes if max_bytes is None else max_bytes
        wanted = (
            None if paths is None else [p.removeprefix("/workspace/").strip("/") for p in paths]
        )
        answer = await self._request(
            {
                "op": "export",
                "paths": wanted,
                "max_bytes": cap,
                "max_files": self.settings.max_tracked_files,
            },
            timeout_s=_FILE_OP_TIMEOUT_S,
        )
        return write_export(answer, dest)

    async def close(self) -> None:
        if self._hard_timer is not None:
            self._hard_timer.cancel()
        self._closed = True
        if self._kill_task is not None:
            await self._kill_task
        await self._jail.kill()
