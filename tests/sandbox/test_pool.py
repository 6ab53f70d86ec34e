"""The warm pool as collection uses it (`pooled_opener`), and jail starts that are cut short,
on real jails: one jail per episode with its own files, faults and seed; a bounded number
of starts; nothing left behind on close or cancellation."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import (
    FaultProfile,
    NsjailSandbox,
    SandboxSettings,
    SandboxUnavailable,
    WarmPool,
    pooled_opener,
)
from sandbox.factory import start_jail
from sandbox.host import prepare_host
from tests.sandbox.conftest import SMALL, Jails, until

FAULTS = FaultProfile(permission_denied_p=0.3, network_failure_p=0.3, latency_p=0.0)


def nsjail_children() -> list[int]:
    """nsjail processes this test process started that are still alive."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("Name", "").strip() == "nsjail" and int(fields["PPid"]) == os.getpid():
            found.append(int(entry))
    return found


@pytest.fixture
def own_cgroups(jails: Jails) -> Iterator[SandboxSettings]:
    """Settings whose jails put their cgroups under a parent of this test alone (other
    processes on the host start jails too, under the shared default parent); after the
    test that parent must be empty, and is removed."""
    parent = f"NSJAIL-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    settings = jails.settings.model_copy(update={"cgroup_parent": parent})
    asyncio.run(prepare_host(settings))
    jails.settings = settings
    yield settings
    for controller in ("memory", "pids"):
        folder = settings.cgroup_root / controller / parent
        if folder.is_dir():
            assert [p.name for p in folder.iterdir() if p.is_dir()] == [], "a cgroup leaked"
            folder.rmdir()


def jail_cgroups(settings: SandboxSettings) -> list[str]:
    """The jail cgroups under `settings`' parent (nsjail names them NSJAIL.<pid>)."""
    root = settings.cgroup_root / "memory" / settings.cgroup_parent
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


async def faults_seen(box: NsjailSandbox) -> list[str | None]:
    kinds = []
    for i in range(12):
        r = await box.call_tool("execute_shell", {"command": f"echo {i}"})
        kinds.append(r.injected_fault.kind if r.injected_fault else None)
    return kinds


def test_pooled_opener_gives_each_episode_its_own_jail(
    jails: Jails, own_cgroups: SandboxSettings
) -> None:
    async def body() -> None:
        async with pooled_opener(SMALL, concurrency=3, settings=jails.settings, episodes=4) as pool:
            assert pool.size == 3
            await pool.wait_idle(3)
            boxes = []
            for n in range(3):
                box = await pool.open_sandbox(
                    SMALL, files={"n.txt": str(n)}, faults=FAULTS, fault_seed=n
                )
                jails.track(box)
                boxes.append(box)
            assert pool.hits == 3
            for n, box in enumerate(boxes):
                assert (await box.exec(["cat", "n.txt"])).stdout == str(n).encode()
                assert box.describe()["fault_seed"] == n
                # The faults a pooled jail injects are those of a cold one with the same seed.
                async with await jails.open(SMALL, faults=FAULTS, fault_seed=n) as cold:
                    assert await faults_seen(box) == await faults_seen(cold)
                await box.close()
            # Four episodes in all: one more jail, never a fifth. A refill creates its
            # start at once (in `acquire`), so a fifth would already be counted here.
            await asyncio.wait_for(pool.wait_idle(1), 120)
            assert pool.idle == 1 and not pool.starting
            last = await pool.open_sandbox(SMALL)
            jails.track(last)
            await last.close()
            assert pool.idle == 0 and not pool.starting
            # Another spec is not the pool's: a cold jail of that spec.
            other = SMALL.model_copy(update={"pids": 32})
            odd = await pool.open_sandbox(other)
            jails.track(odd)
            assert odd.spec == other
            await odd.close()
        assert nsjail_children() == []
        assert jail_cgroups(own_cgroups) == []

    asyncio.run(body())


def test_an_acquire_waits_for_a_start_in_flight_instead_of_a_second_jail(jails: Jails) -> None:
    async def body() -> None:
        pool = WarmPool(SMALL, size=2, settings=jails.settings)
        await pool.start(wait=False)  # two starts in flight, none idle yet
        assert pool.idle == 0
        boxes = await asyncio.gather(pool.acquire(), pool.acquire())
        for box in boxes:
            jails.track(box)
        assert pool.misses == 0 and pool.hits + pool.waited == 2
        await asyncio.gather(*(b.close() for b in boxes))
        await pool.close()
        assert nsjail_children() == []

    asyncio.run(body())


