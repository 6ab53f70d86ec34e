"""What `epiflow protocol parse` prints for one message: its parse outcome, as one JSON
object (`--json`) or as `key: value` lines with control characters made visible.

Free of typer: `cli.app.main` runs `epiflow protocol parse [--json]` through `run` without
building the typer app (the command starts in a fraction of the time); the typer command
in `cli/protocol.py` (its help, `epiflow protocol parse --help`, any other arguments)
prints the same lines. The parser and its pydantic models are imported when a message is
parsed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cli.neutral import neutralise


def parse_outcome(text: str) -> dict[str, Any]:
    """The parse outcome of one message as a JSON-ready dict (never raises for bad input)."""
    from agent.errors import ProtocolError
    from agent.protocol import parse_message
    from agent.trajectory import ParseKind
    from sandbox.tool_specs import BUILTIN_TOOLS

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


def outcome_lines(data: bytes, *, as_json: bool) -> list[str]:
    """The lines printed for the message `data` (invalid UTF-8 replaced)."""
    outcome = parse_outcome(data.decode("utf-8", errors="replace"))
    if as_json:
        return [json.dumps(outcome, ensure_ascii=False, default=str)]
    # The message is untrusted text: its control characters are shown, not obeyed.
    lines = [neutralise(f"kind: {outcome['kind']}")]
    for key in ("call_id", "tool", "args", "final", "error", "error_code"):
        if outcome[key] is not None:
            value = outcome[key]
            lines.append(
                neutralise(f"{key}: {json.dumps(value) if isinstance(value, dict) else value}")
            )
    if outcome["tolerances"]:
        lines.append(neutralise(f"tolerances: {', '.join(outcome['tolerances'])}"))
    return lines


def run(*, as_json: bool) -> None:
    """`epiflow protocol parse [--json]`: one message from stdin, its outcome on stdout."""
    for line in outcome_lines(sys.stdin.buffer.read(), as_json=as_json):
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
