"""Task instances: what a task source (`suites/`) hands to the episode loop. Pure data.

A `TaskInstance` is generated deterministically from (template, seed, version): the
workspace files, the prompt, a reference solution (used by the `scripted:oracle`
policy), and a verifier that runs *inside* the sandbox after the episode.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.environment import TaskEnvironment


class ReferenceCall(BaseModel):
    """One tool call of a task's reference solution."""

    model_config = ConfigDict(frozen=True)

    tool: str
    """Tool name."""
    args: dict[str, Any]
    """Arguments, already of the schema's types."""


class VerifierSpec(BaseModel):
    """How to check the outcome, inside the sandbox, after the agent finished.

    The verifier's files are written into the jail after the episode (outside the
    workspace the agent could have tampered with where possible), then `argv` runs and
    must print one JSON object `{"score": float in [0, 1], "reason": str}` on stdout.

    A verifier declared as `["python3", "-I", "-", ARGS…]` with its script as `stdin`
    runs through `Sandbox.run_python`, i.e. as `python3 -I -S` would run it (stdlib
    only); the nsjail sandbox forks it from its executor instead of starting a process.
    """

    model_config = ConfigDict(frozen=True)

    argv: list[str]
    """Command to run in the sandbox, e.g. `["python3", "/tmp/verify/verify.py"]`."""
    files: dict[str, str] = Field(default_factory=dict)
    """Absolute in-jail path → text content, written before `argv` runs."""
    timeout_s: float = 30.0
    """Timeout of the verifier command."""
    stdin: str | None = None
    """Text fed to `argv` on stdin, e.g. the script for `["python3", "-I", "-"]`; None for none."""

    @property
    def inline_python(self) -> tuple[str, list[str]] | None:
        """`(script, args)` when this is `python3 -I - ARGS…` with the script on stdin, else None."""
        if self.stdin is None or self.argv[:3] != ["python3", "-I", "-"]:
            return None
        return self.stdin, self.argv[3:]


class TaskInstance(BaseModel):
    """One concrete task: files, prompt, reference solution, verifier."""

    model_config = ConfigDict(frozen=True)

    suite: str
    """Suite name."""
    suite_version: str
    """Suite version."""
    template: str
    """Template name within the suite."""
    template_version: str
    """Template version; bumping it changes task ids."""
    seed: int
    """Seed the instance was generated from."""
    difficulty: int
    """1 (a 2-step chore) … 5 (a 15-step job with traps)."""
    prompt: str
    """The task as the agent sees it."""
    files: dict[str, str] = Field(default_factory=dict)
    """Workspace-relative path → content of the initial workspace."""
    reference_solution: list[ReferenceCall] = Field(default_factory=list)
    """Tool calls that solve the task (the oracle policy replays them)."""
    reference_final: str = "Done."
    """The oracle's `<final>` text."""
    verifier: VerifierSpec
    """How the outcome is checked."""
    environment: TaskEnvironment | None = None
    """The task's own image and limits (a Harbor task); None: the toolchain jail."""

    @property
    def content_digest(self) -> str:
        """Short hash of what the agent sees (prompt and files): equal digests, same task."""
        return hashlib.sha256(
            json.dumps(
                {"prompt": self.prompt, "files": self.files}, sort_keys=True, ensure_ascii=False
            ).encode()
        ).hexdigest()[:10]

    @property
    def task_id(self) -> str:
        """Stable id: suite/template@version#seed plus a short content hash."""
        return (
            f"{self.suite}/{self.template}@{self.template_version}#{self.seed}"
            f"-{self.content_digest}"
        )


def is_workspace_relative(path: str) -> bool:
    """True when `path` names a file inside the workspace: relative, no `.`/`..`/empty parts.

    The same rule the sandbox applies when it writes workspace files, checked early so a
    suite reports the path with its location instead of failing when an episode starts.
    """
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return not any(part in ("", ".", "..") for part in path.split("/"))
