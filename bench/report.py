"""Benchmark: `epiflow report` on a synthetic 10,000-episode run.

    python bench/report.py --json [--episodes 10000] [--steps 8] [--page-size 200]
                                  [--workers N] [--repeat 1]

Builds a run in a temporary SQLite database and local object directory (setup, not
timed): `--episodes` trajectories of `--steps` steps (tool calls with outputs and
observations, mixed statuses and templates, one in twenty with a 20 KB observation) stored
through `storage.episodes.persist_episodes`, and a gate run with a verdict for each. Then
times `reports.pages.write_report` (what `epiflow report` runs: SQL rows, every
trajectory object read and validated, every page rendered and written), best of
`--repeat`. Reports wall seconds, the CPU seconds it used (this process and its page
workers: what the wall time is on an otherwise idle machine with one worker), pages,
bytes written, the largest page, and the load average (a busy machine stretches the
wall time). Target: under 10 s for 10,000 episodes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlmodel import Session

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from models import QcResult, QcRun, run_id_for
from reports.pages import write_report
from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.storage.builders import make_trajectory

RUN_KEY = "bench-report"
TEMPLATES = ["csv_to_json", "log_errors", "config_update", "dir_tree", "merge_csv"]


def synthetic(i: int, steps: int) -> Trajectory:
    t = make_trajectory(RUN_KEY, f"builtin/{TEMPLATES[i % 5]}@1#{i}", 0, n_steps=steps)
    t.template = TEMPLATES[i % len(TEMPLATES)]
    if i % 3:
        t.status, t.failure_category = EpisodeStatus.FAILED, FailureCategory.VERIFIER_FAILED
        t.failure_reason = "output.json differs from the expected rows"
    if i % 20 == 0:
        t.steps[0].observation = "row," * 5000  # a long observation, cut on the page
    t.total_reward = (i % 7) / 7 - 0.3
    return t


def build_run(root: Path, episodes: int, steps: int) -> tuple[str, LocalObjectStore]:
    url = f"sqlite:///{root / 'bench.db'}"
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(root / "objects")
    store.check()
    ids: list[uuid.UUID] = []
    for start in range(0, episodes, 500):
        batch = [synthetic(i, steps) for i in range(start, min(start + 500, episodes))]
        persist_episodes(engine, store, batch)
        ids.extend(t.episode_id for t in batch)
    qc_run_id = uuid.uuid4()
    with Session(engine) as session:
        session.add(QcRun(id=qc_run_id, run_id=run_id_for(RUN_KEY), n_episodes=len(ids)))
        session.flush()
        session.add_all(
            QcResult(
                qc_run_id=qc_run_id,
                episode_id=eid,
                verdict=("keep", "downweight", "discard")[n % 3],
                quality_score=(n % 10) / 10,
            )
            for n, eid in enumerate(ids)
        )
        session.commit()
    engine.dispose()
    return url, store


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--page-size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="page processes")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (the default output anyway)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="epiflow-bench-report-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        url, store = build_run(root, args.episodes, args.steps)
        setup_s = time.perf_counter() - started
        engine = make_engine(DatabaseSettings(url=url))
        best, best_cpu = float("inf"), float("inf")
        files: list[Path] = []
        for attempt in range(args.repeat):
            out = root / f"attempt-{attempt}"
            out.mkdir()
            cpu = _cpu_seconds()
            started = time.perf_counter()
            files = write_report(
                engine,
                store,
                RUN_KEY,
                out / "report.html",
                page_size=args.page_size,
                workers=args.workers,
            )
            best = min(best, time.perf_counter() - started)
            best_cpu = min(best_cpu, _cpu_seconds() - cpu)
        engine.dispose()
        sizes = [f.stat().st_size for f in files]
        result = {
            "episodes": args.episodes,
            "steps_per_episode": args.steps,
            "page_size": args.page_size,
            "pages": len(files) - 1,
            "report_s": round(best, 2),
            "report_cpu_s": round(best_cpu, 2),
            "under_10s": best < 10.0,
            "workers": args.workers,
            "bytes_written": sum(sizes),
            "overview_bytes": sizes[0],
            "largest_page_bytes": max(sizes[1:], default=sizes[0]),
            "setup_s": round(setup_s, 1),
            "repeat": args.repeat,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
