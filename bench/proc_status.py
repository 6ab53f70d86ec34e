"""This process's memory as the kernel sees it: a field of `/proc/<pid>/status` (`VmRSS`,
`VmHWM`, …) in KiB, the one reader the benchmarks share, and `release_freed_memory`, which
hands the heap a finished stage freed back to the kernel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["release_freed_memory", "status_kib"]


def status_kib(field: str, pid: int | str | None = "self") -> int:
    """`field` of `/proc/<pid>/status` in KiB; 0 for no pid, a process gone, or no such
    field (a kernel without /proc)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def release_freed_memory() -> tuple[float, float] | None:
    """Collects garbage and hands the heap that is free back to the kernel (glibc's
    `malloc_trim`); returns this process's resident memory before and after, in GiB.

    glibc keeps what a finished stage freed (trainer, optimiser, tensors) in its arenas:
    a `bench/loop.py` process held 11.4-11.8 GiB after SFT and 18.4 GiB after GRPO, idle,
    while the next stage's process (an RL child, `transformers serve`) needed the memory;
    the OOM killer then chose the idle holder, or the page cache went and the evaluation
    ran at a fifth of its speed (docs/training.md). None where the C library has no
    `malloc_trim` (not glibc): nothing is done beyond the collection."""
    import ctypes
    import gc

    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    before = status_kib("VmRSS") / 2**20
    trim(0)
    return before, status_kib("VmRSS") / 2**20
