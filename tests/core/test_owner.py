"""A process's identity (pid + start time) in one place: a live process is itself, a pid
whose process exited is gone even before its parent reaps it (a zombie), and a pid reused
by another process is not the recorded one."""

from __future__ import annotations

import os
import socket
import subprocess

from core.owner import owner_gone, process_alive, process_start_ticks, this_process


def _exited_unreaped(child: subprocess.Popen[bytes]) -> None:
    """Let `child` exit and wait for it without reaping it: it stays a zombie until
    `child.wait()`."""
    assert child.stdin is not None
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)


def test_a_live_process_is_itself() -> None:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None and ticks > 0
    assert process_alive(os.getpid(), ticks)
    assert not process_alive(os.getpid(), ticks + 1)  # same pid, another start: a reused pid
    assert not owner_gone(this_process())
    assert this_process() == f"{socket.gethostname()} {os.getpid()} {ticks}"


def test_a_zombie_is_gone() -> None:
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        ticks = process_start_ticks(child.pid)
        assert ticks is not None
        owner = f"{socket.gethostname()} {child.pid} {ticks}"
        assert process_alive(child.pid, ticks) and not owner_gone(owner)
        _exited_unreaped(child)
        # /proc/PID still exists with the same start time; the process is nonetheless gone.
        assert os.path.exists(f"/proc/{child.pid}")
        assert process_start_ticks(child.pid) is None
        assert not process_alive(child.pid, ticks)
        assert owner_gone(owner)
    finally:
        child.wait()
    assert process_start_ticks(child.pid) is None and owner_gone(owner)


def test_unparsable_and_other_hosts_owners_are_not_judged() -> None:
    assert not owner_gone("garbage")
    assert not owner_gone(f"{socket.gethostname()}-elsewhere 1 1")
    assert owner_gone(f"{socket.gethostname()} {os.getpid()} ?")
