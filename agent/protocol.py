"""Protocol v1 parser: one assistant message → a tool call, a final answer, nothing, or an error.

The grammar and every error code are specified in `docs/protocol.md`. In short:

    [free text] <tool_call id="ID" name="TOOL">
    <arg name="A">raw text</arg>            (or <![CDATA[...]]> when the value contains </arg>)
    </tool_call>

or `[free text] <final>text</final>`. The parser is a hand-written scanner, not a regex
over the whole message, so arg values may contain any markup (`</tool_call>`, `<final>`,
quotes, newlines) and are returned byte-exact. Everything outside the grammar is a
`ProtocolError` with a message for the model; the parser never raises anything else.
The one tolerance (a markdown fence around the whole block) is reported in
`ParsedMessage.tolerances` so the step records it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.coerce import coerce_args
from agent.errors import ProtocolError
from agent.trajectory import ParseKind
from sandbox.tool_specs import ToolSpec

__all__ = [
    "CALL_ID_PATTERN",
    "TOOL_NAME_PATTERN",
    "ParsedMessage",
    "ToolCall",
    "has_protocol_block",
    "parse_message",
]

TOOL_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""Valid tool and arg names."""
CALL_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""Valid call ids."""

TOLERANCE_FENCE = "stripped_markdown_fence"

_CDATA_OPEN = "<![CDATA["
_CDATA_CLOSE = "]]>"
# A tag the scanner cares about outside a block: protocol tags, opening or closing.
_PROTOCOL_TAG = re.compile(r"<(/?)(tool_call|final|arg|tool_result|tool_error)(?=[\s>/]|\Z)")
_ANY_TAG = re.compile(r"</?([A-Za-z_][A-Za-z0-9_:.-]*)")
_ATTR = re.compile(r"\s+([A-Za-z_][A-Za-z0-9_-]*)=\"([^\"<>]*)\"")
_ARG_MARKUP = re.compile(r"<arg(?=[\s>/])")
_FENCE_OPEN = re.compile(r"(?:^|\n)[ \t]*```[A-Za-z0-9_+.-]*[ \t]*\n[ \t\n]*\Z")
_FENCE_CLOSE = re.compile(r"\A[ \t]*\n?[ \t]*```[ \t]*\s*\Z")
_EXCERPT = 40


class ToolCall(BaseModel):
    """A parsed, schema-validated tool call."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    """The call's id as written by the model (or the endpoint, for native calls)."""
    tool: str
    """Tool name."""
    args: dict[str, Any]
    """Arguments after coercion to the schema's types (raw strings when no schema was given)."""
    raw_args: dict[str, str] = Field(default_factory=dict)
    """Each arg's raw text exactly as written (JSON text for native calls)."""


class ParsedMessage(BaseModel):
    """What the parser found in one assistant message (errors are raised, not returned)."""

    model_config = ConfigDict(frozen=True)

    kind: ParseKind
    """`tool_call`, `final` or `none` (never `error`: errors raise `ProtocolError`)."""
    preamble: str = ""
    """Free text before the block, byte-exact (the whole message when kind is `none`)."""
    call: ToolCall | None = None
    """The call when kind is `tool_call`."""
    final: str | None = None
    """The `<final>` text when kind is `final`."""
    tolerances: list[str] = Field(default_factory=list)
    """Lenient rules applied, e.g. `stripped_markdown_fence`."""


def lookup_tool(tools: Mapping[str, ToolSpec], name: str, *, call_id: str | None) -> ToolSpec:
    """The spec of tool `name`.

    Raises:
        ProtocolError: `unknown_tool`, listing the tools that exist.
    """
    spec = tools.get(name)
    if spec is None:
        known = ", ".join(sorted(tools)) or "(none)"
        raise ProtocolError(
            f"unknown tool {name!r}; available tools: {known}",
            code="unknown_tool",
            tool=name,
            call_id=call_id,
        )
    return spec


def has_protocol_block(text: str) -> bool:
    """True when `text` contains any protocol tag (a block, an arg or an observation)."""
    return _PROTOCOL_TAG.search(text) is not None


def _excerpt(text: str) -> str:
    return repr(text[:_EXCERPT] + ("…" if len(text) > _EXCERPT else ""))


