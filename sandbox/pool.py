"""`WarmPool`: jails started ahead of need, so an episode's cold start overlaps other work.

A pool holds up to `size` idle jails of one spec. `acquire` hands one out (populated,
clock started) and starts a replacement in the background. When none is idle it waits
for a start already in flight (which began earlier than any new one could) and only
starts a cold jail of its own when there is none, so a pool is never slower than
`open_sandbox`. Every jail serves exactly one episode: a reset is a new jail, never a
cleaned one.

`pooled_opener` is the pool as collection uses it: an `open_sandbox`-compatible opener
backed by a pool sized from the concurrency, closed (idle jails killed) on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Self

from sandbox.errors import SandboxUnavailable
from sandbox.factory import activate, open_sandbox, start_jail
from sandbox.faults import FaultProfile
from sandbox.host import prepare_host
from sandbox.jail import Jail
from sandbox.nsjail_sandbox import NsjailSandbox
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec


class WarmPool:
    """Idle jails of one spec, refilled in the background."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        size: int,
        settings: SandboxSettings,
        parallel_starts: int = 4,
        limit: int | None = None,
    ) -> None:
        if size < 0:
            raise ValueError(f"size must be a non-negative number of jails, got {size}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be a non-negative number of jails, got {limit}")
        self.spec = spec
        self.size = size
        self.settings = settings
        self.limit = limit
        """Most jails this pool starts in all (e.g. the episodes left to run); None: no limit."""
        self._parallel = max(1, parallel_starts)
        self._ready: deque[Jail] = deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._waiters: deque[asyncio.Future[Jail | None]] = deque()
        self._started = False
        self._jail_ready = asyncio.Event()
        self._closed = False
        self._handed_out = 0
        self.hits = 0
        """Episodes that got an idle jail at once."""
        self.waited = 0
        """Episodes that waited for a jail the pool was already starting."""
        self.misses = 0
        """Episodes that had to start a cold jail of their own."""
        self.last_error: SandboxUnavailable | None = None
        """Why the last background start failed, if it did (refilling pauses until the next acquire)."""

    @classmethod
    def size_for(cls, concurrency: int, settings: SandboxSettings) -> int:
        """One idle jail per episode running at once, at most `settings.pool_max_size`."""
        return max(0, min(concurrency, settings.pool_max_size))

    async def start(self, *, wait: bool = True) -> None:
        """Prepare the host and fill the pool (waiting until it is full when `wait`)."""
        await prepare_host(self.settings)
        self._started = True
        self._refill()
        if wait:
            while self._starting:
                await asyncio.gather(*list(self._starting))
                self._refill()
                if self.last_error is not None:
                    raise self.last_error

    async def wait_idle(self, count: int = 1) -> None:
        """Wait until at least `count` jails (at most `size`) are idle.

        Raises:
            SandboxUnavailable: a background start failed, so the pool cannot fill.
        """
        self._refill()
        while len(self._ready) < min(count, self.size):
            if self.last_error is not None:
                raise self.last_error
            self._jail_ready.clear()
            await self._jail_ready.wait()

    @property
    def idle(self) -> int:
        """Jails ready to be handed out."""
        return len(self._ready)

    @property
    def starting(self) -> int:
        """Jails being started in the background."""
        return len(self._starting)

    @property
    def waiting(self) -> int:
        """Episodes waiting for a jail the pool is starting."""
        return len(self._waiters)

    def _budget(self) -> int | None:
        """Jails the pool may still start, or None without a limit."""
        if self.limit is None:
            return None
        # A waiter is already counted as handed out and will take one of the starts.
        return (
            self.limit
            - self._handed_out
            - len(self._ready)
            - len(self._starting)
            + len(self._waiters)
        )

    def _refill(self) -> None:
        if self._closed or not self._started or self.last_error is not None:
            return
        while (
            len(self._ready) + len(self._starting) < self.size + len(self._waiters)
            and len(self._starting) < self._parallel
        ):
            budget = self._budget()
            if budget is not None and budget <= 0:
                return
            task = asyncio.get_running_loop().create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        me = asyncio.current_task()
        assert me is not None  # always run as a task, by _refill
        try:
            host = await prepare_host(self.settings)  # cached; re-made if its files vanished
            jail = await start_jail(self.spec, host, self.settings)
        except SandboxUnavailable as e:
            self._starting.discard(me)
            self.last_error = e
            # Those waiting for this start get nothing and start cold jails themselves
            # (which raise the real error if the host cannot start any).
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
            self._jail_ready.set()
            return
        except BaseException:
            # Any other end (a bug, a cancel): the episodes this start was backing start
            # their own jails (and meet the error themselves) instead of waiting forever.
            self._starting.discard(me)
            self._release_unbacked()
            raise
        # No longer in flight, before anyone is handed the jail: an acquire running in the
        # same loop step must not wait for this start, and the refill below must count it
        # as done (the done-callback discard comes a step later).
        self._starting.discard(me)
        if self._closed:
            await jail.kill()
            return
        handed = False
        while self._waiters and not handed:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(jail)
                handed = True
        if not handed:
            self._ready.append(jail)
            self._jail_ready.set()
        self._refill()
        self._release_unbacked()

    def _release_unbacked(self) -> None:
        """Wake the waiters no start in flight will serve (a start ended and the refill
        started none: a limit, a closed pool): they start cold jails of their own."""
        while len(self._waiters) > len(self._starting):
            waiter = self._waiters.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def _take_idle(self) -> Jail | None:
        while self._ready:
            candidate = self._ready.popleft()
            if (
                candidate.alive
                and time.monotonic() - candidate.started_at < self.settings.pool_max_idle_s
            ):
                return candidate
            await candidate.kill()
        return None

    async def _wait_for_start(self) -> Jail | None:
        """The next jail a start already in flight makes, or None when that start failed."""
        waiter: asyncio.Future[Jail | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                jail = waiter.result()
                assert jail is not None
                self._ready.appendleft(jail)  # handed over just as we were cancelled
            raise

    async def acquire(
        self,
        *,
        files: Mapping[str, str | bytes] | None = None,
        faults: FaultProfile | None = None,
        fault_seed: int = 0,
    ) -> NsjailSandbox:
        """A started sandbox (warm if one is ready), `files` written under /workspace.

        Raises:
            SandboxUnavailable: no warm jail and a cold one could not start, or the pool
                is closed.
            TransferError: a file path would leave the workspace.
        """
        if self._closed:
            raise SandboxUnavailable("the warm pool is closed")
        if not self._started:
            await self.start(wait=False)
        host = await prepare_host(self.settings)
        self.last_error = None
        self._handed_out += 1
        jail = await self._take_idle()
        if jail is not None:
            self.hits += 1
        elif len(self._starting) > len(self._waiters):
            jail = await self._wait_for_start()
            if jail is not None:
                self.waited += 1
        if self._closed:
            if jail is not None:
                await jail.kill()
            raise SandboxUnavailable("the warm pool is closed")
        if jail is None:
            self.misses += 1
            jail = await start_jail(self.spec, host, self.settings)
        self._refill()
        return await activate(
            jail,
            self.spec,
            host,
            self.settings,
            files=files,
            faults=faults,
            fault_seed=fault_seed,
        )

    async def open_sandbox(
        self,
        spec: SandboxSpec,
        *,
        files: Mapping[str, str | bytes] | None = None,
        faults: FaultProfile | None = None,
        fault_seed: int = 0,
    ) -> NsjailSandbox:
        """`sandbox.open_sandbox` with this pool's jails: for the pool's spec, a pooled jail;
        for any other spec, a cold one (same errors as `acquire` / `open_sandbox`)."""
        if spec != self.spec:
            return await open_sandbox(
                spec, files=files, faults=faults, fault_seed=fault_seed, settings=self.settings
            )
        return await self.acquire(files=files, faults=faults, fault_seed=fault_seed)

    async def close(self) -> None:
        """Stop refilling and kill every idle jail (and every start in flight)."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        for task in list(self._starting):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        while self._ready:
            await self._ready.popleft().kill()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


@contextlib.asynccontextmanager
async def pooled_opener(
    spec: SandboxSpec,
    *,
    concurrency: int,
    settings: SandboxSettings,
    episodes: int | None = None,
) -> AsyncIterator[WarmPool]:
    """A `WarmPool` for `concurrency` episodes at once, started without waiting (a host that
    cannot start jails fails each episode, as `open_sandbox` would, instead of the run);
    `episodes` bounds the jails it ever starts. Its `open_sandbox` is the opener to pass
    to `agent.loop.run_episode`. Idle jails are killed on exit."""
    pool = WarmPool(
        spec, size=WarmPool.size_for(concurrency, settings), settings=settings, limit=episodes
    )
    try:
        with contextlib.suppress(SandboxUnavailable):  # each episode reports it instead
            await pool.start(wait=False)
        yield pool
    finally:
        await pool.close()
