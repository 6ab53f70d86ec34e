"""Fixtures of the agent tests: a small task, loop settings, the in-memory sandbox double.

Async code runs through `asyncio.run` inside plain test functions (no asyncio plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent.settings import LoopSettings
from sandbox.interface import Sandbox
from sandbox.spec import SandboxSpec
from tasks.types import ReferenceCall, TaskInstance, VerifierSpec
from tasks.verify import VerifierOutcome
from tests.agent.doubles import MemorySandbox

VERIFY_SCRIPT = """\
import json, pathlib
p = pathlib.Path("/workspace/out.txt")
ok = p.is_file() and p.read_text() == "HELLO\\n"
print(json.dumps({"score": 1.0 if ok else 0.0, "reason": "out.txt ok" if ok else "out.txt missing or wrong"}))
"""


def make_copy_task(seed: int = 0) -> TaskInstance:
    """Read data/in.txt, write its upper-cased content to out.txt (verifier runs in the jail)."""
    return TaskInstance(
        suite="agent-tests",
        suite_version="1",
        template="upper_copy",
        template_version="1",
        seed=seed,
        difficulty=1,
        prompt="Write the content of data/in.txt, upper-cased, to out.txt in /workspace.",
        files={"data/in.txt": "hello\n"},
        reference_solution=[
            ReferenceCall(tool="list_dir", args={"path": "data"}),
            ReferenceCall(tool="read_file", args={"path": "data/in.txt"}),
            ReferenceCall(tool="execute_shell", args={"command": "cat data/in.txt", "timeout": 10}),
            ReferenceCall(tool="write_file", args={"path": "out.txt", "content": "HELLO\n"}),
        ],
        reference_final="out.txt now holds HELLO.",
        verifier=VerifierSpec(argv=["python3", "-I", "-c", VERIFY_SCRIPT], timeout_s=20),
    )


@pytest.fixture
def task() -> TaskInstance:
    return make_copy_task()


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(
        memory_mib=512, pids=64, tmpfs_mib=32, workspace_mib=64, inodes=4096, call_timeout_s=10
    )


@pytest.fixture
def loop_settings() -> LoopSettings:
    return LoopSettings(max_steps=12)


async def memory_verify(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
    """Verifier for the double: the same check as VERIFY_SCRIPT, on the in-memory files."""
    assert isinstance(sandbox, MemorySandbox)
    ok = sandbox.files.get("out.txt") == b"HELLO\n"
    return VerifierOutcome(
        score=1.0 if ok else 0.0, reason="out.txt ok" if ok else "out.txt missing or wrong"
    )


class MemoryOpener:
    """`open_sandbox` stand-in that builds `MemorySandbox` doubles and remembers them."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.opened: list[MemorySandbox] = []

    async def __call__(
        self, spec: SandboxSpec, *, files: Any = None, faults: Any = None, fault_seed: int = 0
    ) -> Sandbox:
        box = MemorySandbox(files, **self.options)
        self.opened.append(box)
        return box


@pytest.fixture
def memory_opener() -> Callable[..., MemoryOpener]:
    return MemoryOpener
