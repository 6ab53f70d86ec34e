"""Benchmark: a 10,000-episode collection, its memory, and its resume after a SIGKILL.

    python bench/collect_scale.py --json [--episodes 10000] [--kill-at 5000]
                                  [--databases sqlite,postgresql] [--concurrency 8]

For each database (a SQLite file; a throwaway PostgreSQL cluster started as the tests
start theirs), the scripted oracle collects `--episodes` episodes over every template of
the built-in suite (seed by seed across templates, so every stretch of the run does
the same mix of work) through `collection.runner` (no Prefect: the flow adds a fixed cost
per run, not per episode; `bench/collect_throughput.py` measures it), objects in a local
directory. The collector runs as a child process, twice:

1. It runs the plan, reporting after every persisted group (episodes stored, its RSS and
   peak RSS from /proc) on a pipe. Once `--kill-at` episodes are stored the parent
   SIGKILLs it: episodes in flight and waiting for storage are lost.
2. The same command with the same run key resumes: it must find exactly the episodes
   not stored and run only those.

Checked afterwards, from SQL: `--episodes` episodes, no duplicate, every planned id
present, steps rows equal to the episodes' step counts, the resumed process ran exactly
the rest, no orphaned object, and no process of the killed collector's jails left.

Printed (JSON only on stdout), per database: `episodes_per_s` (episodes run / seconds
running them, both processes; process start and planning excluded), the same over the
first and the last 1,000 episodes with the CPU per episode of the collector and of its
jails and the mean load average (the baseline: a store or a collector that slows as it
grows shows as more CPU per episode; a busier machine as a higher load), RSS at 1k episodes stored (first process) and at the end (second
process, all episodes stored), `rss_growth_1k_to_end` (target < 0.2), each process's
growth from its first 1,000 episodes to its last report, peak RSS, the plan's own
memory (RSS before and after planning: the plan's task instances are held for the
whole run), and the load average at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.memory import status_kib

RUN_KEY = "scale"
TARGET_RSS_GROWTH = 0.2
WINDOW = 1000
"""Episodes of the first and last windows (rates, RSS at 1k); `--window` for quick runs."""


# ---------------------------------------------------------------- the collector (child)


def child(args: argparse.Namespace) -> None:
    """Collect the plan (resuming what is stored), one JSON report per line on fd 3."""
    report_fd = int(args.report_fd)

    def emit(**fields: Any) -> None:
        own, jails = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        fields["t"] = time.monotonic()
        fields["rss_kib"] = status_kib("VmRSS")
        fields["hwm_kib"] = status_kib("VmHWM")
        fields["cpu_self_s"] = own.ru_utime + own.ru_stime
        # nsjail processes the collector reaped, with what ran in their jails
        fields["cpu_children_s"] = jails.ru_utime + jails.ru_stime
        fields["load1"] = os.getloadavg()[0]
        os.write(report_fd, (json.dumps(fields) + "\n").encode())

    from collection.lifecycle import Collection, Executed, open_collection, plan_request
    from collection.plan import Plan, PlannedEpisode, Shard
    from collection.runner import PersistedGroup, stream_work
    from config.settings import Settings, load_settings
    from storage.db import make_engine
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings

    settings = load_settings()
    request = bench_request(args.episodes, args.concurrency, args.batch_size)
    emit(event="imported")

    def bench_plan(request: Any, settings: Settings, shard: Shard | None) -> Plan:
        plan = plan_request(request, settings, shard)
        return dataclasses.replace(
            plan, episodes=bench_episodes(plan, args.episodes), total=args.episodes
        )

    engine = make_engine(DatabaseSettings(url=args.database_url))
    stored = 0

    def on_persisted(group: PersistedGroup) -> None:
        nonlocal stored
        stored += len(group.written.inserted)
        emit(event="group", stored=stored, inserted=len(group.written.inserted))

    async def run() -> int:
        nonlocal stored
        async with open_collection(
            request,
            settings,
            engine=engine,
            store=LocalObjectStore(Path(args.objects)),
            planner=bench_plan,
        ) as collection:
            emit(event="planned", planned=len(collection.plan.episodes))

            async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
                nonlocal stored
                stored = len(collection.plan.episodes) - len(todo)
                emit(event="start", todo=len(todo), stored=stored)
                return await stream_work(on_persisted=on_persisted)(collection, todo)

            return (await collection.run(work)).executed

    executed = asyncio.run(run())
    emit(event="done", stored=stored, executed=executed)


def bench_episodes(plan: Any, episodes: int) -> list[Any]:
    """The first `episodes` of the plan taken seed by seed across templates (a plan lists
    them template by template): every window of the run mixes every template, so the
    first and the last 1,000 episodes do the same kind of work."""
    ordered = sorted(plan.episodes, key=lambda p: (p.task.seed, p.task.template, p.rollout_index))
    return ordered[:episodes]


def bench_request(episodes: int, concurrency: int, batch_size: int) -> Any:
    """The request whose first `episodes` planned episodes the benchmark runs."""
    from collection.request import CollectRequest
    from suites.builtin import builtin_suite

    templates = len(builtin_suite().templates)
    return CollectRequest(
        suite="builtin",
        policy="scripted:oracle",
        tasks=math.ceil(episodes / templates),
        rollouts=1,
        concurrency=concurrency,
        batch_size=batch_size,
        run_key=RUN_KEY,
    )


# ---------------------------------------------------------------- the parent


@dataclasses.dataclass
class Phase:
    """One collector process: its reports, and whether it was killed."""

    reports: list[dict[str, Any]]
    killed: bool
    returncode: int
    jail_pids: list[int]
    stderr_tail: str

    def first(self, event: str) -> dict[str, Any]:
        return next(r for r in self.reports if r["event"] == event)

    @property
    def groups(self) -> list[dict[str, Any]]:
        return [r for r in self.reports if r["event"] == "group"]


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (its nsjail processes)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _descendants(pids: list[int]) -> list[int]:
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += _children(pid)
    return out


def run_collector(
    args: argparse.Namespace, database_url: str, objects: Path, *, kill_at: int | None
) -> Phase:
    read_fd, write_fd = os.pipe()
    command = [
        sys.executable,
        __file__,
        "--child",
        "--database-url",
        database_url,
        "--objects",
        str(objects),
        "--episodes",
        str(args.episodes),
        "--concurrency",
        str(args.concurrency),
        "--batch-size",
        str(args.batch_size),
        "--report-fd",
        str(write_fd),
    ]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(write_fd,)
        )
        os.close(write_fd)
        reports: list[dict[str, Any]] = []
        killed = False
        jail_pids: list[int] = []
        next_note = WINDOW
        with os.fdopen(read_fd) as lines:
            for line in lines:
                report = json.loads(line)
                reports.append(report)
                stored = int(report.get("stored", 0))
                if stored >= next_note:
                    print(f"  {stored} episodes stored", file=sys.stderr, flush=True)
                    next_note = (stored // WINDOW + 1) * WINDOW
                if kill_at is not None and not killed and stored >= kill_at:
                    jail_pids = _descendants(_children(proc.pid))
                    proc.send_signal(signal.SIGKILL)
                    killed = True
        returncode = proc.wait()
        err.seek(0)
        stderr_tail = err.read()[-4000:].decode(errors="replace")
    return Phase(reports, killed, returncode, jail_pids, stderr_tail)


def _rate(groups: list[dict[str, Any]], start: dict[str, Any]) -> float:
    """Episodes per second from `start`'s report to the last of `groups`."""
    if not groups:
        return 0.0
    episodes = groups[-1]["stored"] - start["stored"]
    seconds = groups[-1]["t"] - start["t"]
    return episodes / seconds if seconds > 0 else 0.0


