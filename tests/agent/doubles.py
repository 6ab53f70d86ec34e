"""TEST DOUBLES for the agent tests. Nothing here is a real sandbox or a real model.

`MemorySandbox` implements the `sandbox.interface.Sandbox` ABC over an in-memory dict of
files so the loop's control flow (record points, limits, error paths) can be unit-tested
without nsjail; it runs no process at all. `execute_shell` understands only `cat PATH`,
`echo TEXT` and `true`/`false`. The end-to-end tests in `test_agent_e2e_nsjail.py` run
the same loop against real nsjail jails.

`ScriptedTextPolicy` answers a fixed list of texts, for loop paths no real policy
produces on demand (a 10 MB answer, a policy error after two steps).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agent.errors import PolicyError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from sandbox.errors import EpisodeHardTimeout, SandboxCrashed
from sandbox.interface import Sandbox
from sandbox.types import CommandResult, FileChange, InjectedFault, ResourceUsage, ToolResult


def _rel(path: str) -> str:
    return path.removeprefix("/workspace").lstrip("/")


class MemorySandbox(Sandbox):
    """In-memory stand-in for a jail (test double; see the module docstring)."""

    def __init__(
        self,
        files: Mapping[str, str | bytes] | None = None,
        *,
        crash_on_call: int | None = None,
        hard_timeout_on_call: int | None = None,
        soft_timeout_from_call: int | None = None,
        fault_on_call: dict[int, str] | None = None,
    ) -> None:
        self.files: dict[str, bytes] = {
            _rel(k): v.encode() if isinstance(v, str) else v for k, v in (files or {}).items()
        }
        self.crash_on_call = crash_on_call
        self.hard_timeout_on_call = hard_timeout_on_call
        self.soft_timeout_from_call = soft_timeout_from_call
        self.fault_on_call = fault_on_call or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.execs: list[list[str]] = []
        self.closed = 0

    @property
    def spec_hash(self) -> str:
        return "memory-double"

    @property
    def tool_versions(self) -> dict[str, str]:
        return {"execute_shell": "1", "read_file": "1", "write_file": "1", "list_dir": "1"}

    def _result(
        self, tool: str, ok: bool, out: bytes = b"", err: bytes = b"", **kw: Any
    ) -> ToolResult:
        index = len(self.calls) - 1
        soft = self.soft_timeout_from_call is not None and index >= self.soft_timeout_from_call
        return ToolResult(
            tool=tool,
            ok=ok,
            exit_code=kw.pop("exit_code", 0 if ok else 1),
            stdout=out,
            stderr=err,
            duration_ms=1.5,
            resources=ResourceUsage(cpu_ms=0.5, max_rss_kib=1024),
            soft_timeout_warning=soft,
            **kw,
        )

    async def call_tool(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        index = len(self.calls)
        self.calls.append((tool, dict(args)))
        if index == self.crash_on_call:
            raise SandboxCrashed("executor died (double)")
        if index == self.hard_timeout_on_call:
            raise EpisodeHardTimeout("hard timeout (double)")
        fault = self.fault_on_call.get(index)
        if fault is not None:
            return self._result(
                tool,
                False,
                err=b"permission denied (injected)",
                error_type="permission_denied",
                injected_fault=InjectedFault(kind=fault),
                exit_code=None,
            )
        if tool == "read_file":
            data = self.files.get(_rel(args["path"]))
            if data is None:
                return self._result(
                    tool, False, err=b"no such file", error_type="not_found", exit_code=None
                )
            return self._result(tool, True, data, exit_code=None)
        if tool == "write_file":
            rel = _rel(args["path"])
            data = args["content"].encode()
            change = "modified" if rel in self.files else "created"
            self.files[rel] = data
            digest = hashlib.sha256(data).hexdigest()
            return self._result(
                tool,
                True,
                exit_code=None,
                files_changed=[FileChange(path=rel, change=change, size=len(data), sha256=digest)],
            )
        if tool == "list_dir":
            prefix = _rel(args["path"]).rstrip("/")
            names = sorted(
                {
                    k[len(prefix) + 1 :].split("/")[0]
                    for k in self.files
                    if not prefix or k.startswith(prefix + "/")
                }
            )
            return self._result(tool, True, "\n".join(names).encode(), exit_code=None)
        if tool == "execute_shell":
            command = args["command"].strip()
            if command == "true":
                return self._result(tool, True)
            if command == "false":
                return self._result(tool, False, error_type="nonzero_exit")
            if command.startswith("echo "):
                return self._result(tool, True, command[5:].encode() + b"\n")
            if command.startswith("cat "):
                data = self.files.get(_rel(command[4:].strip()))
                if data is None:
                    return self._result(
                        tool, False, err=b"cat: no such file\n", error_type="nonzero_exit"
                    )
                return self._result(tool, True, data)
            return self._result(
                tool,
                False,
                err=b"sh: not supported by the double\n",
                exit_code=127,
                error_type="nonzero_exit",
            )
        raise KeyError(tool)

    async def exec(
        self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        self.execs.append(list(argv))
        return CommandResult(
            exit_code=0, stdout=json.dumps({"score": 1.0, "reason": "double"}).encode()
        )

    async def stop_processes(self) -> None:
        """Nothing to stop: the double runs no process."""

    async def close(self) -> None:
        self.closed += 1


class ScriptedTextPolicy(Policy):
    """Answers `texts` in order; raises `PolicyError(error)` once they run out, if `error` is set."""

    def __init__(self, texts: list[str], *, error: str | None = None, tokens: bool = True) -> None:
        self.spec = "test:scripted-text"
        self.texts = texts
        self.error = error
        self.tokens = tokens

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        if request.step_index >= len(self.texts):
            if self.error is not None:
                raise PolicyError(self.error)
            return PolicyResponse(text="<final>out of script</final>")
        text = self.texts[request.step_index]
        return PolicyResponse(
            text=text,
            prompt_tokens=100 + request.step_index if self.tokens else None,
            completion_tokens=len(text) // 4 if self.tokens else None,
        )