class _Scanner:
    """Single pass over one message; `pos` only moves forward."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def startswith(self, token: str) -> bool:
        return self.text.startswith(token, self.pos)

    def skip_whitespace(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def error(self, message: str, code: str, **where: Any) -> ProtocolError:
        return ProtocolError(message, code=code, offset=self.pos, **where)

    def read_attributes(self, tag: str) -> dict[str, str]:
        """Attributes of the tag whose name ends at `pos`, consuming the closing `>`."""
        attrs: dict[str, str] = {}
        while True:
            match = _ATTR.match(self.text, self.pos)
            if match is None:
                break
            name, value = match.group(1), match.group(2)
            if name in attrs:
                raise self.error(f"<{tag}> has attribute {name!r} twice", "bad_attribute")
            attrs[name] = value
            self.pos = match.end()
        self.skip_whitespace()
        if self.startswith("/>"):
            raise self.error(f"<{tag}/> must not be self-closing", "bad_tag")
        if not self.startswith(">"):
            rest = self.text[self.pos : self.pos + _EXCERPT]
            raise self.error(
                f'malformed <{tag}> tag near {_excerpt(rest)}: attributes are name="value" '
                'in double quotes, then ">"',
                "bad_tag",
            )
        self.pos += 1
        return attrs

    def read_cdata_value(self, element: str, closing: str, **where: Any) -> str:
        """One or more adjacent CDATA sections, then `closing` immediately."""
        parts: list[str] = []
        while self.startswith(_CDATA_OPEN):
            start = self.pos + len(_CDATA_OPEN)
            end = self.text.find(_CDATA_CLOSE, start)
            if end < 0:
                raise self.error(
                    f"unclosed <![CDATA[ in {element}: no ]]> found", "unclosed_tag", **where
                )
            parts.append(self.text[start:end])
            self.pos = end + len(_CDATA_CLOSE)
        if not self.startswith(closing):
            rest = self.text[self.pos : self.pos + _EXCERPT]
            raise self.error(
                f"{element}: expected {closing} right after the CDATA section, found {_excerpt(rest)}",
                "text_after_cdata",
                **where,
            )
        self.pos += len(closing)
        return "".join(parts)

    def read_raw_value(self, element: str, closing: str, **where: Any) -> str:
        end = self.text.find(closing, self.pos)
        if end < 0:
            raise self.error(
                f"unclosed {element}: no {closing} before the end of the message",
                "unclosed_tag",
                **where,
            )
        value = self.text[self.pos : end]
        if _CDATA_OPEN in value or (closing == "</arg>" and _ARG_MARKUP.search(value)):
            raise self.error(
                f"{element}: the value contains {'<![CDATA[' if _CDATA_OPEN in value else '<arg'} "
                f"(a missing {closing}?). Close each element, or wrap a literal value in "
                "<![CDATA[...]]> starting right after the opening tag",
                "markup_in_value",
                **where,
            )
        self.pos = end + len(closing)
        return value

    def read_value(self, element: str, closing: str, **where: Any) -> str:
        if self.startswith(_CDATA_OPEN):
            return self.read_cdata_value(element, closing, **where)
        return self.read_raw_value(element, closing, **where)


def _parse_tool_call_block(sc: _Scanner) -> tuple[str, str, dict[str, str]]:
    """Parse `<tool_call …>…</tool_call>` starting after the tag name; returns id, name, raw args."""
    attrs = sc.read_attributes("tool_call")
    unknown = sorted(set(attrs) - {"id", "name"})
    if unknown:
        raise sc.error(
            f"<tool_call> has unknown attribute {unknown[0]!r}; only id and name are allowed",
            "bad_attribute",
        )
    if "name" not in attrs:
        raise sc.error('<tool_call> is missing its name="…" attribute', "bad_attribute")
    name = attrs["name"]
    if not TOOL_NAME_PATTERN.fullmatch(name):
        raise sc.error(f"<tool_call> name {name!r} is not a valid tool name", "bad_attribute")
    if "id" not in attrs:
        raise sc.error(
            f'<tool_call name="{name}"> is missing its id="…" attribute', "bad_attribute", tool=name
        )
    call_id = attrs["id"]
    if not CALL_ID_PATTERN.fullmatch(call_id):
        raise sc.error(
            f"<tool_call> id {call_id!r} is not valid: use 1-64 of A-Z a-z 0-9 _ . : -",
            "bad_attribute",
            tool=name,
        )
    where: dict[str, Any] = {"tool": name, "call_id": call_id}
    block = f'<tool_call id="{call_id}" name="{name}">'
    raw_args: dict[str, str] = {}
    while True:
        sc.skip_whitespace()
        if sc.pos >= len(sc.text):
            raise sc.error(
                f"unclosed {block}: no </tool_call> before the end of the message",
                "unclosed_tag",
                **where,
            )
        if sc.startswith("</tool_call>"):
            sc.pos += len("</tool_call>")
            return call_id, name, raw_args
        if _ARG_MARKUP.match(sc.text, sc.pos):
            sc.pos += len("<arg")
            arg_attrs = sc.read_attributes("arg")
            if set(arg_attrs) != {"name"}:
                raise sc.error(
                    f'<arg> in {block} must have exactly one attribute, name="…"',
                    "bad_attribute",
                    **where,
                )
            arg = arg_attrs["name"]
            if not TOOL_NAME_PATTERN.fullmatch(arg):
                raise sc.error(
                    f"{block}: {arg!r} is not a valid arg name", "bad_attribute", **where
                )
            if arg in raw_args:
                raise sc.error(
                    f"tool {name!r}: arg {arg!r} is given twice", "duplicate_arg", arg=arg, **where
                )
            raw_args[arg] = sc.read_value(
                f'<arg name="{arg}"> of tool {name!r}', "</arg>", arg=arg, **where
            )
            continue
        tag = _ANY_TAG.match(sc.text, sc.pos)
        if tag is not None:
            found = sc.text[sc.pos : tag.end()] + ">"
            if tag.group(1) == "tool_call" and not found.startswith("</"):
                raise sc.error(
                    f"two blocks in one turn: a <tool_call> opened inside {block}",
                    "two_blocks",
                    **where,
                )
            if tag.group(1) in ("final", "arg", "tool_call"):
                raise sc.error(
                    f'mismatched tag {found} inside {block}: expected <arg name="…"> or </tool_call>',
                    "mismatched_tag",
                    **where,
                )
            raise sc.error(
                f'unknown tag {found} inside {block}: only <arg name="…">…</arg> elements are allowed',
                "unknown_tag",
                **where,
            )
        stray = sc.text[sc.pos : sc.pos + _EXCERPT]
        raise sc.error(
            f"text between args inside {block}: {_excerpt(stray)}; only whitespace may separate <arg> elements "
            "(put explanations before the block)",
            "text_in_block",
            **where,
        )


def _check_trailing(sc: _Scanner, preamble: str) -> tuple[str, list[str]]:
    """Reject text after the block, except the closing half of a markdown fence."""
    trailing = sc.text[sc.pos :]
    if not trailing.strip():
        return preamble, []
    fence_open = _FENCE_OPEN.search(preamble)
    if fence_open is not None and _FENCE_CLOSE.match(trailing):
        return preamble[: fence_open.start()], [TOLERANCE_FENCE]
    more = _PROTOCOL_TAG.search(trailing)
    if more is not None and more.group(1) == "" and more.group(2) in ("tool_call", "final"):
        raise sc.error(
            "two blocks in one turn: send one <tool_call> or <final> per message", "two_blocks"
        )
    if more is not None and more.group(2) in ("tool_result", "tool_error"):
        raise sc.error(
            f"the message writes <{more.group(2)}> itself: observations come only from the environment; "
            "end the message after </tool_call> and wait for the result",
            "fabricated_observation",
        )
    raise sc.error(
        f"text after the block: {_excerpt(trailing.strip())}; the <tool_call> or <final> block must end the message",
        "text_after_block",
    )


def parse_message(text: str, tools: Mapping[str, ToolSpec] | None = None) -> ParsedMessage:
    """Parse one assistant message (protocol v1).

    With `tools`, the call's tool must be one of them and its args are coerced to the
    schema's types; without, args stay raw strings (round trips, tooling).

    Raises:
        ProtocolError: the message violates the protocol; `str(error)` is the message for the model.
    """
    sc = _Scanner(text)
    match = _PROTOCOL_TAG.search(text)
    if match is None:
        return ParsedMessage(kind=ParseKind.NONE, preamble=text)
    sc.pos = match.start()
    closing, tag = match.group(1), match.group(2)
    if tag in ("tool_result", "tool_error"):
        raise sc.error(
            f"the message writes <{closing}{tag}> itself: observations come only from the environment",
            "fabricated_observation",
        )
    if closing or tag == "arg":
        raise sc.error(
            f'stray <{closing}{tag}> outside a block: open <tool_call id="…" name="…"> first',
            "stray_tag",
        )
    preamble = text[: match.start()]
    sc.pos = match.end()
    if tag == "final":
        attrs = sc.read_attributes("final")
        if attrs:
            raise sc.error("<final> takes no attributes", "bad_attribute")
        final = sc.read_value("<final>", "</final>")
        preamble, tolerances = _check_trailing(sc, preamble)
        return ParsedMessage(
            kind=ParseKind.FINAL, preamble=preamble, final=final, tolerances=tolerances
        )

    call_id, name, raw_args = _parse_tool_call_block(sc)
    preamble, tolerances = _check_trailing(sc, preamble)
    args: dict[str, Any] = dict(raw_args)
    if tools is not None:
        spec = lookup_tool(tools, name, call_id=call_id)
        args = coerce_args(spec, raw_args, call_id=call_id)
    call = ToolCall(call_id=call_id, tool=name, args=args, raw_args=raw_args)
    return ParsedMessage(
        kind=ParseKind.TOOL_CALL, preamble=preamble, call=call, tolerances=tolerances
    )
