"""Protocol v1: what parses, what each violation says, the tolerance, native calls, rendering."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import ProtocolError
from agent.native_calls import parse_native_tool_calls
from agent.protocol import parse_message
from agent.render import render_final, render_tool_call, render_tool_error, render_tool_result
from agent.trajectory import ParseKind
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec
from sandbox.types import ToolResult

TYPED = ToolSpec(
    name="typed",
    description="every type",
    parameters={
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "items": {"type": "array", "items": {"type": "integer"}},
            "opts": {"type": "object"},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "s": {"type": "string"},
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    version="1",
)
TOOLS = {**BUILTIN_TOOLS, "typed": TYPED}


def error_of(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_message(text, TOOLS)
    return info.value


def test_tool_call_with_preamble_parses_and_coerces() -> None:
    text = (
        "I will list the data directory first.\n"
        '<tool_call id="c1" name="execute_shell">\n'
        '<arg name="command">ls -la /workspace/data</arg>\n'
        '<arg name="timeout">30</arg>\n'
        "</tool_call>\n"
    )
    parsed = parse_message(text, TOOLS)
    assert parsed.kind == ParseKind.TOOL_CALL
    assert parsed.preamble == "I will list the data directory first.\n"
    assert parsed.call is not None
    assert parsed.call.call_id == "c1"
    assert parsed.call.tool == "execute_shell"
    assert parsed.call.args == {"command": "ls -la /workspace/data", "timeout": 30}
    assert parsed.call.raw_args["timeout"] == "30"
    assert parsed.tolerances == []


def test_values_are_byte_exact() -> None:
    value = "  a &amp; b &lt;tag&gt; \"q\" 'q'\n\ttab\r\n  "
    text = f'<tool_call id="c1" name="write_file"><arg name="path">p</arg><arg name="content">{value}</arg></tool_call>'
    parsed = parse_message(text, TOOLS)
    assert parsed.call is not None
    assert parsed.call.args["content"] == value


def test_cdata_value_may_contain_closing_tags() -> None:
    value = "x</arg></tool_call><final>no</final>]]>y"
    text = render_tool_call("c9", "write_file", {"path": "a.txt", "content": value})
    assert "<![CDATA[" in text
    parsed = parse_message(text, TOOLS)
    assert parsed.call is not None
    assert parsed.call.args["content"] == value


def test_typed_values_coerce() -> None:
    text = (
        '<tool_call id="t" name="typed">'
        '<arg name="n"> -7 </arg><arg name="x">1.5e3</arg><arg name="flag">true</arg>'
        '<arg name="items">[1, 2, 3]</arg><arg name="opts">{"a": [1]}</arg><arg name="mode">slow</arg>'
        "</tool_call>"
    )
    parsed = parse_message(text, TOOLS)
    assert parsed.call is not None
    assert parsed.call.args == {
        "n": -7,
        "x": 1500.0,
        "flag": True,
        "items": [1, 2, 3],
        "opts": {"a": [1]},
        "mode": "slow",
    }


def test_final_and_none() -> None:
    parsed = parse_message("All done.\n<final>42 rows</final>\n", TOOLS)
    assert (parsed.kind, parsed.final, parsed.preamble) == (
        ParseKind.FINAL,
        "42 rows",
        "All done.\n",
    )
    none = parse_message("I am thinking about it, a < b and c > d.", TOOLS)
    assert none.kind == ParseKind.NONE
    assert none.preamble == "I am thinking about it, a < b and c > d."


@pytest.mark.parametrize(
    ("text", "code", "fragments"),
    [
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg><b>x</b></tool_call>',
            "unknown_tag",
            ["<b>", "read_file"],
        ),
        (
            '<tool_call id="c1" name="read_file">\nthe path:\n<arg name="path">a</arg></tool_call>',
            "text_in_block",
            ["text between args", "read_file"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg></tool_call>\n<tool_call id="c2" name="list_dir"><arg name="path">.</arg></tool_call>',
            "two_blocks",
            ["two blocks"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg></tool_call><final>x</final>',
            "two_blocks",
            ["two blocks"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg>',
            "unclosed_tag",
            ["</tool_call>"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</tool_call>',
            "unclosed_tag",
            ["</arg>", "path"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg></final>',
            "mismatched_tag",
            ["</final>"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg><arg name="path">b</arg></tool_call>',
            "duplicate_arg",
            ["'path'", "twice", "read_file"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg><arg name="mode">r</arg></tool_call>',
            "unknown_arg",
            ["'mode'", "read_file", "path"],
        ),
        (
            '<tool_call id="c1" name="write_file"><arg name="path">a</arg></tool_call>',
            "missing_arg",
            ["'content'", "write_file", "string"],
        ),
        (
            '<tool_call id="c1" name="execute_shell"><arg name="command">ls</arg><arg name="timeout">ten</arg></tool_call>',
            "bad_value",
            ["execute_shell", "'timeout'", "integer", "'ten'"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1.5</arg></tool_call>',
            "bad_value",
            ["'n'", "integer"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="flag">yes</arg></tool_call>',
            "bad_value",
            ["true or false"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="items">[1,</arg></tool_call>',
            "bad_value",
            ["JSON array"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="items">["a"]</arg></tool_call>',
            "bad_value",
            ["item 0", "integer"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="opts">[1]</arg></tool_call>',
            "bad_value",
            ["JSON object"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="mode">warp</arg></tool_call>',
            "bad_value",
            ["one of", "fast"],
        ),
        (
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="x">nan</arg></tool_call>',
            "bad_value",
            ["number"],
        ),
        (
            '<tool_call id="c1" name="run_command"><arg name="cmd">ls</arg></tool_call>',
            "unknown_tool",
            ["run_command", "execute_shell"],
        ),
        (
            '<tool_call name="read_file"><arg name="path">a</arg></tool_call>',
            "bad_attribute",
            ["id="],
        ),
        ('<tool_call id="c1"><arg name="path">a</arg></tool_call>', "bad_attribute", ["name="]),
        ("<tool_call id='c1' name='read_file'></tool_call>", "bad_tag", ["double quotes"]),
        ('<tool_call id="c1" name="read_file" extra="1"></tool_call>', "bad_attribute", ["extra"]),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg></tool_call>\nDone!',
            "text_after_block",
            ["Done!"],
        ),
        (
            '<tool_call id="c1" name="read_file"><arg name="path">a</arg></tool_call>\n<tool_result id="c1">hi</tool_result>',
            "fabricated_observation",
            ["<tool_result>"],
        ),
        (
            'I ran it: <tool_result id="c0" name="x">ok</tool_result>',
            "fabricated_observation",
            ["environment"],
        ),
        ("text </tool_call>", "stray_tag", ["</tool_call>"]),
        ('<arg name="path">a</arg>', "stray_tag", ["<arg>"]),
        ("<final>never closed", "unclosed_tag", ["</final>"]),
        ('<final kind="x">a</final>', "bad_attribute", ["<final>"]),
        (
            '<tool_call id="c1" name="read_file"><arg name="path"><![CDATA[a]]>tail</arg></tool_call>',
            "text_after_cdata",
            ["CDATA"],
        ),
        (
            '<tool_call id="c1" name="write_file"><arg name="path">a\n<arg name="content">b</arg></tool_call>',
            "markup_in_value",
            ["path", "<arg"],
        ),
    ],
)
def test_violations_raise_precise_errors(text: str, code: str, fragments: list[str]) -> None:
    error = error_of(text)
    assert error.code == code, error.message
    for fragment in fragments:
        assert fragment in error.message, (fragment, error.message)


def test_huge_numbers_are_errors_not_crashes() -> None:
    digits = "9" * 5000
    assert (
        error_of(f'<tool_call id="t" name="typed"><arg name="n">{digits}</arg></tool_call>').code
        == "bad_value"
    )
    text = f'<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="x">{digits}</arg></tool_call>'
    assert error_of(text).code == "bad_value"
    assert (
        error_of(
            f'<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="items">[{digits}]</arg></tool_call>'
        ).code
        == "bad_value"
    )
    assert (
        error_of(
            '<tool_call id="t" name="typed"><arg name="n">1</arg><arg name="opts">'
            + "[" * 100_000
            + "</arg></tool_call>"
        ).code
        == "bad_value"
    )


def test_error_carries_tool_arg_and_call_id() -> None:
    error = error_of(
        '<tool_call id="c7" name="execute_shell"><arg name="command">ls</arg><arg name="timeout">x</arg></tool_call>'
    )
    assert (error.tool, error.arg, error.call_id) == ("execute_shell", "timeout", "c7")


def test_markdown_fence_around_the_block_is_stripped_and_recorded() -> None:
    text = 'Listing.\n```xml\n<tool_call id="c1" name="list_dir">\n<arg name="path">.</arg>\n</tool_call>\n```\n'
    parsed = parse_message(text, TOOLS)
    assert parsed.kind == ParseKind.TOOL_CALL
    assert parsed.tolerances == ["stripped_markdown_fence"]
    assert parsed.preamble == "Listing."
    # A fence that does not wrap the block is not tolerated.
    with pytest.raises(ProtocolError) as info:
        parse_message(
            '<tool_call id="c1" name="list_dir"><arg name="path">.</arg></tool_call>\n```', TOOLS
        )
    assert info.value.code == "text_after_block"


def test_without_tools_args_stay_raw_strings() -> None:
    parsed = parse_message('<tool_call id="a" name="anything"><arg name="n">7</arg></tool_call>')
    assert parsed.call is not None
    assert parsed.call.args == {"n": "7"}


def test_native_tool_calls_map_to_the_same_call() -> None:
    native = [
        {
            "id": "call_x",
            "type": "function",
            "function": {"name": "execute_shell", "arguments": '{"command": "ls", "timeout": 5}'},
        }
    ]
    parsed = parse_native_tool_calls("Let me look.", native, TOOLS)
    text = parse_message(
        'Let me look.<tool_call id="call_x" name="execute_shell"><arg name="command">ls</arg><arg name="timeout">5</arg></tool_call>',
        TOOLS,
    )
    assert parsed.call is not None and text.call is not None
    assert (parsed.call.call_id, parsed.call.tool, parsed.call.args) == (
        text.call.call_id,
        text.call.tool,
        text.call.args,
    )
    assert parsed.preamble == text.preamble


@pytest.mark.parametrize(
    ("content", "calls", "code"),
    [
        (None, [], "two_blocks"),
        (
            None,
            [{"id": "a", "function": {"name": "list_dir", "arguments": "{}"}}] * 2,
            "two_blocks",
        ),
        (
            "<final>x</final>",
            [{"id": "a", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}],
            "two_blocks",
        ),
        (
            None,
            [{"id": "a", "function": {"name": "list_dir", "arguments": "{not json"}}],
            "bad_value",
        ),
        (None, [{"id": "a", "function": {"name": "list_dir", "arguments": "[1]"}}], "bad_value"),
        (
            None,
            [
                {
                    "id": "a",
                    "function": {
                        "name": "execute_shell",
                        "arguments": '{"command": "ls", "timeout": "5"}',
                    },
                }
            ],
            "bad_value",
        ),
        (None, [{"id": "a", "function": {"name": "nope", "arguments": "{}"}}], "unknown_tool"),
        (None, [{"id": "a"}], "bad_tag"),
    ],
)
def test_native_tool_call_errors(
    content: str | None, calls: list[dict[str, Any]], code: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_native_tool_calls(content, calls, TOOLS)
    assert info.value.code == code


def test_native_call_without_id_gets_the_fallback() -> None:
    parsed = parse_native_tool_calls(
        None,
        [{"function": {"name": "list_dir", "arguments": {"path": "."}}}],
        TOOLS,
        fallback_id="call_3",
    )
    assert parsed.call is not None
    assert parsed.call.call_id == "call_3"


def test_render_observations() -> None:
    result = ToolResult(
        tool="execute_shell",
        ok=False,
        exit_code=2,
        stdout=b"out\x00put",
        stderr=b"boom",
        error_type="nonzero_exit",
    )
    text = render_tool_result("c1", "execute_shell", result, max_chars=100)
    assert text.startswith(
        '<tool_result id="c1" name="execute_shell" exit_code="2" error="nonzero_exit">'
    )
    assert "output" in text and "\x00" not in text
    assert "<stderr>boom</stderr>" in text
    long = ToolResult(tool="read_file", ok=True, stdout=b"x" * 1000)
    cut = render_tool_result("c2", "read_file", long, max_chars=300)
    assert "x" * 300 in cut and "x" * 301 not in cut and "truncated" in cut
    error = render_tool_error("bad", code="unknown_tool", call_id="c3", tool="nope")
    assert error == '<tool_error id="c3" name="nope" code="unknown_tool">bad</tool_error>'


def test_render_rejects_names_outside_the_grammar() -> None:
    with pytest.raises(ValueError, match="tool name"):
        render_tool_call("c1", "bad name", {})
    with pytest.raises(ValueError, match="call id"):
        render_tool_call('c"1', "ok", {})
    assert parse_message(render_final("a</final>b"), TOOLS).final == "a</final>b"
