"""`core.memory.release_freed_memory`: the heap a finished stage freed goes back to the
kernel (real glibc, real /proc; run in a fresh interpreter so that the test's own heap does
not blur the figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from core.memory import release_freed_memory, status_kib

# 256 MiB in 4 KiB blocks: under glibc's mmap threshold, so they come from the heap, which
# glibc keeps when they are freed; the block allocated after them pins the heap's top.
blocks = [bytes(4096) for _ in range(65536)]
pin = bytes(4096)
held = status_kib("VmRSS")
del blocks
freed = status_kib("VmRSS")
released = release_freed_memory()
print(json.dumps({"held": held, "freed": freed, "released": released, "after": status_kib("VmRSS")}))
"""


def test_the_freed_heap_goes_back_to_the_kernel() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT)], capture_output=True, text=True, check=True
    ).stdout
    figures = json.loads(out)
    mib = 1024  # KiB
    # Freeing alone leaves the memory with the process (glibc keeps it) ...
    assert figures["freed"] > figures["held"] - 64 * mib
    # ... and the release hands at least 200 of the 256 MiB back, and says so in GiB.
    assert figures["after"] < figures["freed"] - 200 * mib
    before, after = figures["released"]
    assert abs(before * 2**20 - figures["freed"]) < 16 * mib
    assert abs(after * 2**20 - figures["after"]) < 16 * mib