def test_an_acquire_arriving_as_a_start_hands_over_its_jail_gets_one(
    jails: Jails, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background start that hands its jail to a waiting episode is no longer "in
    flight": an episode acquiring in that same loop step must not wait for it (it would
    wait forever: the x8 CI hang, an `epiflow collect` idle past 600 s with no jail
    left). Real jails; the wrapper only times the second acquire into that step."""
    import sandbox.pool as pool_module

    async def body() -> None:
        # The limit matters: with the finished start still counted, the refill that would
        # have started the second episode's jail found no budget left.
        pool = WarmPool(SMALL, size=1, limit=2, settings=jails.settings)
        second: list[asyncio.Task[NsjailSandbox]] = []

        async def start_then_acquire(*args: object, **kwargs: object) -> object:
            jail = await start_jail(*args, **kwargs)  # type: ignore[arg-type]
            if not second:  # runs right after this start's last step
                second.append(asyncio.create_task(pool.acquire()))
            return jail

        monkeypatch.setattr(pool_module, "start_jail", start_then_acquire)
        await pool.start(wait=False)
        first = await asyncio.wait_for(pool.acquire(), 120)
        jails.track(first)
        other = await asyncio.wait_for(second[0], 120)
        jails.track(other)
        assert other.jail is not first.jail
        await asyncio.gather(first.close(), other.close())
        await pool.close()
        assert nsjail_children() == []

    asyncio.run(body())


def test_a_start_failing_unexpectedly_leaves_no_episode_waiting(
    jails: Jails, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background start that ends in an error other than `SandboxUnavailable` still
    releases the episodes waiting for it: they start a jail of their own and get that
    error, instead of waiting forever. The failing start is injected (the host cannot be
    made to fail that way on purpose)."""
    import sandbox.pool as pool_module

    async def body() -> None:
        waited_on = asyncio.Event()

        async def broken(*args: object, **kwargs: object) -> object:
            # The background start fails only once an episode waits for it: the case
            # under test, however the loop is scheduled.
            await waited_on.wait()
            raise RuntimeError("the host's state dir vanished")

        monkeypatch.setattr(pool_module, "start_jail", broken)
        pool = WarmPool(SMALL, size=1, settings=jails.settings)
        await pool.start(wait=False)
        acquiring = asyncio.ensure_future(asyncio.wait_for(pool.acquire(), 60))
        await until(lambda: pool.waiting == 1, "an episode waiting for the start")
        waited_on.set()
        with pytest.raises(RuntimeError, match="state dir vanished"):
            await acquiring
        assert pool.waiting == 0
        await pool.close()

    asyncio.run(body())


def test_closing_or_cancelling_mid_start_leaves_nothing_behind(
    jails: Jails, own_cgroups: SandboxSettings
) -> None:
    async def body() -> None:
        host = await prepare_host(jails.settings)
        # A jail start cancelled before the executor answered kills what it started.
        for delay in (0.0, 0.002, 0.005, 0.01):
            task = asyncio.ensure_future(start_jail(SMALL, host, jails.settings))
            # Not a clock: the delays spread the cancel over the start's steps, and either
            # outcome (cancelled, or ready first and killed below) is checked.
            await asyncio.sleep(delay)
            task.cancel()
            try:
                jail = await task
            except asyncio.CancelledError:
                pass
            else:  # it was ready before the cancel landed
                await jail.kill()
        # A pool closed while it fills, and an acquire cancelled while it waits.
        pool = WarmPool(SMALL, size=4, settings=jails.settings)
        await pool.start(wait=False)
        waiting = asyncio.ensure_future(pool.acquire())
        # One loop step, not a clock: the acquire is under way; wherever the cancel finds
        # it, nothing is left behind.
        await asyncio.sleep(0)
        waiting.cancel()
        try:
            box = await waiting
        except asyncio.CancelledError:
            pass
        else:
            jails.track(box)
            await box.close()
        await pool.close()
        assert pool.idle == 0
        assert nsjail_children() == []
        assert jail_cgroups(own_cgroups) == []

    asyncio.run(body())


def test_a_pool_on_a_host_that_cannot_start_jails_fails_each_episode(tmp_path: Path) -> None:
    fake = tmp_path / "nsjail"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    settings = SandboxSettings(nsjail_path=fake)

    async def body() -> None:
        async with pooled_opener(SMALL, concurrency=2, settings=settings) as pool:
            for _ in range(2):
                with pytest.raises(SandboxUnavailable, match="cannot start a jail"):
                    await pool.open_sandbox(SMALL)

    asyncio.run(body())
