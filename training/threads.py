"""How many intra-op threads the trainer uses: every core on an idle machine, fewer on a busy one.

torch's CPU kernels split each operation across OpenMP threads that meet at a barrier
after every op. When other processes keep the cores busy, one of our threads is always
waiting for a descheduled sibling: on the shared 2-core machine two threads trained
several times slower than one (docs/training.md, "Throughput"). `choose_threads` reads
the 1-minute load average, subtracts what this process contributes, checks a busy core
against the CPU time others used in the last half second (`others_busy_now`), and leaves
the remaining busy cores alone; `ThreadTuner` repeats that during training. Generation is
hit hardest: greedy decoding of a small model on a loaded 2-core machine ran at ~5 new
tokens/s on two threads and ~70 on one, so evaluation runs under `tuned_threads` too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "SAMPLE_S",
    "ThreadTuner",
    "available_cores",
    "choose_threads",
    "others_busy_now",
    "tuned_threads",
]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


SAMPLE_S = 0.5
"""How long `others_busy_now` watches the CPU counters."""


def _busy_ticks() -> tuple[int, int]:
    """(busy clock ticks of the whole machine, CPU ticks of this process) so far."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    # cpu user nice system idle iowait irq softirq steal ...
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    with open("/proc/self/stat", encoding="ascii") as f:
        own = f.read().rsplit(")", 1)[1].split()
    # after the command: state is field 3, utime and stime fields 14 and 15
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


def others_busy_now(window_s: float = SAMPLE_S) -> float | None:
    """Cores other processes kept busy over the last `window_s` seconds (this process's
    own CPU time taken out; its children count as others), None where /proc cannot be
    read. Unlike the load average it does not remember work that ended a minute ago."""
    try:
        busy0, own0 = _busy_ticks()
        time.sleep(window_s)
        busy1, own1 = _busy_ticks()
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK") * window_s
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / ticks


def choose_threads(setting: int, *, own_threads: int = 1) -> int:
    """`setting` when > 0; else the cores not kept busy by other processes (at least 1).

    Busy cores are read from the 1-minute load average (less `own_threads`: how many
    runnable threads this process adds to it now, 1 before training, the trainer's
    thread count during it) and from the CPU time others used in the last
    `SAMPLE_S` seconds (`others_busy_now`); the smaller count wins. The load average
    alone remembers work that ended up to a minute ago (the evaluation just before a
    GRPO stage), and a thread count chosen from it is kept until the next retune.
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
    if busy > 0:
        now = others_busy_now()
        if now is not None:
            busy = min(busy, math.floor(now + 0.5))
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
