"""A field of a process's `/proc/<pid>/status` (`VmRSS`, `VmHWM`, …), in KiB: the one reader
the benchmarks share."""

from __future__ import annotations

from pathlib import Path

__all__ = ["status_kib"]


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
