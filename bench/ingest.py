"""Benchmark: the project's ingest path into PostgreSQL vs a raw COPY of the same rows.

    python bench/ingest.py --json [--episodes 2000] [--steps 10]

Starts a throwaway PostgreSQL cluster (like the tests), migrates two databases, then:

- `ingest_rows_per_s`: step rows per second through `storage.ingest.ingest_episodes`
  (trajectory → rows conversion, NUL/UTF-8 cleaning, existing-id check, parent upserts,
  COPY of episodes and steps, one transaction).
- `copy_rows_per_s`: the same episode and step rows, already converted to tuples, COPY'd
  into the second database in one transaction (the floor the ingest path is built on).

`ratio = ingest_rows_per_s / copy_rows_per_s`; target ≥ 0.5. Best of `--repeat` runs,
each on freshly truncated tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, text

from agent.trajectory import Trajectory
from models import Episode, Step
from storage import migrate
from storage.db import make_engine
from storage.ingest import EpisodeBundle, copy_rows, ingest_episodes
from storage.rows import episode_row, policy_row, run_row, step_row, task_row
from storage.settings import DatabaseSettings
from tests.services.postgres import find_pg_bin, running_cluster
from tests.storage.builders import make_trajectory


def synthetic(episodes: int, steps: int) -> list[Trajectory]:
    return [make_trajectory("bench", f"builtin/t@1#{i}", 0, n_steps=steps) for i in range(episodes)]


def truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE step, artifact, episode, task, policy, collection_run CASCADE"))


def time_ingest(engine: Engine, trajectories: list[Trajectory]) -> float:
    bundles = [EpisodeBundle(trajectory=t) for t in trajectories]
    started = time.perf_counter()
    ingest_episodes(engine, bundles)
    return time.perf_counter() - started


def time_copy(engine: Engine, trajectories: list[Trajectory]) -> float:
    parents = {
        "task": {r["id"]: r for r in (task_row(t) for t in trajectories)},
        "policy": {r["id"]: r for r in (policy_row(t) for t in trajectories)},
        "collection_run": {r["id"]: r for r in (run_row(t) for t in trajectories)},
    }
    episodes = [episode_row(t, trajectory_key=None) for t in trajectories]
    steps = [step_row(t.episode_id, s) for t in trajectories for s in t.steps]
    from models import CollectionRun, Policy, Task

    tables = {"task": Task, "policy": Policy, "collection_run": CollectionRun}
    started = time.perf_counter()
    with engine.begin() as conn:
        for name, rows in parents.items():
            copy_rows(conn, tables[name].__table__, list(rows.values()))  # type: ignore[attr-defined]
        copy_rows(conn, Episode.__table__, episodes)  # type: ignore[attr-defined]
        copy_rows(conn, Step.__table__, steps)  # type: ignore[attr-defined]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL binaries not found (install postgresql or set EPIFLOW_PG_BIN)")
    trajectories = synthetic(args.episodes, args.steps)
    n_steps = sum(len(t.steps) for t in trajectories)
    with running_cluster(bin_dir) as cluster:
        a = make_engine(DatabaseSettings(url=cluster.url(cluster.create_database())))
        b = make_engine(DatabaseSettings(url=cluster.url(cluster.create_database())))
        migrate.upgrade(a)
        migrate.upgrade(b)
        ingest_s, copy_s = [], []
        for _ in range(args.repeat):
            truncate(a)
            truncate(b)
            ingest_s.append(time_ingest(a, trajectories))
            copy_s.append(time_copy(b, trajectories))
        a.dispose()
        b.dispose()
    result = {
        "episodes": args.episodes,
        "step_rows": n_steps,
        "ingest_s": round(min(ingest_s), 4),
        "copy_s": round(min(copy_s), 4),
        "ingest_rows_per_s": round(n_steps / min(ingest_s), 1),
        "copy_rows_per_s": round(n_steps / min(copy_s), 1),
        "ratio": round(min(copy_s) / min(ingest_s), 3),
        "target_ratio": 0.5,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
