"""Benchmark: what the platform adds to a collection, over a floor that does the same calls.

    python bench/collect_throughput.py --json [--tasks 4] [--concurrency 8] [--cold-server]

The same episodes (scripted oracle over every template of the built-in suite) run twice
at the same concurrency:

- `full_s`: the `collect-episodes` Prefect flow: one nsjail per episode, the in-jail
  executor, the verifier in the jail, objects and rows written (SQLite + a local object
  directory), Prefect tasks and artifacts. A Prefect server is started beforehand (as in
  production, where one is always running) and, unless `--cold-server`, has served one
  small flow run from another process (a fresh server's first requests pay its lazy
  start-up, ~0.5 s here, which a long-running server paid long ago); neither is timed.
  This process's own first-flow costs (Prefect's lazy imports, clients) are timed. Every
  request each jail is sent (population, tool calls, the verifier, exports) is recorded
  with its answer's outcome.
- `baseline_s` (the floor): those recorded requests replayed, per episode, by the same
  in-jail executor code started directly on the host in a temporary workspace
  (`bench/collect_floor.py`, a small separate `-I -S` process, same interpreter, same
  concurrency): no nsjail, no policy, no Prefect, no SQL, no objects. The platform does
  all of that work and more, so `overhead_ratio` ≥ 1 up to measurement noise, and it
  says what the platform adds. `floor_mismatched` counts replayed answers whose outcome
  (`ok`, `exit_code`, `timed_out`) differs from the jail's (0: the floor did the same).

`overhead_ratio = full_s / baseline_s`; targets ≤ 1.3 at 52 episodes (`--tasks 4`) and
≤ 1.1 at 1,000 (issue 26). `episodes_window_s` is the span from the first episode's start
to the last one's end (sandboxes, policy, verifiers, and the groups persisted meanwhile):
`full_s` minus it is the flow's fixed cost (flow and task runs, planning, the run row, the
last group, the summary and artifacts). Both phases are CPU-bound on a 2-core machine, so
the ratio moves with the load average (printed at start and end): on a machine shared
with other jobs the two phases, run one after the other, meet different loads, and the
wall-clock ratio can fall on either side of 1.

So the CPU each phase took is printed too, which other jobs change far less:
`full_cpu_s` (this process from the flow's start to its end, with every jail it started
and reaped, and the Prefect server's CPU over the same span: its total when the harness
stops it, less what it had used when the timing began) and `baseline_cpu_s` (the floor
process and every executor it reaped, less its own start and reading of the recording).
`cpu_ratio = full_cpu_s / baseline_cpu_s` (≥ 1 by construction, as the wall-clock one),
and `cpu_added_ms_per_episode`: what the platform spends per episode on top of the
floor. Where those milliseconds go (nsjail, the jails' own extra, the collector, the
server) is measured in docs/architecture.md, "Where a collection's CPU goes".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="epiflow-bench-prefect-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from agent.trajectory import ParseKind, Trajectory

if TYPE_CHECKING:
    from collection.request import CollectResult


class Recorder:
    """Every request each episode jail of the full run is sent, with its answer's outcome,
    and the executor's configuration: what the floor replays (`bench/collect_floor.py`)."""

    def __init__(self) -> None:
        self.by_jail: dict[object, list[dict[str, Any]]] = {}
        self.config: dict[str, Any] | None = None

    def install(self) -> None:
        import sandbox.factory
        from sandbox.jail import Jail
        from sandbox.nsjail import executor_argv

        recorder = self
        request = Jail.request

        async def recorded(
            jail: Jail, payload: dict[str, Any], *, timeout_s: float
        ) -> dict[str, Any]:
            answer = await request(jail, payload, timeout_s=timeout_s)
            outcome = {k: answer.get(k) for k in ("ok", "exit_code", "timed_out")}
            recorder.by_jail.setdefault(jail, []).append({"payload": payload, "outcome": outcome})
            return answer

        def argv(*args: Any, **kwargs: Any) -> list[str]:
            built = executor_argv(*args, **kwargs)
            recorder.config = json.loads(built[-1])
            return built

        Jail.request = recorded  # type: ignore[method-assign, assignment]
        vars(sandbox.factory)["executor_argv"] = argv  # the name the factory calls

    def episodes(self) -> list[list[dict[str, Any]]]:
        # Pool probes (`ping`) and warm jails never used are not episodes.
        return [r for r in self.by_jail.values() if any(x["payload"]["op"] != "ping" for x in r)]


