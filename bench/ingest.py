"""Benchmark: the project's ingest path into PostgreSQL vs a raw COPY of the same rows.

    python bench/ingest.py --json [--episodes 2000] [--steps 10]

Starts a throwaway PostgreSQL cluster (like the tests), migrates two databases, then:

- `ingest_rows_per_s`: step rows per second through `storage.ingest.ingest_episodes`, the
  collection's one writer (existing-id check, parent upserts, episode rows, COPY of
  episodes and steps, one transaction), given what a collection hands it: each
  episode's episode and step rows built where the episode finished (`EpisodeBundle.rows`, by
  `storage.ingest.rows_for` in `collection.runner`'s workers). Building them
  (trajectory → values, NUL/UTF-8 cleaning, JSON serialization) is timed apart as
  `prepare_s`: real work, done off the writer's path, spread over the episodes' workers.
- `ingest_unprepared_s`: the same ingest with no rows handed in (an import, a caller
  that gives bare trajectories): the writer builds them itself.
- `copy_rows_per_s`: the same task, policy, run, episode and step rows, already turned
  into COPY values (column order, JSON serialized) before the clock starts, written with
  plain `COPY … FROM STDIN` in one transaction: the floor the ingest path is built on.
  Nothing of the project's COPY code runs in it, so speeding that code up cannot speed
  the floor up with it.

`ratio = ingest_rows_per_s / copy_rows_per_s`; target ≥ 0.8 (issue 16). Best of
`--repeat` runs of each, interleaved, each on freshly truncated tables. The JSON carries
the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, Table, text

from agent.trajectory import Trajectory
from models import CollectionRun, Episode, Policy, Step, Task
from storage import migrate
from storage.db import make_engine
from storage.ingest import EpisodeBundle, ingest_episodes, rows_for
from storage.rows import episode_row, policy_row, run_row, step_row, task_row
from storage.sanitize import json_text
from storage.settings import DatabaseSettings
from tests.services.postgres import find_pg_bin, running_cluster
from tests.storage.builders import make_trajectory


def synthetic(episodes: int, steps: int) -> list[Trajectory]:
    return [make_trajectory("bench", f"builtin/t@1#{i}", 0, n_steps=steps) for i in range(episodes)]


def truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE step, artifact, episode, task, policy, collection_run CASCADE"))


def time_prepare(engine: Engine, trajectories: list[Trajectory]) -> tuple[float, list[Any]]:
    """Step rows built as the collection's workers build them (one per finished episode)."""
    started = time.perf_counter()
    rows = [rows_for(engine, t) for t in trajectories]
    return time.perf_counter() - started, rows


def time_ingest(engine: Engine, trajectories: list[Trajectory], rows: list[Any] | None) -> float:
    if rows is None:
        bundles = [EpisodeBundle(trajectory=t) for t in trajectories]
    else:
        bundles = [
            EpisodeBundle(trajectory=t, rows=r) for t, r in zip(trajectories, rows, strict=True)
        ]
    started = time.perf_counter()
    ingest_episodes(engine, bundles)
    return time.perf_counter() - started


def copy_values(table: Table, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as COPY values: column order, JSON columns serialized (done before the clock)."""
    columns = list(table.columns)
    json_columns = {c.name for c in columns if "JSON" in repr(c.type)}
    return [
        tuple(
            json_text(row[c.name])
            if c.name in json_columns and row[c.name] is not None
            else row[c.name]
            for c in columns
        )
        for row in rows
    ]


def time_copy(engine: Engine, trajectories: list[Trajectory]) -> float:
    parents = {
        Task: {r["id"]: r for r in (task_row(t) for t in trajectories)},
        Policy: {r["id"]: r for r in (policy_row(t) for t in trajectories)},
        CollectionRun: {r["id"]: r for r in (run_row(t) for t in trajectories)},
    }
    tables: list[tuple[Table, list[tuple[Any, ...]]]] = [
        (model.__table__, copy_values(model.__table__, list(rows.values())))  # type: ignore[attr-defined]
        for model, rows in parents.items()
    ]
    episodes = [episode_row(t, trajectory_key=None) for t in trajectories]
    steps = [step_row(t.episode_id, s) for t in trajectories for s in t.steps]
    tables.append((Episode.__table__, copy_values(Episode.__table__, episodes)))  # type: ignore[attr-defined]
    tables.append((Step.__table__, copy_values(Step.__table__, steps)))  # type: ignore[attr-defined]
    started = time.perf_counter()
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        for table, values in tables:
            columns = ", ".join(c.name for c in table.columns)
            with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({columns}) FROM STDIN") as copy:
                for row in values:
                    copy.write_row(row)
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
    load_start = os.getloadavg()
    trajectories = synthetic(args.episodes, args.steps)
    n_steps = sum(len(t.steps) for t in trajectories)
    with running_cluster(bin_dir) as cluster:
        a = make_engine(DatabaseSettings(url=cluster.url(cluster.create_database())))
        b = make_engine(DatabaseSettings(url=cluster.url(cluster.create_database())))
        migrate.upgrade(a)
        migrate.upgrade(b)
        ingest_s, copy_s, prepare_s, unprepared_s = [], [], [], []
        for _ in range(args.repeat):
            truncate(a)
            truncate(b)
            took, rows = time_prepare(a, trajectories)
            prepare_s.append(took)
            ingest_s.append(time_ingest(a, trajectories, rows))
            copy_s.append(time_copy(b, trajectories))
            truncate(a)
            unprepared_s.append(time_ingest(a, trajectories, None))
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
        "target_ratio": 0.8,
        "prepare_s": round(min(prepare_s), 4),
        "ingest_unprepared_s": round(min(unprepared_s), 4),
        "unprepared_ratio": round(min(copy_s) / min(unprepared_s), 3),
        "prepare_s_all": [round(x, 4) for x in prepare_s],
        "ingest_unprepared_s_all": [round(x, 4) for x in unprepared_s],
        "ingest_s_all": [round(x, 4) for x in ingest_s],
        "copy_s_all": [round(x, 4) for x in copy_s],
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
