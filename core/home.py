"""`EPIFLOW_HOME`: the one directory every default local path derives from.

The SQLite database (`$EPIFLOW_HOME/epiflow.db`) and the local object store
(`$EPIFLOW_HOME/objects`) default to it, so the CLI, `epiflow serve` and a worker started
in any working directory find the same files. It defaults to `~/.epiflow` and must be
absolute: a relative home would again mean something different in every process.
Settings that are set explicitly (`EPIFLOW_DATABASE_URL`, `EPIFLOW_OBJECTS_URL`) win.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from core.errors import EpiflowError

HOME_SETTING = "EPIFLOW_HOME"
DEFAULT_HOME = "~/.epiflow"
"""The home when EPIFLOW_HOME is unset (expanded against the user's home directory)."""


class HomeInvalid(EpiflowError):
    """EPIFLOW_HOME is not an absolute path."""


def epiflow_home(environ: Mapping[str, str] | None = None) -> Path:
    """The absolute epiflow home: EPIFLOW_HOME (with `~` expanded), else `~/.epiflow`.

    Read when settings are built (at the entry point), never at import.

    Raises:
        HomeInvalid: EPIFLOW_HOME is relative (the message names it).
    """
    env = os.environ if environ is None else environ
    raw = env.get(HOME_SETTING, "").strip() or DEFAULT_HOME
    home = Path(raw).expanduser()
    if not home.is_absolute():
        raise HomeInvalid(
            f"{HOME_SETTING} must be an absolute path, got {raw!r}: a relative home would "
            "mean a different directory for every working directory (CLI, serve, workers)",
            setting=HOME_SETTING,
        )
    return home
