"""Native OpenAI `tool_calls` (function calling) mapped to the protocol's `ParsedMessage`.

An endpoint that does native tool calling answers with structured `tool_calls` instead of
a text block. The same rules apply as for text (one call per turn, known tool, schema-
valid args), so the loop, the trajectory and QC see one kind of parsed call; the raw JSON
stays on `Step.native_tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.coerce import coerce_native_args
from agent.errors import ProtocolError
from agent.protocol import ParsedMessage, ToolCall, has_protocol_block, lookup_tool
from agent.trajectory import ParseKind
from sandbox.tool_specs import ToolSpec

__all__ = ["parse_native_tool_calls"]

_EXCERPT = 40


def _excerpt(text: str) -> str:
    return repr(text[:_EXCERPT] + ("…" if len(text) > _EXCERPT else ""))


def parse_native_tool_calls(
    content: str | None,
    tool_calls: list[Any],
    tools: Mapping[str, ToolSpec] | None = None,
    *,
    fallback_id: str = "call_0",
) -> ParsedMessage:
    """Map OpenAI `tool_calls` (native function calling) to the same `ParsedMessage`.

    One call per turn, as in the text protocol; `content` is the preamble and must not
    carry a protocol block of its own.

    Raises:
        ProtocolError: several calls, a malformed entry, arguments that are not a JSON
            object, an unknown tool or args that fail the schema.
    """
    preamble = content or ""
    if len(tool_calls) != 1:
        raise ProtocolError(
            f"one tool call per turn: the response has {len(tool_calls)} tool_calls",
            code="two_blocks",
        )
    if has_protocol_block(preamble):
        raise ProtocolError(
            "two blocks in one turn: the response has native tool_calls and a protocol block in its content",
            code="two_blocks",
        )
    entry = tool_calls[0]
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ProtocolError(
            "malformed tool_calls entry: expected {'function': {'name': …, 'arguments': …}}",
            code="bad_tag",
        )
    name: str = function["name"]
    raw_id = entry.get("id")
    call_id = raw_id if isinstance(raw_id, str) and raw_id else fallback_id
    arguments = function.get("arguments", "{}")
    raw_json = (
        arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    )
    try:
        decoded = json.loads(raw_json) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError) as e:
        raise ProtocolError(
            f"tool {name!r}: arguments are not valid JSON ({e})",
            code="bad_value",
            tool=name,
            call_id=call_id,
        ) from e
    if not isinstance(decoded, dict):
        raise ProtocolError(
            f"tool {name!r}: arguments must be a JSON object, got {_excerpt(raw_json)}",
            code="bad_value",
            tool=name,
            call_id=call_id,
        )
    args: dict[str, Any] = decoded
    if tools is not None:
        spec = lookup_tool(tools, name, call_id=call_id)
        args = coerce_native_args(spec, decoded, call_id=call_id)
    raw_args = {k: json.dumps(v, ensure_ascii=False) for k, v in decoded.items()}
    call = ToolCall(call_id=call_id, tool=name, args=args, raw_args=raw_args)
    return ParsedMessage(kind=ParseKind.TOOL_CALL, preamble=preamble, call=call)
