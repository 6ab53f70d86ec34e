"""Sandbox overhead: cold jail start, warm tool call, idle jails held at once. Prints JSON.

    python bench/sandbox_overhead.py --json

Targets (issue 3, 2-core machine): warm_call_p50_ms <= 2 * subprocess_p50_ms + 1,
warm_call_p99_ms <= 20, cold_jail_p50_ms <= 25, max_idle_jails >= 256.
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandbox import (
    NsjailSandbox,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    WarmPool,
    open_sandbox,
)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index], 3)


def rss_kib(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def host_subprocess_ms(n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", "true"], check=True)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def cold_jail_ms(spec: SandboxSpec, settings: SandboxSettings, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        box = await open_sandbox(spec, settings=settings)
        samples.append((time.perf_counter() - start) * 1000)
        await box.close()
    return samples


async def warm_call_ms(spec: SandboxSpec, settings: SandboxSettings, n: int) -> list[float]:
    samples = []
    async with await open_sandbox(spec, settings=settings) as box:
        for _ in range(20):  # warm the executor's and the page cache's paths
            await box.call_tool("execute_shell", {"command": "true"})
        for _ in range(n):
            start = time.perf_counter()
            result = await box.call_tool("execute_shell", {"command": "true"})
            samples.append((time.perf_counter() - start) * 1000)
            assert result.ok, result
    return samples


async def pool_acquire_ms(
    spec: SandboxSpec, settings: SandboxSettings, n: int
) -> tuple[list[float], int]:
    """Acquire latency from a warm pool of 4 (an episode's wait when the pool keeps up)."""
    samples = []
    async with WarmPool(spec, size=4, settings=settings) as pool:
        for _ in range(n):
            await pool.wait_idle(1)  # not timed: the background refill catching up
            start = time.perf_counter()
            box = await pool.acquire(files={"task.txt": "x"})
            samples.append((time.perf_counter() - start) * 1000)
            await box.close()
        return samples, pool.misses


async def idle_jails(
    spec: SandboxSpec, settings: SandboxSettings, limit: int, batch: int
) -> dict[str, Any]:
    boxes: list[NsjailSandbox] = []
    failure = None
    try:
        while len(boxes) < limit and failure is None:
            size = min(batch, limit - len(boxes))
            started = await asyncio.gather(
                *(open_sandbox(spec, settings=settings) for _ in range(size)),
                return_exceptions=True,
            )
            for item in started:
                if isinstance(item, NsjailSandbox):
                    boxes.append(item)
                elif isinstance(item, BaseException):
                    failure = f"{type(item).__name__}: {item}"
        # Every jail held must still answer: a jail that cannot is not "held without failure".
        answers = await asyncio.gather(*(b.exec(["true"]) for b in boxes), return_exceptions=True)
        alive = sum(1 for a in answers if not isinstance(a, BaseException) and a.exit_code == 0)
        rss = [rss_kib(b.jail.nsjail_pid) + rss_kib(b.jail.executor_pid) for b in boxes]
        return {
            "max_idle_jails": alive,
            "rss_per_idle_jail_mib": round(statistics.mean(rss) / 1024, 2) if rss else None,
            "idle_jails_tried": limit,
            "idle_jail_failure": failure,
        }
    finally:
        for i in range(0, len(boxes), 32):
            await asyncio.gather(*(b.close() for b in boxes[i : i + 32]), return_exceptions=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = SandboxSettings()
    spec = SandboxSpec()
    subprocess_samples = host_subprocess_ms(args.calls)
    cold = await cold_jail_ms(spec, settings, args.cold)
    warm = await warm_call_ms(spec, settings, args.calls)
    pooled, misses = await pool_acquire_ms(spec, settings, args.cold)
    probe = await open_sandbox(spec, settings=settings)
    limit_mode = probe.limit_mode
    await probe.close()
    idle = await idle_jails(spec, settings, args.max_jails, args.batch)
    subprocess_p50 = percentile(subprocess_samples, 50)
    result = {
        "subprocess_p50_ms": subprocess_p50,
        "cold_jail_p50_ms": percentile(cold, 50),
        "cold_jail_p99_ms": percentile(cold, 99),
        "warm_call_p50_ms": percentile(warm, 50),
        "warm_call_p99_ms": percentile(warm, 99),
        "pool_acquire_p50_ms": percentile(pooled, 50),
        "pool_acquire_p99_ms": percentile(pooled, 99),
        "pool_misses": misses,
        **idle,
        "limit_mode": limit_mode,
        "samples": {"subprocess": len(subprocess_samples), "cold": len(cold), "warm": len(warm)},
    }
    result["targets_met"] = {
        "warm_call_p50": result["warm_call_p50_ms"] <= 2 * subprocess_p50 + 1,
        "warm_call_p99": result["warm_call_p99_ms"] <= 20,
        "cold_jail_p50": result["cold_jail_p50_ms"] <= 25,
        "max_idle_jails": result["max_idle_jails"] >= 256,
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON only (the default output anyway)"
    )
    parser.add_argument(
        "--calls", type=int, default=500, help="warm calls and host subprocesses to time"
    )
    parser.add_argument("--cold", type=int, default=100, help="cold jails to time")
    parser.add_argument(
        "--max-jails", type=int, default=300, help="idle jails to try to hold at once"
    )
    parser.add_argument(
        "--batch", type=int, default=8, help="jails started concurrently while filling"
    )
    args = parser.parse_args()
    # Each idle jail holds three pipes on the host side.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    try:
        result = asyncio.run(run(args))
    except SandboxError as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
