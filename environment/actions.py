"""What a client sends on a step, and the assistant turn the episode loop receives for it.

An action is one of:

- `{"message": "…"}`: a protocol v1 assistant message, parsed by the loop as a model's
  text would be (`agent.protocol`);
- `{"tool": name, "arguments": {…}}`: a native tool call, handed to the loop as an
  OpenAI `tool_calls` entry (`agent.native_calls` maps it to the same parsed call);
- `{"final": "…"}`: the final answer (rendered as protocol v1's `<final>` block).

Any of them may carry the tokens the client's model sampled for this turn
(`prompt_token_ids`, `completion_token_ids`, `logprobs`): they are stored on the step as
sent, never re-tokenized.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.policies.base import PolicyResponse
from agent.render import render_final
from environment.errors import BadMessage

__all__ = ["Action", "parse_action"]


class Action(BaseModel):
    """One assistant turn from the client: exactly one of `message`, `tool`, `final`."""

    model_config = ConfigDict(extra="forbid")

    message: str | None = None
    """A protocol v1 assistant message (text with one `<tool_call>` or `<final>` block)."""
    tool: str | None = None
    """A native tool call's tool name."""
    arguments: dict[str, Any] | None = None
    """The native tool call's arguments (a JSON object)."""
    call_id: str | None = None
    """The native tool call's id (default `call_<step>`)."""
    final: str | None = None
    """The final answer."""
    episode_id: str | None = None
    """The session this step belongs to (optional; a mismatch is refused)."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the prompt the client's model saw for this turn."""
    completion_token_ids: list[int] | None = None
    """Token ids the client's model sampled for this turn."""
    logprobs: list[float] | None = Field(default=None)
    """Log probability of each sampled token, aligned with `completion_token_ids`."""

    @model_validator(mode="after")
    def _one_kind(self) -> Action:
        kinds = [k for k in ("message", "tool", "final") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "an action is exactly one of message, tool (with arguments) or final; "
                f"got {', '.join(kinds) or 'none'}"
            )
        if self.arguments is not None and self.tool is None:
            raise ValueError("arguments belong to a tool call: name the tool")
        return self

    def response(self) -> PolicyResponse:
        """The assistant turn this action is, as the loop records it."""
        tokens: dict[str, Any] = {
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "logprobs": self.logprobs,
        }
        if self.tool is not None:
            call: dict[str, Any] = {
                "type": "function",
                "function": {
                    "name": self.tool,
                    "arguments": json.dumps(self.arguments or {}, ensure_ascii=False),
                },
            }
            if self.call_id:
                call["id"] = self.call_id
            return PolicyResponse(text="", native_tool_calls=[call], **tokens)
        if self.final is not None:
            return PolicyResponse(text=render_final(self.final), **tokens)
        assert self.message is not None
        return PolicyResponse(text=self.message, **tokens)


def parse_action(data: Any) -> Action:
    """The action `data` (a step message's `data`) describes.

    Raises:
        BadMessage: `data` is not an action (`bad_action`, naming what is wrong).
    """
    if not isinstance(data, dict):
        raise BadMessage(f"a step's data must be a JSON object, got {type(data).__name__}")
    try:
        return Action.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'action'}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
        raise BadMessage(f"invalid action: {problems}") from e