def _window(groups: list[dict[str, Any]], begin: dict[str, Any], last: bool) -> dict[str, Any]:
    """The first (or last) `WINDOW` episodes of a process: episodes per second, and CPU
    per episode (the collector's own, and its jails'), which the machine's load does not
    change, with the mean load average over the window."""
    if not groups:
        return {}
    if last:
        end = groups[-1]
        start = next((g for g in reversed(groups) if end["stored"] - g["stored"] >= WINDOW), begin)
    else:
        start = begin
        end = next((g for g in groups if g["stored"] - begin["stored"] >= WINDOW), groups[-1])
    episodes = end["stored"] - start["stored"]
    inside = [g for g in groups if start["t"] < g["t"] <= end["t"]]
    return {
        "episodes": episodes,
        "episodes_per_s": round(_rate([end], start), 2),
        "collector_cpu_ms_per_episode": round(
            1000 * (end["cpu_self_s"] - start["cpu_self_s"]) / max(episodes, 1), 1
        ),
        "jail_cpu_ms_per_episode": round(
            1000 * (end["cpu_children_s"] - start["cpu_children_s"]) / max(episodes, 1), 1
        ),
        "load1": round(sum(g["load1"] for g in inside) / max(len(inside), 1), 2),
    }


def _rss_at(groups: list[dict[str, Any]], stored: int) -> dict[str, Any]:
    return next((g for g in groups if g["stored"] >= stored), groups[-1])


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def verify(database_url: str, objects: Path, episodes: int) -> dict[str, Any]:
    """What SQL says about the run after the resume."""
    from sqlalchemy import func, select
    from sqlmodel import col

    from collection.lifecycle import plan_request
    from config.settings import load_settings
    from models import Episode, Step, run_id_for
    from storage.db import make_engine
    from storage.objects import LocalObjectStore
    from storage.orphans import list_orphans
    from storage.settings import DatabaseSettings

    engine = make_engine(DatabaseSettings(url=database_url))
    try:
        run_id = run_id_for(RUN_KEY)
        with engine.connect() as conn:
            ids = list(
                conn.execute(select(col(Episode.id)).where(col(Episode.run_id) == run_id)).scalars()
            )
            step_sum = conn.execute(
                select(func.coalesce(func.sum(col(Episode.n_steps)), 0)).where(
                    col(Episode.run_id) == run_id
                )
            ).scalar_one()
            step_rows = conn.execute(
                select(func.count())
                .select_from(Step)
                .join(Episode, col(Episode.id) == col(Step.episode_id))
                .where(col(Episode.run_id) == run_id)
            ).scalar_one()
            statuses = dict(
                conn.execute(
                    select(col(Episode.status), func.count())
                    .where(col(Episode.run_id) == run_id)
                    .group_by(col(Episode.status))
                ).all()
            )
        plan = plan_request(bench_request(episodes, 1, 1), load_settings(), None)
        planned = {p.episode_id for p in bench_episodes(plan, episodes)}
        orphans = list_orphans(engine, LocalObjectStore(objects)).keys
    finally:
        engine.dispose()
    return {
        "stored": len(ids),
        "distinct": len(set(ids)),
        "all_planned_present": planned == set(ids),
        "step_rows": int(step_rows),
        "steps_of_episodes": int(step_sum),
        "by_status": {str(k): int(v) for k, v in statuses.items()},
        "orphaned_objects": len(orphans),
    }


