"""Fixtures for the sandbox tests: real nsjail jails, plus leak checks after every test.

Tests are plain functions that call `asyncio.run` on their body (no asyncio plugin); the
`jails` fixture opens sandboxes and, after the test, checks that each jail's PID namespace
is empty (no process of it survives on the host) and that no cgroup, mount or state dir
was left behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from sandbox import FaultProfile, NsjailSandbox, SandboxSettings, SandboxSpec, open_sandbox
from sandbox.host import prepare_host

#: Small limits so that bombs hit them fast.
SMALL = SandboxSpec(
    memory_mib=512, pids=64, tmpfs_mib=32, workspace_mib=64, inodes=4096, call_timeout_s=10
)


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def processes_in_namespace(ns: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and pid_namespace(int(entry)) == ns:
            found.append(int(entry))
    return found


def _parent_and_name(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = stat[stat.find("(") + 1 : stat.rfind(")")]
    return int(stat[stat.rfind(")") + 2 :].split()[1]), name


def in_another_process_jail(pid: int) -> bool:
    """Whether `pid` runs under a live nsjail that is not this process's descendant.

    A PID namespace's name is an inode number the kernel reuses once the namespace is
    gone: after a test's jail ended, a jail another process (the other pytest-xdist
    worker, a collection beside the suite) starts can get the same name. Such a process
    is that nsjail's descendant and not this process's; a survivor of this process's
    jail is either still under its nsjail (a descendant of this process) or, orphaned,
    under no nsjail at all."""
    me, seen, under_nsjail = os.getpid(), set(), False
    current = _parent_and_name(pid)
    while current is not None and current[0] > 1 and current[0] not in seen:
        parent = current[0]
        if parent == me:
            return False
        seen.add(parent)
        current = _parent_and_name(parent)
        under_nsjail = under_nsjail or (current is not None and current[1] == "nsjail")
    return under_nsjail


def survivors_of(ns: str) -> list[int]:
    """Processes of this process's ended jail `ns` still on the host (see
    `in_another_process_jail` for why the namespace's name alone does not tell)."""
    return [pid for pid in processes_in_namespace(ns) if not in_another_process_jail(pid)]


def jail_cgroups(pids: list[int]) -> list[Path]:
    """cgroups nsjail made for these pids (it names them NSJAIL.<pid>) that still exist."""
    found = []
    for controller in ("memory", "pids"):
        for pid in pids:
            path = Path("/sys/fs/cgroup") / controller / "NSJAIL" / f"NSJAIL.{pid}"
            if path.exists():
                found.append(path)
    return found


def episode_state(state_dir: Path) -> set[str]:
    """Entries of the state dir other than the shared, content-addressed files (and other
    processes' staging copies of them): there should never be any."""
    if not state_dir.exists():
        return set()
    shared = ("etc-", "executor-", ".etc-", ".executor-")
    return {p.name for p in state_dir.iterdir() if not p.name.startswith(shared)}


async def until(condition: Callable[[], bool], what: str, *, timeout_s: float = 60.0) -> None:
    """Return once `condition()` holds, polling on the running loop. `timeout_s` only bounds
    a broken test (it fails naming `what`); nothing is timed by it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout_s:g} s")
        # Poll interval of a poll-until (it ends on its condition or deadline): not a clock.
        await asyncio.sleep(0.02)


def host_mounts() -> Counter[str]:
    """The host's mount points (`/proc/self/mountinfo`), less those inside an image build's
    root: `mmdebstrap --mode=root` mounts `/proc`, `/sys`, `/dev` and `/dev/pts` in the root
    it builds (`<images>/<name>/root/...`) while another xdist worker builds an image, so
    they come and go beside this worker's jails."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.strip()]
    return Counter(p for p in points if not re.search(r"/images/[^/]+/root/", p))


@pytest.fixture(scope="session")
def sandbox_settings() -> SandboxSettings:
    # The default state dir (under the system temp dir, shared and content-addressed):
    # pytest's own temp root is 0700, which a jail's user namespace cannot enter. Prepared
    # once here so that the per-test leak check sees the shared files already in place.
    settings = SandboxSettings()
    asyncio.run(prepare_host(settings))
    return settings


class Jails:
    """Opens sandboxes for one test and remembers each jail's PID namespace."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.namespaces: list[str] = []
        self.nsjail_pids: list[int] = []
        self.executor_pids: list[int] = []

    async def open(
        self,
        spec: SandboxSpec = SMALL,
        *,
        files: Mapping[str, str | bytes] | None = None,
        faults: FaultProfile | None = None,
        fault_seed: int = 0,
    ) -> NsjailSandbox:
        box = await open_sandbox(
            spec, files=files, faults=faults, fault_seed=fault_seed, settings=self.settings
        )
        self.track(box)
        return box

    def track(self, box: NsjailSandbox) -> None:
        assert box.jail.executor_pid is not None
        ns = pid_namespace(box.jail.executor_pid)
        assert ns is not None
        self.namespaces.append(ns)
        self.nsjail_pids.append(box.jail.nsjail_pid)
        self.executor_pids.append(box.jail.executor_pid)


@pytest.fixture
def jails(sandbox_settings: SandboxSettings) -> Iterator[Jails]:
    mounts_before = host_mounts()
    state_before = episode_state(sandbox_settings.state_dir)
    tracker = Jails(sandbox_settings)
    yield tracker
    for ns in tracker.namespaces:
        assert survivors_of(ns) == [], f"processes of jail {ns} survived"
    for pid in tracker.nsjail_pids:
        assert not Path(f"/proc/{pid}").exists(), f"nsjail {pid} survived"
    assert jail_cgroups(tracker.nsjail_pids + tracker.executor_pids) == [], (
        "a jail's cgroup was left behind"
    )
    # A mount this test's jails left is one more than before; one fewer is another worker's.
    leaked = host_mounts() - mounts_before
    assert not leaked, f"a mount leaked onto the host: {sorted(leaked)}"
    assert episode_state(sandbox_settings.state_dir) == state_before, "per-episode state leaked"
