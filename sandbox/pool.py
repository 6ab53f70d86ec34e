"""`WarmPool`: jails started ahead of need, so an episode never waits for a cold start.

A pool holds up to `size` idle jails of one spec. `acquire` hands one out (populated,
clock started) and starts a replacement in the background; when none is ready it starts
a cold one, so a pool is never slower than `open_sandbox`. Every jail serves exactly one
episode: a reset is a new jail, never a cleaned one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from sandbox.episode import NsjailSandbox
from sandbox.errors import SandboxUnavailable
from sandbox.factory import activate, start_jail
from sandbox.faults import FaultProfile
from sandbox.host import prepare_host
from sandbox.jail import Jail
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec


class WarmPool:
    """Idle jails of one spec, refilled in the background."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        size: int,
        settings: SandboxSettings | None = None,
        parallel_starts: int = 4,
    ) -> None:
        if size < 0:
            raise ValueError(f"size must be a non-negative number of jails, got {size}")
        self.spec = spec
        self.size = size
        self.settings = settings if settings is not None else SandboxSettings()
        self._parallel = max(1, parallel_starts)
        self._ready: deque[Jail] = deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._started = False
        self._jail_ready = asyncio.Event()
        self._closed = False
        self.hits = 0
        """Episodes that got a warm jail."""
        self.misses = 0
        """Episodes that had to wait for a cold start."""
        self.last_error: SandboxUnavailable | None = None
        """Why the last background start failed, if it did (refilling pauses until the next acquire)."""

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

    def _refill(self) -> None:
        if self._closed or not self._started or self.last_error is not None:
            return
        while (
            len(self._ready) + len(self._starting) < self.size
            and len(self._starting) < self._parallel
        ):
            task = asyncio.get_running_loop().create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        try:
            host = await prepare_host(self.settings)  # cached; re-made if its files vanished
            jail = await start_jail(self.spec, host, self.settings)
        except SandboxUnavailable as e:
            self.last_error = e
            return
        if self._closed:
            await jail.kill()
            return
        self._ready.append(jail)
        self._jail_ready.set()
        self._refill()

    async def acquire(
        self,
        *,
        files: Mapping[str, str | bytes] | None = None,
        faults: FaultProfile | None = None,
        fault_seed: int = 0,
    ) -> NsjailSandbox:
        """A started sandbox (warm if one is ready), `files` written under /workspace.

        Raises:
            SandboxUnavailable: no warm jail and a cold one could not start.
            TransferError: a file path would leave the workspace.
        """
        if self._closed:
            raise SandboxUnavailable("the warm pool is closed")
        if not self._started:
            await self.start(wait=False)
        host = await prepare_host(self.settings)
        self.last_error = None
        jail = None
        while self._ready:
            candidate = self._ready.popleft()
            if (
                candidate.alive
                and time.monotonic() - candidate.started_at < self.settings.pool_max_idle_s
            ):
                jail = candidate
                break
            await candidate.kill()
        if jail is None:
            self.misses += 1
            jail = await start_jail(self.spec, host, self.settings)
        else:
            self.hits += 1
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

    async def close(self) -> None:
        """Stop refilling and kill every idle jail."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        for task in list(self._starting):
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
