"""Run a long coroutine so that Ctrl-C and SIGTERM stop it cleanly, within seconds.

The coroutine runs in a worker thread's event loop; the main thread only waits and handles
signals. Two reasons:

- Prefect's flow engine installs its own SIGTERM handler when it runs in the main thread,
  which raises inside whatever the loop is doing and then re-kills the process; from a
  worker thread it cannot install one, so the signal is ours to handle.
- A signal handler in the main thread can always run (the main thread is only joining),
  and it cancels the coroutine's task on its loop: cancellation unwinds every episode
  (jails closed, finished episodes flushed by `run_episodes`), then the flow run ends.

A stop that takes longer than `SLOW_STOP_S` prints the stacks of the coroutines it is still
waiting on (to stderr, once), so a hang names its cause. A second signal while stopping, or
a stop that outlasts `stop_timeout_s`, abandons the wait: `on_abandon` runs, then the
process exits at once (jails notice their closed pipe and go away; the episodes already
persisted stay).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

HANDLED = (signal.SIGINT, signal.SIGTERM)
SLOW_STOP_S = 30.0
"""Seconds after a signal before the coroutines still running are printed."""


class Interrupted(Exception):
    """The coroutine was cancelled by a signal; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """Shell convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def run_interruptibly(
    make: Callable[[], Coroutine[Any, Any, T]],
    *,
    on_signal: Callable[[int], None] | None = None,
    on_abandon: Callable[[int], None] | None = None,
    stop_timeout_s: float | None = None,
) -> T:
    """Run `make()` to completion in a worker thread; SIGINT or SIGTERM cancels it.

    `on_signal(signum)` runs (in the main thread) when the first signal arrives, e.g. to say
    that the command is stopping; `on_abandon(signum)` before a second signal, or a stop
    still unfinished `stop_timeout_s` after the first, exits the process.

    Raises:
        Interrupted: a signal cancelled the coroutine (after it finished unwinding).
        BaseException: whatever the coroutine raised otherwise.
    """
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(make())
    ready = threading.Event()
    received: list[int] = []
    box: dict[str, Any] = {}

    async def main() -> T:
        box["loop"] = asyncio.get_running_loop()
        box["task"] = asyncio.current_task()
        ready.set()
        if received:
            raise asyncio.CancelledError
        return await make()

    def worker() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as e:
            box["error"] = e
        finally:
            ready.set()

    def abandon(signum: int) -> None:
        if on_abandon is not None:
            try:
                on_abandon(signum)
            except BaseException:  # exiting regardless: the resume line is best effort
                pass
        os._exit(128 + received[0])

    def handler(signum: int, _frame: FrameType | None) -> None:
        if received:
            abandon(signum)
        received.append(signum)
        box["signalled_at"] = time.monotonic()
        if on_signal is not None:
            on_signal(signum)
        if ready.is_set() and "loop" in box:
            loop: asyncio.AbstractEventLoop = box["loop"]
            task: asyncio.Task[Any] = box["task"]
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already closed: nothing left to cancel
                pass

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    thread = threading.Thread(target=worker, name="epiflow-main-loop", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            waited = time.monotonic() - box["signalled_at"] if received else 0.0
            if received and waited > SLOW_STOP_S and "dumped" not in box and "loop" in box:
                box["dumped"] = True
                _print_waiting(box["loop"])
            if received and stop_timeout_s is not None and waited > stop_timeout_s:
                abandon(received[0])
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if received and "value" not in box:
        raise Interrupted(received[0]) from box.get("error")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _print_waiting(loop: asyncio.AbstractEventLoop) -> None:
    """Print, from the loop's own thread, the stack of every task still running on it."""

    def dump() -> None:
        lines = [f"still stopping after {SLOW_STOP_S:.0f} s; waiting on these tasks:"]
        for task in asyncio.all_tasks(loop):
            lines.append(f"  {task.get_name()}:")
            lines.extend(f"    {where}" for where in _await_chain(task.get_coro()))
        sys.stderr.write("\n".join(lines) + "\n")

    try:
        loop.call_soon_threadsafe(dump)
    except RuntimeError:  # the loop closed meanwhile: nothing is waiting
        pass


def _await_chain(coro: object) -> list[str]:
    """`file:line in function` for each coroutine (or generator) in an await chain,
    outermost first: where a task is waiting, not only where it started."""
    chain: list[str] = []
    while coro is not None and len(chain) < 50:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            chain.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if coro is not None:
        chain.append(repr(coro))
    return chain