def measure(
    args: argparse.Namespace, database: str, database_url: str, work: Path
) -> dict[str, Any]:
    from core.owner import process_start_ticks
    from storage import migrate
    from storage.db import make_engine
    from storage.settings import DatabaseSettings

    engine = make_engine(DatabaseSettings(url=database_url))
    migrate.upgrade(engine)
    engine.dispose()
    objects = work / f"objects-{database}"
    print(f"{database}: first collector (SIGKILL at {args.kill_at})", file=sys.stderr)
    first = run_collector(args, database_url, objects, kill_at=args.kill_at)
    if not first.killed:
        raise SystemExit(
            f"{database}: the first collector ended before the kill:\n{first.stderr_tail}"
        )
    deadline = time.monotonic() + 30
    while (
        any(process_start_ticks(p) is not None for p in first.jail_pids)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    leftover = [p for p in first.jail_pids if process_start_ticks(p) is not None]
    killed_verify = verify(database_url, objects, args.episodes)
    print(f"{database}: resuming ({killed_verify['stored']} stored)", file=sys.stderr)
    second = run_collector(args, database_url, objects, kill_at=None)
    if second.returncode != 0:
        raise SystemExit(f"{database}: the resumed collector failed:\n{second.stderr_tail}")
    final = verify(database_url, objects, args.episodes)
    if args.reports is not None:
        with args.reports.open("a") as f:
            for phase, run in (("killed", first), ("resumed", second)):
                for r in run.reports:
                    f.write(json.dumps({"database": database, "phase": phase, **r}) + "\n")

    a_start, b_start = first.first("start"), second.first("start")
    a_groups, b_groups = first.groups, second.groups
    done = second.first("done")
    ran_a = a_groups[-1]["stored"] - a_start["stored"] if a_groups else 0
    ran_b = done["stored"] - b_start["stored"]
    seconds = (a_groups[-1]["t"] - a_start["t"] if a_groups else 0.0) + (
        b_groups[-1]["t"] - b_start["t"] if b_groups else 0.0
    )
    rss_1k = _rss_at(a_groups, WINDOW)
    a_end, b_1k = a_groups[-1], _rss_at(b_groups, b_start["stored"] + WINDOW)
    planned = first.first("planned")
    imported = first.first("imported")
    return {
        "episodes": args.episodes,
        "episodes_per_s": round((ran_a + ran_b) / seconds, 2) if seconds else 0.0,
        "first_1k": _window(a_groups, a_start, last=False),
        "last_1k": _window(b_groups, b_start, last=True),
        "rss_at_1k_mib": _mib(rss_1k["rss_kib"]),
        "rss_at_end_mib": _mib(done["rss_kib"]),
        "rss_growth_1k_to_end": round(done["rss_kib"] / rss_1k["rss_kib"] - 1, 3),
        "first_process_rss_growth": {
            "from_stored": rss_1k["stored"],
            "to_stored": a_end["stored"],
            "growth": round(a_end["rss_kib"] / rss_1k["rss_kib"] - 1, 3),
        },
        "resumed_process_rss_growth": {
            "from_stored": b_1k["stored"],
            "to_stored": done["stored"],
            "growth": round(done["rss_kib"] / b_1k["rss_kib"] - 1, 3),
        },
        "peak_rss_mib": _mib(max(a_end["hwm_kib"], done["hwm_kib"])),
        "plan_rss_mib": _mib(planned["rss_kib"] - imported["rss_kib"]),
        "plan_s": round(planned["t"] - imported["t"], 2),
        "kill": {
            "at_report": a_groups[-1]["stored"] if a_groups else 0,
            "stored_after_kill": killed_verify["stored"],
            "jail_processes_left": len(leftover),
        },
        "resume": {
            "todo": b_start["todo"],
            "expected_todo": args.episodes - killed_verify["stored"],
            "ran": ran_b,
            "executed_reported": done["executed"],
            "start_s": round(b_start["t"] - second.first("imported")["t"], 2),
        },
        "final": final,
        "ok": (
            final["stored"] == final["distinct"] == args.episodes
            and final["all_planned_present"]
            and final["step_rows"] == final["steps_of_episodes"]
            and final["orphaned_objects"] == 0
            and b_start["todo"] == args.episodes - killed_verify["stored"] == ran_b
            and not leftover
        ),
    }


@contextlib.contextmanager
def database_url(database: str, work: Path) -> Iterator[str]:
    if database == "sqlite":
        yield f"sqlite:///{work / 'scale.db'}"
        return
    from tests.services.postgres import find_pg_bin, running_cluster

    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL binaries not found (install postgresql or set EPIFLOW_PG_BIN)")
    with running_cluster(bin_dir) as cluster:
        yield cluster.url(cluster.create_database())


def main() -> None:
    global WINDOW
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--kill-at", type=int, default=None, help="default: half the episodes")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--window", type=int, default=WINDOW, help=argparse.SUPPRESS)
    parser.add_argument(
        "--reports", type=Path, help="also write every collector report (JSON lines) here"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--objects", help=argparse.SUPPRESS)
    parser.add_argument("--report-fd", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    WINDOW = args.window
    if args.kill_at is None:
        args.kill_at = args.episodes // 2
    if not WINDOW < args.kill_at < args.episodes - WINDOW:
        raise SystemExit(
            f"--kill-at must leave {WINDOW} episodes on each side (got {args.kill_at} "
            f"of {args.episodes})"
        )
    load_start = os.getloadavg()
    out: dict[str, Any] = {"concurrency": args.concurrency, "batch_size": args.batch_size}
    with tempfile.TemporaryDirectory(prefix="epiflow-bench-scale-") as tmp:
        for database in args.databases.split(","):
            work = Path(tmp) / database
            work.mkdir()
            with database_url(database, work) as url:
                out[database] = measure(args, database, url, work)
    out["target_rss_growth"] = TARGET_RSS_GROWTH
    out["targets_met"] = {
        db: out[db]["ok"] and out[db]["rss_growth_1k_to_end"] < TARGET_RSS_GROWTH
        for db in args.databases.split(",")
    }
    out["load_avg_start"] = [round(x, 2) for x in load_start]
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
