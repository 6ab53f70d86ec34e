"""`epiflow protocol …`: inspect the tool-call protocol from the shell.

    epiflow protocol parse --json < message.txt

reads one assistant message on stdin, parses it against the built-in tool schemas and
prints `{"kind", "call_id", "tool", "args", "error", …}`. Every outcome, a protocol error
included, exits 0: the command reports, it does not judge.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cli.protocol_outcome import outcome_lines, parse_outcome

__all__ = ["app", "parse_outcome"]

app = typer.Typer(
    help="The agent tool-call protocol (v1).", no_args_is_help=True, add_completion=False
)


@app.callback()
def protocol() -> None:
    """The agent tool-call protocol (v1): see docs/protocol.md."""


@app.command()
def parse(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the outcome as one JSON object.")
    ] = False,
) -> None:
    """Parse one assistant message from stdin against the built-in tool schemas."""
    for line in outcome_lines(sys.stdin.buffer.read(), as_json=as_json):
        typer.echo(line)
