"""How many intra-op threads the trainer uses: every core on an idle machine, fewer on a busy one.

torch's CPU kernels split each operation across OpenMP threads that meet at a barrier
after every op. When other processes keep the cores busy, one of our threads is always
waiting for a descheduled sibling: on the shared 2-core machine two threads trained
several times slower than one (docs/training.md, "Throughput"). `choose_threads` reads
the 1-minute load average, subtracts what this process contributes, and leaves the
remaining busy cores alone; `ThreadTuner` repeats that during training. Generation is
hit hardest: greedy decoding of a small model on a loaded 2-core machine ran at ~5 new
tokens/s on two threads and ~70 on one, so evaluation runs under `tuned_threads` too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ThreadTuner", "available_cores", "choose_threads", "tuned_threads"]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def choose_threads(setting: int, *, own_threads: int = 1) -> int:
    """`setting` when > 0; else the cores not kept busy by other processes (at least 1).

    `own_threads` is how many runnable threads this process adds to the load average now
    (1 before training, the trainer's thread count during it).
    """
    if setting > 0:
        return setting
    cores = available_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cores
    # A load of 0.4 from others is a core mostly free; 0.6 is one mostly taken.
    busy = math.floor(max(0.0, load - own_threads) + 0.5)
    return max(1, min(cores, cores - busy))


class ThreadTuner:
    """Re-chooses the thread count every `interval_s` seconds while training runs."""

    def __init__(self, setting: int, *, interval_s: float = 30.0) -> None:
        self.setting = setting
        self.interval_s = interval_s
        self._previous: int | None = None
        self._checked = 0.0
        self.history: list[int] = []
        """Thread counts chosen, in order (the first is the one training started with)."""

    def start(self) -> int:
        """Remember the caller's thread count and set the first choice; returns it."""
        import torch

        self._previous = torch.get_num_threads()
        return self._apply(choose_threads(self.setting, own_threads=1))

    def maybe_retune(self) -> None:
        """Re-read the load (automatic mode only, at most every `interval_s`)."""
        if self.setting > 0:
            return
        now = time.monotonic()
        if now - self._checked < self.interval_s:
            return
        import torch

        current = torch.get_num_threads()
        chosen = choose_threads(0, own_threads=current)
        if chosen != current:
            self._apply(chosen)
        self._checked = now

    def stop(self) -> None:
        """Give the caller its thread count back."""
        import torch

        if self._previous is not None:
            torch.set_num_threads(self._previous)
            self._previous = None

    def _apply(self, threads: int) -> int:
        import torch

        torch.set_num_threads(threads)
        self._checked = time.monotonic()
        self.history.append(threads)
        return threads


@contextmanager
def tuned_threads(setting: int = 0) -> Iterator[int]:
    """Run the block with `choose_threads(setting)` intra-op threads, then restore the count.

    torch's thread count is process-wide: it also applies to work run in other threads
    (the `hf:` policy generates in `asyncio.to_thread` workers).
    """
    import torch

    previous = torch.get_num_threads()
    chosen = choose_threads(setting, own_threads=1)
    torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        torch.set_num_threads(previous)
