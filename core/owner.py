"""Which process owns a piece of work, and whether that process is still running.

A process is its pid and its start time (clock ticks since boot, field 22 of
`/proc/PID/stat`): the pid alone is not enough, because a pid is reused once its process
has gone; and a zombie is gone, though its `/proc` entry stays until it is reaped. This is
the one home of that rule: the shared Prefect server's state and leases
(`orchestration/prefect_server.py`) use it too. An owner is `host pid start-time`. Scratch directories record their owner in a file (`core/scratch.py`); a
`training_run` row records it in a column, so the next training (or `epiflow db orphans
--fix`) can mark the rows of killed trainings `crashed`. Only the owner's own host can
tell whether it is gone: another host's owner is never judged.

Pure standard library; no epiflow imports.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when no such process runs,
    a zombie included: it has exited, only its exit status waits for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses:
    # split after the last ')'. Then field 3 is the state, field 22 the start time.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def process_alive(pid: int, start_ticks: int) -> bool:
    """Whether the process `pid` that started at `start_ticks` still runs (not a zombie,
    and not another process that reused its pid)."""
    return process_start_ticks(pid) == start_ticks


def this_process() -> str:
    """This process as an owner: `host pid start-time`."""
    pid = os.getpid()
    ticks = process_start_ticks(pid)
    return f"{socket.gethostname()} {pid} {'?' if ticks is None else ticks}"


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
    ticks = process_start_ticks(number)
    return ticks is None or str(ticks) != started
