"""Which process owns a piece of work, and whether that process is still running.

An owner is `host pid start-time` (the start time in clock ticks since boot, field 22 of
`/proc/PID/stat`): the pid alone is not enough, because a pid is reused once its process
has gone. Scratch directories record their owner in a file (`core/scratch.py`); a
`training_run` row records it in a column, so the next training (or `epiflow db orphans
--fix`) can mark the rows of killed trainings `crashed`. Only the owner's own host can
tell whether it is gone: another host's owner is never judged.

Pure standard library; no epiflow imports.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, None when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return stat.rsplit(")", 1)[1].split()[19]


def this_process() -> str:
    """This process as an owner: `host pid start-time`."""
    pid = os.getpid()
    return f"{socket.gethostname()} {pid} {_start_time(pid) or '?'}"


def owner_gone(owner: str) -> bool:
    """True when `owner` (as `this_process` wrote it) ran on this host and is no longer
    running. An owner that does not parse, or of another host, is not judged (False)."""
    try:
        host, pid, started = owner.split()
        number = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False  # another machine's: only it can tell
    return _start_time(number) != started
