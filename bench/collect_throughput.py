"""Benchmark: collection overhead, nsjail + persistence + Prefect vs plain subprocess.

    python bench/collect_throughput.py --json [--tasks 4] [--concurrency 8] [--cold-server]

The same episodes (scripted oracle over every template of the built-in suite) run twice
at the same concurrency:

- `full_s`: the `collect-episodes` Prefect flow: one nsjail per episode, the in-jail
  executor, the verifier in the jail, objects and rows written (SQLite + a local object
  directory), Prefect tasks and artifacts. A Prefect server is started beforehand (as in
  production, where one is always running) and, unless `--cold-server`, has served one
  small flow run from another process (a fresh server's first requests pay its lazy
  start-up, ~0.5 s here, which a long-running server paid long ago); neither is timed.
  This process's own first-flow costs (Prefect's lazy imports, clients) are timed.
- `baseline_s`: the tool calls the full run recorded, executed on the host with plain
  subprocess / file I/O in a temp copy of each workspace: no jail, no verifier, no
  Prefect, no database.

`overhead_ratio = full_s / baseline_s`; target ≤ 1.3 at concurrency 8 (issue 16).
`episodes_window_s` is the span from the first episode's start to the last one's end
(sandboxes, policy, verifiers, and the groups persisted meanwhile): `full_s` minus it is
the flow's fixed cost (flow and task runs, planning, the run row, the last group, the
summary and artifacts). Both phases are CPU-bound on a 2-core machine, so the ratio moves
with the load average (printed at start and end): other processes slow the baseline's
process starts more than the collection's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="epiflow-bench-prefect-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from agent.trajectory import ParseKind, Trajectory
from suites.registry import load_suite


def _host_path(root: Path, path: str) -> Path:
    rel = path[len("/workspace") :].lstrip("/") if path.startswith("/workspace") else path
    return root / rel


async def _baseline_episode(t: Trajectory, files: dict[str, str], sem: asyncio.Semaphore) -> int:
    async with sem:
        root = Path(tempfile.mkdtemp(prefix="epiflow-bench-ws-"))
        try:
            for rel, content in files.items():
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
            calls = 0
            for s in t.steps:
                if s.parse_kind != ParseKind.TOOL_CALL or not s.tool or s.args is None:
                    continue
                calls += 1
                if s.tool == "execute_shell":
                    command = str(s.args["command"]).replace("/workspace", str(root))
                    proc = await asyncio.create_subprocess_shell(
                        command,
                        cwd=root,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                    )
                    await proc.communicate()
                elif s.tool == "read_file":
                    path = _host_path(root, str(s.args["path"]))
                    if path.is_file():
                        path.read_bytes()
                elif s.tool == "write_file":
                    path = _host_path(root, str(s.args["path"]))
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(str(s.args["content"]))
                elif s.tool == "list_dir":
                    path = _host_path(root, str(s.args["path"]))
                    if path.is_dir():
                        sorted(p.name for p in path.iterdir())
            return calls
        finally:
            shutil.rmtree(root, ignore_errors=True)


async def baseline(trajectories: list[Trajectory], concurrency: int) -> tuple[float, int]:
    suite = load_suite("builtin")
    files = {t.episode_id: suite.generate(t.template, t.instance_seed).files for t in trajectories}
    sem = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    calls = await asyncio.gather(
        *(_baseline_episode(t, files[t.episode_id], sem) for t in trajectories)
    )
    return time.perf_counter() - started, sum(calls)


WARM_UP = """
import asyncio
from prefect import flow, task
from prefect.artifacts import acreate_markdown_artifact

@task(name="warm-up-task")
async def step() -> int:
    await acreate_markdown_artifact(markdown="warm-up", key="warm-up")
    return 1

@flow(name="warm-up")
async def warm_up() -> int:
    return await step()

asyncio.run(warm_up())
"""


def warm_server(api_url: str) -> None:
    """One small flow run (a task, an artifact) from another process, so the server is
    past its first requests, like one that has been running."""
    env = {**os.environ, "PREFECT_API_URL": api_url}
    subprocess.run(
        [sys.executable, "-c", WARM_UP], env=env, check=True, capture_output=True, timeout=300
    )


def episodes_window(trajectories: list[Trajectory]) -> float:
    """Seconds from the first episode's start to the last episode's end."""
    ends = [t.ended_at for t in trajectories if t.ended_at is not None]
    if not ends:
        return 0.0
    return (max(ends) - min(t.started_at for t in trajectories)).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="instances per template")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--cold-server",
        action="store_true",
        help="time the flow on a server that has served no request yet",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()

    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-collect-"))
    os.environ["EPIFLOW_DATABASE_URL"] = f"sqlite:///{work / 'bench.db'}"
    os.environ["EPIFLOW_OBJECTS_URL"] = str(work / "objects")

    from prefect.testing.utilities import prefect_test_harness

    from collection.request import CollectRequest
    from config.settings import load_settings
    from flows.collect import collect_episodes
    from storage import migrate
    from storage.db import make_engine
    from storage.objects import make_object_store
    from storage.run_reads import resolve_run, run_trajectories

    settings = load_settings()
    engine = make_engine(settings.database)
    migrate.upgrade(engine)
    from prefect.settings import PREFECT_API_URL

    with prefect_test_harness(server_startup_timeout=120):
        if not args.cold_server:
            warm_server(str(PREFECT_API_URL.value()))
        started = time.perf_counter()
        result = asyncio.run(
            collect_episodes(
                request=CollectRequest(
                    suite="builtin",
                    policy="scripted:oracle",
                    tasks=args.tasks,
                    rollouts=1,
                    concurrency=args.concurrency,
                    run_key="bench",
                )
            )
        )
        full_s = time.perf_counter() - started
    store = make_object_store(settings.objects)
    trajectories = run_trajectories(engine, store, resolve_run(engine, "bench"))
    engine.dispose()
    baseline_s, calls = asyncio.run(baseline(trajectories, args.concurrency))
    shutil.rmtree(work, ignore_errors=True)
    window_s = episodes_window(trajectories)
    out = {
        "episodes": result.episodes,
        "steps": result.steps,
        "tool_calls": calls,
        "concurrency": args.concurrency,
        "success_rate": result.success_rate,
        "baseline_s": round(baseline_s, 3),
        "full_s": round(full_s, 3),
        "episodes_window_s": round(window_s, 3),
        "fixed_s": round(full_s - window_s, 3),
        "overhead_ratio": round(full_s / baseline_s, 3),
        "episodes_ratio": round(window_s / baseline_s, 3),
        "steps_per_s": round(result.steps / full_s, 1),
        "server_warmed": not args.cold_server,
        "target_overhead_ratio": 1.3,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
