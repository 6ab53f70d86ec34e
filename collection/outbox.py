"""`Outbox`: finished episodes on their way to storage, between the workers that run
episodes and the one task that persists them.

Workers `put` each finished trajectory and go on with the next episode; the persister
takes `next_group()`: `batch_size` trajectories as soon as that many are waiting, fewer
once the oldest has waited `flush_interval_s`, the rest once the outbox is closed. The
outbox holds at most `capacity` trajectories: a worker finding it full waits (storage
slower than the sandboxes slows the workers down instead of growing memory). Pure
asyncio: no SQL, no sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Outbox(Generic[T]):
    """A bounded FIFO of finished items, taken in groups."""

    def __init__(self, *, batch_size: int, capacity: int, flush_interval_s: float) -> None:
        if batch_size < 1 or capacity < batch_size:
            raise ValueError(
                f"need 1 <= batch_size <= capacity, got batch_size={batch_size}, "
                f"capacity={capacity}"
            )
        self.batch_size = batch_size
        self.capacity = capacity
        self.flush_interval_s = flush_interval_s
        self._items: deque[tuple[float, T]] = deque()
        self._changed = asyncio.Event()
        self._space = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> None:
        """Add `item`, first waiting while the outbox is full. A finished item is never
        dropped: cancelled while it waits, it is added all the same (the caller's cleanup
        persists it) and the cancellation goes on."""
        try:
            while len(self._items) >= self.capacity:
                self._space.clear()
                await self._space.wait()
        finally:
            self._items.append((asyncio.get_running_loop().time(), item))
            self._changed.set()

    def close(self) -> None:
        """No more items: `next_group` hands out what is left without waiting."""
        self._closed = True
        self._changed.set()

    def take(self) -> list[T]:
        """Up to `batch_size` items at once, oldest first (none waiting: [])."""
        group = [self._items.popleft()[1] for _ in range(min(self.batch_size, len(self._items)))]
        if group:
            self._space.set()
        return group

    async def next_group(self) -> list[T]:
        """The next group to persist: `batch_size` items as soon as that many wait; fewer
        when the oldest has waited `flush_interval_s` or the outbox is closed; [] once it
        is closed and empty."""
        loop = asyncio.get_running_loop()
        while True:
            if len(self._items) >= self.batch_size or (self._closed and self._items):
                return self.take()
            if self._closed:
                return []
            self._changed.clear()
            if not self._items:
                await self._changed.wait()
                continue
            wait_s = self._items[0][0] + self.flush_interval_s - loop.time()
            if wait_s <= 0:
                return self.take()
            # Losing this wait to the timeout is harmless: nothing is taken by waiting.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
