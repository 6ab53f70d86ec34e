"""The shapes a client sees: OpenEnv's messages, and epiflow's observation and state.

Client → server: `{"type": "reset"|"step"|"state"|"close", "data": {…}}`, one JSON text
frame of at most `MAX_MESSAGE_BYTES`. Server → client: `{"type": "observation", "data":
StepResult}`, `{"type": "state", "data": SessionState}` or `{"type": "error", "data":
{"code": …, "message": …}}` (the codes of `environment.errors`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from environment.errors import BadMessage

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "Observation",
    "SessionState",
    "StepResult",
    "error_message",
    "read_message",
]

MAX_MESSAGE_BYTES = 1 << 20
"""The largest client message read (1 MiB); a larger one gets `too_large` on its session."""

MESSAGE_TYPES = ("reset", "step", "state", "close")
"""The client message types (OpenEnv's)."""

MessageType = Literal["reset", "step", "state", "close"]


class Observation(BaseModel):
    """What the agent observes after a reset or a step (fields that do not apply are left out)."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    """The session's episode (its stored id)."""
    task_id: str
    """The task (`suite/template@version#seed-digest`)."""
    step_index: int | None = None
    """The step being requested next (reset, step) or the last step (done)."""
    instruction: str | None = None
    """The task's instruction (reset)."""
    tools: list[dict[str, Any]] | None = None
    """The tools, as OpenAI function schemas (reset)."""
    system_prompt: str | None = None
    """Protocol v1's system prompt for these tools (reset), for clients that speak it."""
    text: str | None = None
    """The observation of the last step: `<tool_result>`, `<tool_error>` (step, done)."""
    tool: str | None = None
    """The tool the last step called."""
    exit_code: int | None = None
    """Its exit code."""
    parse_error: str | None = None
    """Why the last action was not a valid call (the episode goes on)."""
    step_reward: float | None = None
    """The last step's immediate (shaping) reward."""
    status: str | None = None
    """How the episode ended (done): success, failed, policy_error, timeout…"""
    failure_category: str | None = None
    """Why (done)."""
    failure_reason: str | None = None
    """The reason in words (done)."""
    verifier_score: float | None = None
    """The verifier's score in [0, 1] (done)."""
    verifier_reason: str | None = None
    """The verifier's reason (done)."""
    final_reward: float | None = None
    """The stored final reward (done)."""
    total_reward: float | None = None
    """Immediate rewards plus the final reward (done)."""
    success: bool | None = None
    """Whether the episode succeeded (done)."""


class StepResult(BaseModel):
    """The `data` of an `observation` message (OpenEnv's shape)."""

    observation: Observation
    reward: float | None = None
    """The step's immediate reward; the final reward when `done`; None after a reset."""
    done: bool = False
    """Whether the episode ended (stored, verifier run)."""


class SessionState(BaseModel):
    """The `data` of a `state` message."""

    episode_id: str
    task_id: str
    run_key: str
    """The collection run the session's episode belongs to."""
    done: bool
    closed: str | None = None
    """Why the session was closed before its end, if it was."""
    status: str
    """`running`, or how the episode ended."""
    step_count: int | None = None
    """Steps stored (done)."""


def read_message(raw: str | bytes) -> tuple[MessageType, Any]:
    """(type, data) of one client message.

    Raises:
        BadMessage: too large (`too_large`), not JSON (`bad_json`), or not a message of
            a known type (`unknown_type`).
    """
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > MAX_MESSAGE_BYTES:
        raise BadMessage(
            f"message of {size} bytes is over the {MAX_MESSAGE_BYTES}-byte cap", code="too_large"
        )
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadMessage(f"the message is not JSON: {e}", code="bad_json") from e
    if not isinstance(message, dict):
        raise BadMessage("a message is a JSON object {type, data}", code="bad_json")
    kind = message.get("type")
    if kind not in MESSAGE_TYPES:
        raise BadMessage(
            f"unknown message type {kind!r} (use one of {', '.join(MESSAGE_TYPES)})",
            code="unknown_type",
        )
    return kind, message.get("data")


def error_message(code: str, message: str) -> dict[str, Any]:
    """An `error` message."""
    return {"type": "error", "data": {"code": code, "message": message}}
