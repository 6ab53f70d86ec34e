"""The `epiflow` command line. Settings are built here, at the entry point, and passed down.

Every user-facing failure (bad setting, unreachable database, missing bucket, outdated
schema, no sandbox, Prefect's API not answering) is one line on stderr naming what to fix,
and exit code 2. So are the infrastructure failures a user fixes outside epiflow, when
they surface as plain exceptions: a database that refuses a statement (read-only, locked,
gone), a full or read-only disk, and a validation error (every field path and reason).
An interrupt (Ctrl-C, SIGTERM) is one line and exit code 130 / 143.
"""

from __future__ import annotations

import errno
import faulthandler
import functools
import signal
import sys
from typing import TYPE_CHECKING, cast

from core.errors import EpiflowError, reason_line

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.console import Console

    from config.settings import Settings

USER_ERRORS = (EpiflowError,)
"""Failures a user fixes through settings or arguments: one line, exit code 2. Every
package's root error derives from `EpiflowError` (see `core/errors.py`)."""

FAST_PATHS: dict[tuple[str, ...], bool] = {
    ("protocol", "parse"): False,
    ("protocol", "parse", "--json"): True,
}
"""The argument lists `main` runs without building the typer app (argv -> `--json`):
`epiflow protocol parse [--json]` is called once per message by scripts and checks, and
typer's argument parsing alone (it builds pydantic adapters for every option) costs more
than the parse. Any other arguments (`--help`, a typo) go through typer as before."""
# The typer app (`cli/root.py`) is imported only when a command needs it: this module
# imports neither typer nor rich nor pydantic at load.


@functools.cache
def _console(*, stderr: bool) -> Console:
    """The terminal (stdout, or stderr for errors), made when first printed to: `rich`
    is not imported by a command that prints nothing through it."""
    from cli.terminal import TerminalConsole

    return TerminalConsole(stderr=stderr, soft_wrap=True)


def _err() -> Console:
    return _console(stderr=True)


def _out() -> Console:
    return _console(stderr=False)


def _settings() -> Settings:
    from config.settings import load_settings

    return load_settings()


def main() -> None:
    """Console-script entry point: user errors become one line and exit code 2."""
    # `kill -USR1 <pid>` prints every thread's stack to stderr: how an operator (or a
    # test) sees where a command that will not stop is waiting, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    argv = sys.argv[1:]
    try:
        fast = FAST_PATHS.get(tuple(argv))
        if fast is not None:
            from cli import protocol_outcome

            protocol_outcome.run(as_json=fast)
            return
        from cli.root import build_app, command_of

        build_app(command_of(argv))()
    except USER_ERRORS as e:
        sys.exit(report_error(e))
    except Exception as e:
        # pydantic and SQLAlchemy are imported by the commands that use them, not here:
        # an error of theirs can only come from a command that imported them.
        if _is_instance(e, "pydantic_core", "ValidationError"):
            sys.exit(report_line(validation_line(cast("ValidationError", e))))
        if _is_instance(e, "sqlalchemy.exc", "OperationalError"):
            reason = reason_line(str(getattr(e, "orig", None) or e), 300)
            sys.exit(
                report_line(
                    f"the database refused a statement: {reason} (check EPIFLOW_DATABASE_URL)"
                )
            )
        if not isinstance(e, OSError) or e.errno not in _DISK_ERRNOS:
            raise
        where = f" ({e.filename})" if e.filename else ""
        sys.exit(report_line(f"{e.strerror}{where}: free space or make it writable, then re-run"))
    except KeyboardInterrupt:
        _err().print("interrupted", highlight=False)
        sys.exit(128 + signal.SIGINT)


def _is_instance(error: Exception, module: str, name: str) -> bool:
    """`isinstance(error, module.name)` without importing `module` when nothing has."""
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(error, cls)


_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Disk failures a user fixes outside epiflow: full, over quota, read-only."""


def validation_line(error: ValidationError) -> str:
    """Every problem of a validation error on one line: `field.path: reason; …`."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or error.title}: {item['msg']}"
        for item in error.errors()
    )
    return f"invalid {error.title}: {problems}"


def report_line(message: str) -> int:
    """Print a one-line error; returns the exit code (2)."""
    from rich.markup import escape

    _err().print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return 2


def report_error(error: EpiflowError) -> int:
    """Print a user error: its one line, then any detail lines (e.g. every problem of a
    `suite.yaml`) indented below; returns the exit code (2)."""
    from rich.markup import escape

    _err().print(f"[bold red]error:[/] {escape(error.user_message())}", highlight=False)
    for line in str(error).splitlines()[1:]:
        if line.strip():
            _err().print(f"  {line.strip()}", highlight=False, markup=False)
    return 2


if __name__ == "__main__":
    main()
