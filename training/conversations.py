"""Trajectories as the chat the model saw, for training (seed 000 §4.5: same prompt, tools, format).

The episode loop builds its history from the policy's system prompt
(`render_system_prompt(tools, style)`), the task prompt, each step's raw assistant text
and its observation as a `user` turn (`agent.recording`);
`agent.export.to_openai_messages(style="text")` reproduces exactly that history. The
`hf:` policy then keeps only `role` and `content` of each message and applies the
tokenizer's chat template, so training does the same: the messages here are
`{"role", "content"}` pairs and the chat template does the rest.

`prompt_style` picks the system prompt the model is trained (and later deployed) with:
`full` for real models, `compact` for the small local ones (`agent.prompt`). An episode
collected under one style trains a model under another with the system message
re-rendered; everything after it is the episode as it happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from agent.errors import ProtocolError
from agent.export import to_openai_messages
from agent.prompt import PromptStyle, render_system_prompt, render_tool_calling_prompt
from agent.protocol import parse_message
from agent.trajectory import ParseKind, Trajectory
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec

__all__ = [
    "Message",
    "episode_messages",
    "plain_text",
    "prompt_messages",
    "system_prompt_for",
    "tool_calling_messages",
    "tools_for",
    "turn_examples",
]

Message = dict[str, str]
"""One chat message: `{"role": "system" | "user" | "assistant" | "tool", "content": str}`."""


def tools_for(traj: Trajectory) -> list[ToolSpec]:
    """The tools the episode offered (by its recorded tool versions); all built-ins when unknown."""
    named = [BUILTIN_TOOLS[name] for name in traj.tool_versions if name in BUILTIN_TOOLS]
    return named if named else list(BUILTIN_TOOLS.values())


def system_prompt_for(
    tools: Iterable[ToolSpec], style: PromptStyle | str = PromptStyle.FULL
) -> str:
    """The loop's system prompt for these tools in `style` (one function, so training and
    deployment agree)."""
    return render_system_prompt(tools, style)


def _plain(messages: Iterable[dict[str, object]]) -> list[Message]:
    return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]


def episode_messages(
    traj: Trajectory, style: PromptStyle | str = PromptStyle.FULL
) -> list[Message]:
    """The whole episode as the model saw it (system prompt in `style`), ending on its last
    assistant turn.

    A trailing observation (an episode cut by max steps) is dropped: nothing was trained
    on it and it would be the last, loss-free turn anyway.
    """
    system = system_prompt_for(tools_for(traj), style)
    messages = _plain(to_openai_messages(traj, style="text", system_prompt=system))
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages


def turn_examples(messages: list[Message]) -> list[list[Message]]:
    """One chat per assistant turn: the history before it and the turn, nothing after.

    Trained with an assistant-only loss, the last chat of an episode is the episode
    itself; the shorter ones train the early turns again on their own history.
    """
    return [messages[: i + 1] for i, m in enumerate(messages) if m["role"] == "assistant"]


def prompt_messages(traj: Trajectory, style: PromptStyle | str = PromptStyle.FULL) -> list[Message]:
    """System prompt (in `style`) and task: what the model sees before its first turn."""
    return [
        {"role": "system", "content": system_prompt_for(tools_for(traj), style)},
        {"role": "user", "content": traj.prompt},
    ]


def plain_text(traj: Trajectory) -> str:
    """The episode as plain text for continued pretraining: task, every turn, every observation.

    Failures, tool errors and observations stay in (seed 003 §1: the model should read what
    agentic work looks like, mistakes included); the system prompt is left out because it
    is identical in every document. Steps copied from an earlier trajectory for context
    (`Step.is_copied_context`) are left out: that trajectory's text holds them.
    """
    parts = [f"Task: {traj.prompt}"]
    for step in traj.steps:
        if step.is_copied_context:
            continue
        parts.append(step.raw_output)
        if step.observation is not None:
            parts.append(step.observation)
    parts.append(f"Outcome: {traj.status.value} ({traj.failure_category.value})")
    return "\n\n".join(parts)


def tool_calling_messages(messages: Sequence[Message], tools_json: str) -> list[dict[str, Any]]:
    """A text-protocol chat as a native tool-calling chat (what TRL's tool-calling SFT path
    and OpenAI-style templates read).

    Each assistant tool call becomes `tool_calls` (one call: its id, the tool name and the
    arguments as a JSON object, coerced to the tool's schema) with its preamble as
    `content`; the observation after it becomes a `tool` message with that
    `tool_call_id` (its text as the model read it); a `<final>` turn stays text. The system
    prompt is replaced by `render_tool_calling_prompt()`: the protocol's call syntax does
    not apply when calls are native. `tools_json` (the row's `tools` column) names the
    tools whose schemas coerce the arguments.

    Raises:
        ValueError: an assistant turn is not a valid protocol message (SFT rows never hold
            one: the builders cut them).
    """
    names = {t["function"]["name"] for t in json.loads(tools_json)}
    specs = {name: spec for name, spec in BUILTIN_TOOLS.items() if name in names}
    out: list[dict[str, Any]] = []
    pending_call: str | None = None
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            out.append({"role": "system", "content": render_tool_calling_prompt()})
        elif role == "assistant":
            try:
                parsed = parse_message(content, specs)
            except ProtocolError as e:
                raise ValueError(f"assistant turn is not a valid protocol message: {e}") from e
            if parsed.kind == ParseKind.TOOL_CALL and parsed.call is not None:
                call = parsed.call
                out.append(
                    {
                        "role": "assistant",
                        "content": parsed.preamble,
                        "tool_calls": [
                            {
                                "id": call.call_id,
                                "type": "function",
                                "function": {
                                    "name": call.tool,
                                    "arguments": dict(call.args),
                                },
                            }
                        ],
                    }
                )
                pending_call = call.call_id
            else:
                out.append({"role": "assistant", "content": content})
                pending_call = None
        elif role == "user" and pending_call is not None:
            out.append({"role": "tool", "tool_call_id": pending_call, "content": content})
            pending_call = None
        else:
            out.append({"role": role, "content": content})
    return out
