"""`epiflow protocol …`: inspect the tool-call protocol from the shell.

    epiflow protocol parse --json < message.txt

reads one assistant message on stdin, parses it against the built-in tool schemas and
prints `{"kind", "call_id", "tool", "args", "error", …}`. Every outcome, a protocol error
included, exits 0: the command reports, it does not judge.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from agent.errors import ProtocolError
from agent.protocol import parse_message
from agent.trajectory import ParseKind
from cli.terminal import neutralise
from sandbox.tool_specs import BUILTIN_TOOLS

app = typer.Typer(
    help="The agent tool-call protocol (v1).", no_args_is_help=True, add_completion=False
)


@app.callback()
def protocol() -> None:
    """The agent tool-call protocol (v1): see docs/protocol.md."""


def parse_outcome(text: str) -> dict[str, Any]:
    """The parse outcome of one message as a JSON-ready dict (never raises for bad input)."""
    outcome: dict[str, Any] = {
        "kind": ParseKind.NONE.value,
        "call_id": None,
        "tool": None,
        "args": None,
        "final": None,
        "error": None,
        "error_code": None,
        "tolerances": [],
    }
    try:
        parsed = parse_message(text, BUILTIN_TOOLS)
    except ProtocolError as e:
        outcome.update(
            kind=ParseKind.ERROR.value,
            error=e.message,
            error_code=e.code,
            tool=e.tool,
            call_id=e.call_id,
        )
        return outcome
    outcome.update(kind=parsed.kind.value, final=parsed.final, tolerances=list(parsed.tolerances))
    if parsed.call is not None:
        outcome.update(call_id=parsed.call.call_id, tool=parsed.call.tool, args=parsed.call.args)
    return outcome


@app.command()
def parse(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the outcome as one JSON object.")
    ] = False,
) -> None:
    """Parse one assistant message from stdin against the built-in tool schemas."""
    data = sys.stdin.buffer.read()
    outcome = parse_outcome(data.decode("utf-8", errors="replace"))
    if as_json:
        typer.echo(json.dumps(outcome, ensure_ascii=False, default=str))
        return
    # The message is untrusted text: its control characters are shown, not obeyed.
    typer.echo(neutralise(f"kind: {outcome['kind']}"))
    for key in ("call_id", "tool", "args", "final", "error", "error_code"):
        if outcome[key] is not None:
            value = outcome[key]
            typer.echo(
                neutralise(f"{key}: {json.dumps(value) if isinstance(value, dict) else value}")
            )
    if outcome["tolerances"]:
        typer.echo(neutralise(f"tolerances: {', '.join(outcome['tolerances'])}"))
