"""This process's memory as the kernel sees it, and handing freed heap back to it.

- `status_kib`: a field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, …) in KiB, the one
  reader the benchmarks and the trainers share.
- `release_freed_memory`: glibc's `malloc_trim`, which returns the heap the process has
  freed but glibc kept in its arenas; the resident memory before and after, in GiB.

Why it is needed: glibc keeps freed blocks under its mmap threshold in its arenas (one per
thread that allocated), and PyTorch on CPU frees many such blocks of ever-changing sizes
(each rollout's KV cache, each micro-batch's activations). A `bench/loop.py` process held
11.4-11.8 GiB after SFT and 18.4 GiB after GRPO, idle; an RL stage's process grew from
10.4 GiB in its first step to 20.1 GiB in its twelfth and was OOM-killed on a 24 GiB
machine (docs/training.md). The trainers release at a step's end, at most every 60 s
(`training.callbacks.MemoryRelease`), the benchmark before every stage that starts
another process.
"""

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


def release_freed_memory(*, collect: bool = True) -> tuple[float, float] | None:
    """Hands the heap this process has freed back to the kernel (glibc's `malloc_trim`,
    every arena); returns the resident memory before and after, in GiB.

    `collect` first runs Python's garbage collector (objects in reference cycles: a whole
    finished trainer), which costs a fraction of a second in a process with a large Python
    heap; between training steps, where tensors are freed by reference counting, it is
    left out. None where the C library has no `malloc_trim` (not glibc): nothing is done
    beyond the collection."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    before = status_kib("VmRSS") / 2**20
    trim(0)
    return before, status_kib("VmRSS") / 2**20
