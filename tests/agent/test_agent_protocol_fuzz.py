"""Property tests of the protocol: the parser is total, render → parse is the identity."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import ProtocolError
from agent.protocol import ParsedMessage, parse_message
from agent.render import render_final, render_tool_call, value_text
from agent.trajectory import ParseKind
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
call_ids = st.from_regex(r"[A-Za-z0-9_.:-]{1,16}", fullmatch=True)
# Any text, with protocol fragments mixed in so deep paths are reached.
FRAGMENTS = [
    "<tool_call",
    ' id="c1"',
    ' name="read_file"',
    ' name="execute_shell"',
    ">",
    "</tool_call>",
    '<arg name="path">',
    '<arg name="timeout">',
    '<arg name="command">',
    "</arg>",
    "<![CDATA[",
    "]]>",
    "<final>",
    "</final>",
    "<tool_result>",
    "```xml\n",
    "\n```",
    "30",
    " ",
    "\n",
    "<",
    '"',
]
protocolish = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map(
    "".join
)


def parse_or_error(text: str, tools: dict[str, ToolSpec] | None) -> ParsedMessage | ProtocolError:
    try:
        return parse_message(text, tools)
    except ProtocolError as e:
        assert e.code and str(e) == e.message
        return e


@FUZZ
@given(st.text())
def test_any_text_parses_or_raises_protocol_error(text: str) -> None:
    parse_or_error(text, BUILTIN_TOOLS)
    parse_or_error(text, None)


@FUZZ
@given(protocolish)
def test_protocol_like_text_parses_or_raises_protocol_error(text: str) -> None:
    outcome = parse_or_error(text, BUILTIN_TOOLS)
    if isinstance(outcome, ParsedMessage) and outcome.kind == ParseKind.TOOL_CALL:
        assert outcome.call is not None and outcome.call.tool in BUILTIN_TOOLS
    parse_or_error(text, None)


preambles = st.text().filter(lambda s: "<" not in s)


@FUZZ
@given(call_ids, names, st.dictionaries(names, st.text(), max_size=5), preambles)
def test_render_parse_identity_for_any_name_and_values(
    call_id: str, tool: str, args: dict[str, str], preamble: str
) -> None:
    parsed = parse_message(render_tool_call(call_id, tool, args, preamble=preamble))
    assert parsed.kind == ParseKind.TOOL_CALL
    assert parsed.call is not None
    assert (parsed.call.call_id, parsed.call.tool, parsed.call.args) == (call_id, tool, args)
    assert parsed.preamble == preamble
    assert parsed.tolerances == []


@FUZZ
@given(st.text(), preambles)
def test_render_parse_identity_for_finals(text: str, preamble: str) -> None:
    parsed = parse_message(render_final(text, preamble=preamble))
    assert (parsed.kind, parsed.final, parsed.preamble) == (ParseKind.FINAL, text, preamble)


TYPED = ToolSpec(
    name="typed",
    description="typed args",
    parameters={
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "l": {"type": "array"},
            "o": {"type": "object"},
            "s": {"type": "string"},
        },
        "additionalProperties": False,
    },
    version="1",
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
typed_args = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(),
        "x": st.floats(allow_nan=False, allow_infinity=False),
        "b": st.booleans(),
        "l": st.lists(json_values, max_size=4),
        "o": st.dictionaries(st.text(max_size=5), json_values, max_size=4),
        "s": st.text(),
    },
)


@FUZZ
@given(typed_args)
def test_typed_values_round_trip_through_the_schema(args: dict[str, Any]) -> None:
    parsed = parse_message(render_tool_call("c1", "typed", args), {"typed": TYPED})
    assert parsed.call is not None
    assert parsed.call.args == args
    assert parsed.call.raw_args == {k: value_text(v) for k, v in args.items()}


@FUZZ
@given(
    st.dictionaries(st.sampled_from(["n", "x", "b", "l", "o", "s", "zz"]), st.text(), max_size=7)
)
def test_any_raw_values_for_typed_args_parse_or_raise_protocol_error(raw: dict[str, str]) -> None:
    text = render_tool_call("c1", "typed", raw)
    outcome = parse_or_error(text, {"typed": TYPED})
    if isinstance(outcome, ParsedMessage):
        assert outcome.call is not None and set(outcome.call.args) == set(raw)
