"""`epiflow protocol parse --json`: every outcome is printed and exits 0."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.protocol import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("message", "kind", "tool", "error_fragment"),
    [
        (
            'Reading.\n<tool_call id="c1" name="read_file"><arg name="path">a.txt</arg></tool_call>',
            "tool_call",
            "read_file",
            None,
        ),
        ("<final>done</final>", "final", None, None),
        ("just words", "none", None, None),
        (
            '<tool_call id="c1" name="execute_shell"><arg name="command">ls</arg><arg name="timeout">soon</arg></tool_call>',
            "error",
            "execute_shell",
            "'timeout'",
        ),
        ("<tool_call", "error", None, "malformed"),
        ("\udcff bad bytes", "none", None, None),
    ],
)
def test_parse_json_outcomes(
    message: str, kind: str, tool: str | None, error_fragment: str | None
) -> None:
    result = runner.invoke(
        app, ["parse", "--json"], input=message.encode("utf-8", "surrogateescape")
    )
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert set(outcome) >= {"kind", "call_id", "tool", "args", "error"}
    assert outcome["kind"] == kind and outcome["tool"] == tool
    if error_fragment is None:
        assert outcome["error"] is None
    else:
        assert error_fragment in outcome["error"]
    if kind == "tool_call":
        assert outcome["call_id"] == "c1" and outcome["args"] == {"path": "a.txt"}


def test_typed_args_are_coerced_in_the_json() -> None:
    message = '<tool_call id="x" name="execute_shell"><arg name="command">ls</arg><arg name="timeout">7</arg></tool_call>'
    outcome = json.loads(runner.invoke(app, ["parse", "--json"], input=message).stdout)
    assert outcome["args"] == {"command": "ls", "timeout": 7}


def test_plain_output() -> None:
    result = runner.invoke(app, ["parse"], input="<final>ok</final>")
    assert result.exit_code == 0 and "kind: final" in result.stdout and "final: ok" in result.stdout


def test_mounts_as_a_subcommand_group() -> None:
    import typer

    root = typer.Typer()

    @root.callback()
    def main() -> None:
        """Root, as in flows/cli.py."""

    root.add_typer(app, name="protocol")
    result = runner.invoke(root, ["protocol", "parse", "--json"], input="<final>x</final>")
    assert result.exit_code == 0 and json.loads(result.stdout)["kind"] == "final"
