"""Protocol v1 rendering: calls and finals (what a model writes) and observations (what it reads).

`render_tool_call` is the exact inverse of `agent.protocol.parse_message` for any valid
tool name, call id and string arg values (property-tested). Observations are
`<tool_result>` (the call ran, whatever its exit code), `<tool_error>` (the message was
not a valid call, nothing ran) and `<warning>` lines appended to either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.protocol import CALL_ID_PATTERN, TOOL_NAME_PATTERN
from sandbox.types import ToolResult, output_text

__all__ = [
    "cdata",
    "decode_step_text",
    "render_final",
    "render_tool_call",
    "render_tool_error",
    "render_tool_result",
    "render_warning",
    "value_text",
]

_CDATA_OPEN = "<![CDATA["


def cdata(value: str) -> str:
    """`value` as adjacent CDATA sections (a `]]>` inside is split across two sections)."""
    return _CDATA_OPEN + value.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def _needs_cdata(value: str, closing: str) -> bool:
    return closing in value or _CDATA_OPEN in value or (closing == "</arg>" and "<arg" in value)


def value_text(value: Any) -> str:
    """The raw text for one arg value: strings as is, everything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def render_tool_call(
    call_id: str, tool: str, args: Mapping[str, Any], *, preamble: str = ""
) -> str:
    """A protocol v1 tool call block (with optional free text before it).

    Raises:
        ValueError: `tool`, an arg name or `call_id` is outside the protocol's grammar.
    """
    if not TOOL_NAME_PATTERN.fullmatch(tool):
        raise ValueError(f"invalid tool name {tool!r}")
    if not CALL_ID_PATTERN.fullmatch(call_id):
        raise ValueError(f"invalid call id {call_id!r}")
    lines = [f'{preamble}<tool_call id="{call_id}" name="{tool}">']
    for name, value in args.items():
        if not TOOL_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"invalid arg name {name!r}")
        text = value_text(value)
        body = cdata(text) if _needs_cdata(text, "</arg>") else text
        lines.append(f'<arg name="{name}">{body}</arg>')
    lines.append("</tool_call>")
    return "\n".join(lines)


def render_final(text: str, *, preamble: str = "") -> str:
    """A `<final>` block."""
    body = cdata(text) if _needs_cdata(text, "</final>") else text
    return f"{preamble}<final>{body}</final>"


def decode_step_text(data: bytes, max_chars: int) -> tuple[str, bool]:
    """Bytes → NUL-free text of at most `max_chars` characters; True when shortened.

    The text a step and its observation show (`storage.sanitize.decode_row_text` is the
    stored row's, which also flags lossy decoding)."""
    text = output_text(data)
    if len(text) > max_chars:
        return text[:max_chars], True
    return text, False


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


def render_tool_result(call_id: str, tool: str, result: ToolResult, *, max_chars: int) -> str:
    """The `<tool_result>` observation for a call that ran (successfully or not)."""
    attrs = [f'id="{_attr(call_id)}"', f'name="{_attr(tool)}"']
    if result.exit_code is not None:
        attrs.append(f'exit_code="{result.exit_code}"')
    if result.signal is not None:
        attrs.append(f'signal="{result.signal}"')
    if result.timed_out:
        attrs.append('timed_out="true"')
    if result.error_type:
        attrs.append(f'error="{_attr(result.error_type)}"')
    stdout, out_cut = decode_step_text(result.stdout, max_chars)
    stderr, err_cut = decode_step_text(result.stderr, max_chars)
    body = stdout
    if out_cut or result.stdout_truncated:
        body += f"\n[output truncated: showing the first {len(stdout)} characters]"
    if stderr:
        note = (
            f"\n[stderr truncated: showing the first {len(stderr)} characters]"
            if err_cut or result.stderr_truncated
            else ""
        )
        body += f"\n<stderr>{stderr}{note}</stderr>"
    return f"<tool_result {' '.join(attrs)}>{body}</tool_result>"


def render_tool_error(
    message: str, *, code: str, call_id: str | None = None, tool: str | None = None
) -> str:
    """The `<tool_error>` observation for a message that was not a valid call (nothing ran)."""
    attrs = [f'code="{_attr(code)}"']
    if call_id is not None:
        attrs.insert(0, f'id="{_attr(call_id)}"')
    if tool is not None:
        attrs.insert(1 if call_id is not None else 0, f'name="{_attr(tool)}"')
    return f"<tool_error {' '.join(attrs)}>{message}</tool_error>"


def render_warning(kind: str, message: str) -> str:
    """A `<warning>` line appended to an observation (soft timeout, repetition)."""
    return f'<warning kind="{_attr(kind)}">{message}</warning>'
