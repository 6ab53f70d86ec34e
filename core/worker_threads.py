"""Blocking work in a worker thread that a cancelled coroutine does not leave behind.

    result = await in_worker_thread(lambda: train(...), stop=stop_event)

`asyncio.to_thread` alone leaves its thread running when the awaiting task is cancelled
(Ctrl-C, SIGTERM, a flow's cancel): the thread goes on writing into folders, databases and
sandboxes that the cancelled code is closing, and `asyncio.run` then waits for it at exit
(`shutdown_default_executor`) or, when the thread waits on that event loop, forever. Here a
cancellation sets `stop` (work that checks it ends early: a trainer's `StopWhenAsked`
callback, a GRPO rollout source) and waits for the thread to end before it goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_worker_thread"]

T = TypeVar("T")


async def in_worker_thread(fn: Callable[[], T], *, stop: threading.Event | None = None) -> T:
    """`fn()` in a worker thread. On cancellation `stop` is set and the thread is waited
    for (whatever it raised then is dropped) before the cancellation goes on."""
    work = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        if stop is not None:
            stop.set()
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # retrieved: the thread's error is the stop's, not news
        raise
