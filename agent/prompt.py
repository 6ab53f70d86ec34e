"""The system prompt: protocol v1 rules and the tool schemas, rendered for the model.

Training and deployment must show the model the same text (seed 000 §4.5), so the
prompt is a pure function of the tools, the protocol version and the prompt style, and
its sha256 is recorded through the history hash of the first step.

Two styles:

- `full` (default, for real models): the protocol rules, each tool with its arguments
  described and its JSON schema (~700 tokens with the local tokenizer).
- `compact` (for small local models trained from scratch): the block grammar and one
  line of tool signatures (~60 tokens with Qwen2's split, ~110 with the `words` split). A model that learns the protocol from data does
  not need the rules spelled out, and on a model built from scratch the full prompt was
  65 % of every training example's compute. A checkpoint's training config
  records the style it was trained with; the `hf:` policy shows that style.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import StrEnum

from agent.coerce import describe_type
from agent.trajectory import PROTOCOL_VERSION
from sandbox.tool_specs import ToolSpec

__all__ = [
    "PromptStyle",
    "render_compact_prompt",
    "render_system_prompt",
    "render_tool_calling_prompt",
    "tool_signature",
]


class PromptStyle(StrEnum):
    """How much of the protocol the system prompt spells out."""

    FULL = "full"
    COMPACT = "compact"


_RULES = """You are an agent working inside a sandbox. You act only through tools.

Protocol v{version}. Each of your messages contains exactly ONE of these blocks, at its end:

1. A tool call:
<tool_call id="c1" name="TOOL_NAME">
<arg name="ARG_NAME">raw value</arg>
</tool_call>

2. Your final answer, when the task is done:
<final>what you did and the answer, if the task asks for one</final>

Rules:
- You may write a short explanation BEFORE the block; nothing may follow it.
- Give every call a new id (c1, c2, …). One call per message; then wait for its result.
- Arg values are raw text: no quotes, no escaping, whitespace is kept exactly.
  If a value contains </arg>, write it as <arg name="x"><![CDATA[value]]></arg>.
- Integers, numbers and booleans are written plainly (30, 1.5, true); arrays and objects as JSON.
- Never write <tool_result> or <tool_error> yourself: results come back to you as
  <tool_result id="…" name="…" exit_code="…">output</tool_result>, and an invalid call comes
  back as <tool_error>reason</tool_error> so you can fix it and retry.
- A <warning> in a result means you should change course (stop repeating, or finish soon).

Tools:
"""

_TOOL_CALLING = """You are an agent working inside a sandbox. You act only through the tools you \
are given: call one tool per message, then wait for its result. Results come back as
<tool_result id="…" name="…" exit_code="…">output</tool_result>; a <warning> in a result
means you should change course. When the task is done, answer with
<final>what you did and the answer, if the task asks for one</final> and no tool call.
"""

_COMPACT = """Protocol v{version}. One block per message:
<tool_call id="c1" name="TOOL">
<arg name="ARG">raw value</arg>
</tool_call>
or <final>answer</final> when done.
Tools: {signatures}
"""


def _tool_lines(spec: ToolSpec) -> list[str]:
    lines = [f"## {spec.name}", spec.description]
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    for name, schema in props.items():
        need = "required" if name in required else "optional"
        desc = schema.get("description", "")
        lines.append(f"- {name} ({describe_type(schema)}, {need}): {desc}".rstrip(": "))
    lines.append("JSON schema: " + json.dumps(spec.parameters, sort_keys=True, ensure_ascii=False))
    return lines


def tool_signature(spec: ToolSpec) -> str:
    """`name(arg, optional_arg?)`: the tool's arguments in schema order, optional ones marked."""
    required = set(spec.parameters.get("required", []))
    args = [
        name if name in required else f"{name}?" for name in spec.parameters.get("properties", {})
    ]
    return f"{spec.name}({', '.join(args)})"


def render_compact_prompt(tools: Iterable[ToolSpec]) -> str:
    """The block grammar and one line of tool signatures (the `compact` style)."""
    signatures = " ".join(tool_signature(t) for t in tools)
    return _COMPACT.format(version=PROTOCOL_VERSION, signatures=signatures)


def render_system_prompt(
    tools: Iterable[ToolSpec], style: PromptStyle | str = PromptStyle.FULL
) -> str:
    """The system prompt in `style`: protocol rules and one section per tool (`full`), or
    the block grammar and tool signatures (`compact`)."""
    if PromptStyle(style) == PromptStyle.COMPACT:
        return render_compact_prompt(tools)
    sections = ["\n".join(_tool_lines(t)) for t in tools]
    return _RULES.format(version=PROTOCOL_VERSION) + "\n\n".join(sections) + "\n"


def render_tool_calling_prompt() -> str:
    """The system prompt of a chat whose calls are native `tool_calls` (the tools travel in
    the request's or the dataset's `tools`, so the prompt carries no call syntax)."""
    return _TOOL_CALLING
