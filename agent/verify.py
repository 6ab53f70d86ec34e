"""Running a task's verifier inside the episode's sandbox after the agent finished.

The loop takes any `Verifier`: an async callable `(sandbox, task)` returning an object
with `score`, `reason` and `error` (`VerifierResult`). `resolve_verifier()` prefers the
suites package's `suites.verify.run_verifier` (which also flags a broken verifier as
`error`) and falls back to `run_task_verifier`, which implements the `VerifierSpec`
contract directly: stop what the agent left running, write `spec.files` through
`sandbox.exec` with stdin, run `argv` (`python3 -I -` scripts through
`sandbox.run_python`), read one JSON object `{"score", "reason"}` from stdout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from agent.errors import VerifierError
from sandbox.interface import Sandbox
from suites.types import TaskInstance

__all__ = ["Verifier", "VerifierOutcome", "VerifierResult", "resolve_verifier", "run_task_verifier"]

# `$1` is the path: no shell quoting of user data is needed.
_WRITE_FILE = 'mkdir -p "$(dirname "$1")" && cat > "$1"'


class VerifierOutcome(BaseModel):
    """What a verifier concluded."""

    model_config = ConfigDict(frozen=True)

    score: float
    """Score in [0, 1]."""
    reason: str
    """Short human-readable reason."""
    error: bool = False
    """True when the verifier itself failed (the episode is an environment error, not a failure)."""


class VerifierResult(Protocol):
    """What the loop reads from any verifier's outcome (ours, or `suites.verify.VerifierOutcome`)."""

    @property
    def score(self) -> float: ...

    @property
    def reason(self) -> str: ...

    @property
    def error(self) -> bool: ...


Verifier = Callable[[Sandbox, TaskInstance], Awaitable[VerifierResult]]
"""The verifier interface the loop accepts."""


def _outcome_from_json(stdout: bytes) -> VerifierOutcome:
    text = stdout.decode("utf-8", errors="replace").strip()
    candidates = [line for line in text.splitlines() if line.strip().startswith("{")]
    for line in reversed(candidates or [text]):
        try:
            data: Any = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(data, dict)
            and isinstance(data.get("score"), int | float)
            and not isinstance(data["score"], bool)
        ):
            score = float(data["score"])
            if not math.isfinite(score) or not 0.0 <= score <= 1.0:
                raise VerifierError(f"verifier score must be in [0, 1], got {score}")
            return VerifierOutcome(score=score, reason=str(data.get("reason", "")))
    raise VerifierError(
        f"verifier printed no {{'score', 'reason'}} JSON object; stdout starts {text[:200]!r}"
    )


async def run_task_verifier(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
    """Write the verifier's files, run its argv, parse `{"score", "reason"}` from stdout.

    Raises:
        VerifierError: a file could not be written, or the output holds no valid outcome.
        SandboxCrashed, EpisodeHardTimeout: from the sandbox.
    """
    spec = task.verifier
    await sandbox.stop_processes()
    for path, content in spec.files.items():
        written = await sandbox.exec(
            ["/bin/sh", "-c", _WRITE_FILE, "sh", path],
            stdin=content.encode("utf-8"),
            timeout_s=spec.timeout_s,
        )
        if written.exit_code != 0:
            err = written.stderr.decode("utf-8", errors="replace")[:300]
            raise VerifierError(
                f"cannot write verifier file {path}: exit {written.exit_code}: {err}"
            )
    inline = spec.inline_python
    if inline is not None:
        result = await sandbox.run_python(inline[0], args=inline[1], timeout_s=spec.timeout_s)
    else:
        stdin = spec.stdin.encode() if spec.stdin is not None else None
        result = await sandbox.exec(list(spec.argv), timeout_s=spec.timeout_s, stdin=stdin)
    if result.timed_out:
        raise VerifierError(f"verifier {spec.argv!r} timed out after {spec.timeout_s} s")
    try:
        return _outcome_from_json(result.stdout)
    except VerifierError as e:
        err = result.stderr.decode("utf-8", errors="replace")[:300]
        raise VerifierError(f"{e} (exit {result.exit_code}, stderr {err!r})") from e


def resolve_verifier() -> Verifier:
    """`suites.verify.run_verifier` when the suites package provides it, else `run_task_verifier`."""
    try:
        from suites.verify import run_verifier
    except ImportError:
        return run_task_verifier
    return run_verifier
