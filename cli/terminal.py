"""The one place terminal output is made safe: control characters become visible.

Trajectory text, tool output, imported files, object keys and error messages are data a
hostile model or file controls. Printed raw, `ESC[2J` clears the operator's screen,
`ESC]0;…` retitles the window and `ESC]52;…` writes the clipboard. `neutralise` replaces
every C0 control (except newline and tab), DEL and every C1 control with one visible
character (the Unicode "control pictures" `␛`, `␇`, … for C0 and DEL, `�` for C1), so
lengths and therefore rich's spans and the clipping in `cli/show.py` are unchanged.

`neutralise` lives in `cli/neutral.py` (free of rich, for commands that print without it).
`TerminalConsole` is the rich `Console` every `epiflow` command prints through: it
neutralises the text of every segment it renders (a Panel's cells, a Table's rows, a
progress bar's description), while rich's own styling, emitted from styles and control
segments after rendering, still reaches the terminal.

`console_logs_without_tracebacks` keeps log records on the terminal to their one line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from cli.neutral import neutralise

__all__ = ["TerminalConsole", "console_logs_without_tracebacks", "neutralise"]


class TerminalConsole(Console):
    """A rich `Console` whose rendered text never carries a control character of the data."""

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not segment.text:
                yield segment
            else:
                yield Segment(neutralise(segment.text), segment.style, segment.control)


class _WithoutTraceback(logging.Formatter):
    """Formats a record as `inner` does, leaving out its traceback."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def console_logs_without_tracebacks() -> None:
    """Log records reach the terminal as their one line, without tracebacks (a task that
    failed on a lost database would print one per retry). Only the console handlers of the
    root logger change: the flow run's log in Prefect's API keeps every traceback. Call it
    after Prefect configured logging (after importing a flow)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler.formatter, _WithoutTraceback
        ):
            handler.setFormatter(_WithoutTraceback(handler.formatter or logging.Formatter()))
