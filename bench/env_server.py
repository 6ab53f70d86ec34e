"""Benchmark: `epiflow env serve`'s sessions under load. Prints JSON.

    python bench/env_server.py --json [--sessions 64] [--steps 20]

Serves the built-in `csv_to_json` template (uvicorn in this process, a migrated SQLite
database and a local object store in a temp dir), then opens `--sessions` WebSocket
sessions at once; each resets, sends `--steps - 1` native tool calls (`execute_shell
echo N`) and a final answer, so every session is a stored episode. Reports:

- `errors`: error answers and client exceptions (target 0);
- `jails_left`: jail processes of the server's sandbox state dir after it stopped
  (target 0);
- `step_p50_ms`, `step_p99_ms`: a tool step as the client sees it (send → answer);
- `direct_p50_ms`: the same tool call made directly through a warm sandbox
  (`Sandbox.call_tool`), measured in the same run; `added_ms_p50` = step p50 − direct
  p50 (issue 43's target: ≤ 5 ms);
- `sessions_per_s`: sessions completed (reset → done, stored) per second of wall time;
- `load_start`, `load_end`: the 1-minute load average (the machine is shared).

Not a test: the numbers move with the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMPLATE = "csv_to_json"


def _call(index: int) -> dict[str, Any]:
    """A tool step; each differs (the loop ends an episode repeating one call)."""
    return {"tool": "execute_shell", "arguments": {"command": f"echo {index}"}}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


def _jails(state: Path) -> int:
    count = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            count += str(state).encode() in cmdline
    return count


async def _direct_p50(calls: int) -> float:
    from sandbox import SandboxSettings, SandboxSpec, open_sandbox

    async with await open_sandbox(SandboxSpec(), settings=SandboxSettings()) as box:
        await box.call_tool("execute_shell", {"command": "echo 0"})
        times = []
        for index in range(calls):
            started = time.perf_counter()
            await box.call_tool("execute_shell", {"command": f"echo {index}"})
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _session(url: str, steps: int, latencies: list[float], errors: list[str]) -> None:
    from websockets.asyncio.client import connect

    async def ask(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
        await ws.send(json.dumps(message))
        answer: dict[str, Any] = json.loads(await ws.recv())
        if answer["type"] == "error":
            errors.append(answer["data"]["code"])
        return answer

    try:
        async with connect(url, max_size=None) as ws:
            await ask(ws, {"type": "reset", "data": {"template": TEMPLATE}})
            for index in range(steps - 1):
                started = time.perf_counter()
                await ask(ws, {"type": "step", "data": _call(index)})
                latencies.append((time.perf_counter() - started) * 1000)
            await ask(ws, {"type": "step", "data": {"final": "done"}})
    except Exception as e:  # a client failure is counted, not fatal to the bench
        errors.append(f"{type(e).__name__}: {e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="epiflow-env-bench-"))
    state = work / "jails"
    state.mkdir()
    work.chmod(0o755)
    state.chmod(0o755)
    os.environ.update(
        EPIFLOW_HOME=str(work / "home"),
        EPIFLOW_DATABASE_URL=f"sqlite:///{work / 'bench.db'}",
        EPIFLOW_OBJECTS_URL=str(work / "objects"),
        EPIFLOW_SANDBOX_STATE_DIR=str(state),
        EPIFLOW_SANDBOX_POOL_MAX_SIZE=str(args.sessions),
    )
    from config.settings import load_settings
    from environment.hub import HubConfig
    from environment.server import serve
    from storage import migrate
    from storage.db import make_engine

    load_start = os.getloadavg()[0]
    settings = load_settings()
    engine = make_engine(settings.database)
    migrate.upgrade(engine)
    config = HubConfig(
        run_key="bench", templates=[TEMPLATE], max_sessions=args.sessions, idle_timeout_s=600
    )
    servers: list[Any] = []
    thread = threading.Thread(
        target=asyncio.run,
        args=(
            serve(config, settings, host="127.0.0.1", port=0, engine=engine, ready=servers.append),
        ),
        daemon=True,
    )
    thread.start()
    while not (servers and servers[0].started):
        if not thread.is_alive():
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    server = servers[0]
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"ws://127.0.0.1:{port}/ws"

    latencies: list[float] = []
    errors: list[str] = []

    async def drive() -> float:
        started = time.perf_counter()
        await asyncio.gather(
            *(_session(url, args.steps, latencies, errors) for _ in range(args.sessions))
        )
        return time.perf_counter() - started

    wall = asyncio.run(drive())
    direct = asyncio.run(_direct_p50(200))
    server.should_exit = True
    thread.join()
    engine.dispose()
    step_p50 = _percentile(latencies, 0.5)
    report = {
        "sessions": args.sessions,
        "steps": args.steps,
        "errors": len(errors),
        "error_codes": sorted(set(errors))[:10],
        "jails_left": _jails(state),
        "step_p50_ms": step_p50,
        "step_p99_ms": _percentile(latencies, 0.99),
        "direct_p50_ms": round(direct, 3),
        "added_ms_p50": round(step_p50 - direct, 3),
        "sessions_per_s": round(args.sessions / wall, 3),
        "wall_s": round(wall, 3),
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
    }
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
