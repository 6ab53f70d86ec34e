"""The shared local server's bookkeeping, without starting Prefect: leases of live and dead
processes, the idle watcher's decisions, and the lock. The watcher runs as in the server
process, in a thread, on a stand-in for uvicorn's `Server` (only `should_exit` is read).
Starting, reusing and stopping a real server is tested through the CLI
(`tests/cli/test_concurrent.py`, `tests/cli/test_interrupts.py`)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from config.settings import PrefectSettings
from core.owner import process_start_ticks
from orchestration.prefect_server import (
    PrefectUnavailable,
    ServerState,
    _locked,
    _watch,
    _write_lease,
    _write_state,
    attach,
    live_leases,
    read_state,
)


class FakeServer:
    should_exit = False


def own_state(port: int = 1) -> ServerState:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    return ServerState(pid=os.getpid(), start_ticks=ticks, port=port, started_at="now")


POLL_S = 0.05
"""The watcher's check interval in these tests (the server's is `LEASE_POLL_S`)."""


class Checks:
    """Counts the watcher's checks that kept it running: a test waits for a number of them
    instead of sleeping for as long as it hopes they take."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def __call__(self) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def wait_for(self, more: int) -> None:
        with self.changed:
            target = self.count + more
            assert self.changed.wait_for(lambda: self.count >= target, timeout=60), (
                f"the watcher made {self.count} of {target} checks in 60 s"
            )

    def spanning(self, seconds: float) -> int:
        """Checks enough to span `seconds` (each waits `POLL_S` before it starts), and two."""
        return math.ceil(seconds / POLL_S) + 2


def watch(
    directory: Path, idle_s: float
) -> tuple[FakeServer, threading.Event, threading.Thread, Checks]:
    server, done, checks = FakeServer(), threading.Event(), Checks()
    thread = threading.Thread(
        target=_watch,
        args=(directory, idle_s, done, server),
        kwargs={"poll_s": POLL_S, "checked": checks},
        daemon=True,
    )
    thread.start()
    return server, done, thread, checks


def dead_process_lease(directory: Path) -> Path:
    """A lease left by a process that was killed (`kill -9`): it never removed it."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # A process that lives until the test ends it: a workload, not a wait.
            "import sys, time; print(open('/proc/self/stat').read()); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    stat = child.stdout.readline()
    ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
    lease = directory / "leases" / f"{child.pid}-{ticks}"
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.touch()
    assert live_leases(directory) == [lease.name]
    child.kill()
    child.communicate()
    return lease


def test_dead_leases_do_not_keep_the_server(tmp_path: Path) -> None:
    lease = dead_process_lease(tmp_path)
    assert live_leases(tmp_path) == []
    _write_state(tmp_path, own_state())
    server, _done, thread, _checks = watch(tmp_path, idle_s=0.2)
    thread.join(timeout=30)
    assert server.should_exit and not thread.is_alive()
    assert not lease.exists()  # pruned
    assert read_state(tmp_path) is None  # a later command starts a fresh server


def test_a_live_lease_keeps_it_and_its_release_starts_the_idle_clock(tmp_path: Path) -> None:
    _write_state(tmp_path, own_state())
    lease = _write_lease(tmp_path)
    idle_s = 1.0
    server, _done, thread, checks = watch(tmp_path, idle_s=idle_s)
    checks.wait_for(checks.spanning(idle_s))
    assert not server.should_exit and read_state(tmp_path) is not None
    released = time.monotonic()
    lease.unlink()
    thread.join(timeout=30)
    # The idle clock starts at the last check that saw the lease, one interval before the
    # release at most: half the idle period leaves room for a slow wake-up of this thread.
    assert server.should_exit and time.monotonic() - released >= idle_s / 2
    assert read_state(tmp_path) is None


def test_a_stopped_or_replaced_record_ends_the_server(tmp_path: Path) -> None:
    _write_state(tmp_path, own_state())
    _write_lease(tmp_path)
    server, _done, thread, checks = watch(tmp_path, idle_s=600)
    checks.wait_for(1)  # it has seen its record
    (tmp_path / "server.json").unlink()  # what `stop` does before signalling
    thread.join(timeout=30)
    assert server.should_exit


def test_the_watcher_does_not_stop_while_a_command_holds_the_lock(tmp_path: Path) -> None:
    """A command attaching holds the lock between its health check and its lease; the
    watcher decides under the same lock, so it cannot stop in between."""
    _write_state(tmp_path, own_state())
    idle_s = 0.2
    with _locked(tmp_path, None):
        server, done, thread, checks = watch(tmp_path, idle_s=idle_s)
        checks.wait_for(checks.spanning(idle_s))  # idle, the last two checks found it locked
        assert not server.should_exit
        _write_lease(tmp_path)
    checks.wait_for(2)
    assert not server.should_exit
    done.set()
    thread.join(timeout=30)


def test_attach_gives_up_on_a_lock_held_too_long(tmp_path: Path) -> None:
    with _locked(tmp_path, None):
        started = time.monotonic()
        with pytest.raises(PrefectUnavailable) as caught:
            attach(PrefectSettings(start_timeout_s=1.0), directory=tmp_path)
    assert time.monotonic() - started < 10
    assert caught.value.setting == "EPIFLOW_PREFECT_START_TIMEOUT_S"
    assert live_leases(tmp_path) == []
