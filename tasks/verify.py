"""Run a task's verifier inside the sandbox and turn its output into a `VerifierOutcome`.

The verifier never reads agent-written files on the host: its files are written into the
jail (outside `/workspace`) and its command runs there, after every process the agent
left running was killed (`Sandbox.stop_processes`): through `Sandbox.run_python` for
`python3 -I -` verifiers (no process start on nsjail), `Sandbox.exec` otherwise. Its
contract: exit code 0 and, as the last non-empty line of stdout, one JSON object
`{"score": <number in [0, 1]>, "reason": <string>}`. Anything else (a crash, a timeout,
garbage, a score out of range) is score 0 with `error=True`, so a broken verifier is
visible in the data and never silently counted as a failed agent.

This is the one verifier runner: the episode loop (`agent.loop.run_episode`'s default
`verify`), GRPO's sandbox reward, `epiflow suites check` and every suite use it. Public API:

- `run_verifier(sandbox, task) -> VerifierOutcome`: install and run `task.verifier`;
- `VerifierOutcome`: the verdict (score, reason, `error`, raw output, timing);
- `Verifier`: the shape of `run_verifier`, what the loop accepts as `verify=`;
- `parse_verifier_stdout(stdout) -> (score, reason)`: the output contract alone.
"""

from __future__ import annotations

import json
import math
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox.interface import Sandbox
from sandbox.types import CommandResult, output_text
from tasks.types import TaskInstance

__all__ = ["Verifier", "VerifierOutcome", "parse_verifier_stdout", "run_verifier"]

MAX_REASON_CHARS = 500
"""Reasons are short by contract; longer ones are cut so they fit a SQL column."""
MAX_RAW_CHARS = 8_000
"""How much of the verifier's raw stdout/stderr the outcome keeps."""

# Installs the verifier's files from a JSON payload on stdin. It runs through
# `Sandbox.run_python` (stdlib only: a module the agent planted in /workspace cannot
# shadow it), and it replaces whatever the agent may have put at those paths (a symlink,
# a directory) instead of writing through it.
_INSTALL_SCRIPT = """\
import json, os, shutil, sys
files = json.loads(sys.stdin.readline())
for path, text in files.items():
    parts = path.split("/")
    for i in range(3, len(parts)):
        ancestor = "/".join(parts[:i])
        if os.path.islink(ancestor) or (os.path.exists(ancestor) and not os.path.isdir(ancestor)):
            os.unlink(ancestor)
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
"""


class VerifierOutcome(BaseModel):
    """The verdict of one verifier run."""

    model_config = ConfigDict(frozen=True)

    score: float = Field(ge=0.0, le=1.0)
    """Score in [0, 1]; 0 whenever `error` is set."""
    reason: str
    """Short reason from the verifier, or what went wrong running it."""
    error: bool = False
    """True when the verifier itself failed (crash, timeout, unparseable output)."""
    exit_code: int | None = None
    """Exit code of the verifier command; None when killed by a signal or not run."""
    timed_out: bool = False
    """True when the verifier hit its timeout."""
    stdout: str = ""
    """The verifier's raw stdout (capped at `MAX_RAW_CHARS`)."""
    stderr: str = ""
    """The verifier's raw stderr (capped at `MAX_RAW_CHARS`)."""
    duration_ms: float = 0.0
    """Wall time of installing and running the verifier, milliseconds."""
    details: dict[str, Any] = Field(default_factory=dict)
    """What a verifier reports beyond the score (a Harbor task's reward keys, per-test
    results, image and substitutions: `tasks/harbor_verify.py`); stored with the episode."""


Verifier = Callable[[Sandbox, TaskInstance], Awaitable[VerifierOutcome]]
"""What the episode loop accepts as its verifier: `run_verifier`, or a test's double."""


def parse_verifier_stdout(stdout: str) -> tuple[float, str]:
    """Score and reason from a verifier's stdout.

    Raises:
        ValueError: no JSON object on the last non-empty line, or a bad `score`/`reason`.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("verifier printed nothing on stdout")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"last stdout line is not JSON: {_clip(lines[-1], 120)!r}") from e
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    score = data.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise ValueError(f"`score` must be a number in [0, 1], got {score!r}")
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise ValueError(f"`score` must be a number in [0, 1], got {score!r}")
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError(f"`reason` must be a string, got {type(reason).__name__}")
    return float(score), _clip(reason, MAX_REASON_CHARS)


async def run_verifier(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
    """Install and run `task.verifier` inside `sandbox`; never raises for a broken verifier.

    Raises:
        SandboxCrashed: the sandbox died while the verifier ran (an environment error).
        EpisodeHardTimeout: the episode's hard timeout fired.
    """
    if task.environment is not None:  # a Harbor task: its own tests/test.sh in its own image
        from tasks.harbor_verify import run_harbor_verifier

        return await run_harbor_verifier(sandbox, task)
    spec = task.verifier
    started = time.perf_counter()

    def elapsed_ms() -> float:
        return (time.perf_counter() - started) * 1000.0

    bad_paths = [p for p in spec.files if not _is_outside_workspace(p)]
    if bad_paths:
        return VerifierOutcome(
            score=0.0,
            reason=f"verifier error: files must be absolute paths outside /workspace: {bad_paths}",
            error=True,
        )
    # Nothing the agent left running may touch the files while the verifier reads them.
    await sandbox.stop_processes()
    if spec.files:
        installed = await sandbox.run_python(
            _INSTALL_SCRIPT,
            timeout_s=spec.timeout_s,
            stdin=json.dumps(spec.files, ensure_ascii=False).encode() + b"\n",
        )
        if installed.exit_code != 0 or installed.timed_out:
            detail = _clip(output_text(installed.stderr).strip(), 200)
            return _outcome(installed, f"could not install verifier files: {detail}", elapsed_ms())

    inline = spec.inline_python
    if inline is not None:
        script, args = inline
        result = await sandbox.run_python(script, args=args, timeout_s=spec.timeout_s)
    else:
        result = await sandbox.exec(
            list(spec.argv),
            timeout_s=spec.timeout_s,
            stdin=spec.stdin.encode() if spec.stdin is not None else None,
        )
    if result.timed_out:
        return _outcome(result, f"timed out after {spec.timeout_s:g}s", elapsed_ms())
    if result.exit_code != 0:
        stderr = output_text(result.stderr).strip()
        tail = _clip(stderr.splitlines()[-1], 200) if stderr else "no stderr"
        how = f"exit code {result.exit_code}" if result.exit_code is not None else "a signal"
        return _outcome(result, f"crashed with {how}: {tail}", elapsed_ms())
    try:
        score, reason = parse_verifier_stdout(output_text(result.stdout))
    except ValueError as e:
        return _outcome(result, str(e), elapsed_ms())
    return _outcome(result, reason, elapsed_ms(), score=score)


def _outcome(
    result: CommandResult, reason: str, duration_ms: float, *, score: float | None = None
) -> VerifierOutcome:
    """A successful verdict when `score` is given, else a flagged verifier error."""
    error = score is None
    return VerifierOutcome(
        score=0.0 if score is None else score,
        reason=f"verifier error: {reason}" if error else reason,
        error=error,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        stdout=_clip(output_text(result.stdout), MAX_RAW_CHARS),
        stderr=_clip(output_text(result.stderr), MAX_RAW_CHARS),
        duration_ms=duration_ms,
    )


def _is_outside_workspace(path: str) -> bool:
    norm = posixpath.normpath(path)
    return norm.startswith("/") and not (norm == "/workspace" or norm.startswith("/workspace/"))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