def _rusage_s(who: int) -> float:
    """User + system CPU seconds of this process (`RUSAGE_SELF`) or of its reaped
    children (`RUSAGE_CHILDREN`, with everything they reaped)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _live_children_cpu_s() -> float:
    """CPU seconds so far of this process's live children and what they reaped (the
    Prefect server, once warmed): subtracted, since `RUSAGE_CHILDREN` counts all of a
    child's CPU when it is reaped, also what it spent before the timing started."""
    me = os.getpid()
    total = 0.0
    for task in Path(f"/proc/{me}/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
                    # utime, stime, cutime, cstime (fields 14-17 of proc_pid_stat(5))
                    total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def floor(recorder: Recorder, concurrency: int, work: Path) -> dict[str, Any]:
    """The recorded requests replayed by the in-jail executor on the host, in a small
    separate process (`bench/collect_floor.py`)."""
    from config.settings import load_settings
    from sandbox.host import compile_executor

    settings = load_settings().sandbox
    assert recorder.config is not None, "the full run started no jail"
    recording = work / "recording.json"
    recording.write_text(
        json.dumps(
            {
                "python": settings.python_path,
                "executor": str(compile_executor(settings)),
                "config": recorder.config,
                "concurrency": concurrency,
                "episodes": recorder.episodes(),
            }
        )
    )
    script = Path(__file__).resolve().with_name("collect_floor.py")
    children_before = _rusage_s(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(script), str(recording)],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    # The floor process and every executor it started and reaped, less the floor
    # process's own start and reading of the recording.
    result["cpu_s"] = (
        _rusage_s(resource.RUSAGE_CHILDREN) - children_before - float(result["setup_cpu_s"])
    )
    return result


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
    starts = [t.started_at for t in trajectories if t.started_at is not None]
    if not ends or not starts:
        return 0.0
    return (max(ends) - min(starts)).total_seconds()


def collect_timed(
    work: Path, *, tasks: int, concurrency: int, warm: bool = True
) -> tuple[CollectResult, float, float, list[Trajectory]]:
    """The `collect-episodes` flow over the built-in suite with the scripted oracle, into a
    SQLite database and object directory under `work`, on a Prefect test server (warmed
    from another process with `warm`; not timed); returns its result, its wall time, the
    CPU seconds it took (this process, its jails, the server's share) and the
    trajectories it stored."""
    os.environ["EPIFLOW_DATABASE_URL"] = f"sqlite:///{work / 'bench.db'}"
    os.environ["EPIFLOW_OBJECTS_URL"] = str(work / "objects")

    from prefect.settings import PREFECT_API_URL
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
    with prefect_test_harness(server_startup_timeout=120):
        if warm:
            warm_server(str(PREFECT_API_URL.value()))
        cpu_before = (
            _rusage_s(resource.RUSAGE_SELF)
            + _rusage_s(resource.RUSAGE_CHILDREN)
            + _live_children_cpu_s()
        )
        started = time.perf_counter()
        result = asyncio.run(
            collect_episodes(
                request=CollectRequest(
                    suite="builtin",
                    policy="scripted:oracle",
                    tasks=tasks,
                    rollouts=1,
                    concurrency=concurrency,
                    run_key="bench",
                )
            )
        )
        full_s = time.perf_counter() - started
        self_cpu = _rusage_s(resource.RUSAGE_SELF)
    # The server is reaped when the harness stops: its CPU is in RUSAGE_CHILDREN now.
    cpu_s = self_cpu + _rusage_s(resource.RUSAGE_CHILDREN) - cpu_before
    store = make_object_store(settings.objects)
    trajectories = run_trajectories(engine, store, resolve_run(engine, "bench"))
    engine.dispose()
    return result, full_s, cpu_s, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="instances per template")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--cold-server",
        action="store_true",
        help="time the flow on a server that has served no request yet",
    )
    parser.add_argument(
        "--keep-recording", type=Path, help="also write the floor's recording to this file"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()

    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-collect-"))
    recorder = Recorder()
    recorder.install()
    result, full_s, full_cpu_s, trajectories = collect_timed(
        work, tasks=args.tasks, concurrency=args.concurrency, warm=not args.cold_server
    )
    calls = sum(
        1 for t in trajectories for s in t.steps if s.parse_kind == ParseKind.TOOL_CALL and s.tool
    )
    replayed = floor(recorder, args.concurrency, work)
    if args.keep_recording is not None:
        shutil.copyfile(work / "recording.json", args.keep_recording)
    baseline_s = float(replayed["floor_s"])
    shutil.rmtree(work, ignore_errors=True)
    window_s = episodes_window(trajectories)
    out = {
        "episodes": result.episodes,
        "steps": result.steps,
        "tool_calls": calls,
        "floor_episodes": replayed["episodes"],
        "floor_requests": replayed["requests"],
        "floor_mismatched": replayed["mismatched"],
        "concurrency": args.concurrency,
        "success_rate": result.success_rate,
        "baseline_s": round(baseline_s, 3),
        "full_s": round(full_s, 3),
        "episodes_window_s": round(window_s, 3),
        "fixed_s": round(full_s - window_s, 3),
        "overhead_ratio": round(full_s / baseline_s, 3),
        "episodes_ratio": round(window_s / baseline_s, 3),
        "steps_per_s": round(result.steps / full_s, 1),
        "baseline_cpu_s": round(replayed["cpu_s"], 3),
        "full_cpu_s": round(full_cpu_s, 3),
        "cpu_ratio": round(full_cpu_s / replayed["cpu_s"], 3),
        "cpu_added_ms_per_episode": round(
            1000 * (full_cpu_s - replayed["cpu_s"]) / max(result.episodes, 1), 1
        ),
        "server_warmed": not args.cold_server,
        "target_overhead_ratio": 1.3,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
