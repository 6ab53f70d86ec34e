"""Benchmark: every view and every cookbook query on one PostgreSQL at 100k episodes.

    python bench/sql_scale.py --json [--base 2000] [--copies 50] [--steps 10] [--plans DIR]

Starts a throwaway PostgreSQL cluster (like the tests), migrates a database to head, and
fills it with `tests.storage.scale_data.build_scale_database`: `--base` episodes of
`--steps` steps through the real ingest path (`storage.ingest.ingest_episodes`, COPY),
with gate runs, judgements and replays, then copied up `--copies` times in SQL with new
ids (defaults: 100,000 episodes, 1,000,000 steps, 102,000 qc_result rows), plus three
dataset snapshots, two training runs and a checkpoint fine-tuned from another.

Then each view (`SELECT * FROM <view>`, and the issue's `SELECT qc_verdict, count(*) FROM
episode_summary GROUP BY 1`) and each query of docs/sql-cookbook.md (parameters bound
to real ids) runs under `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`; its seconds are the
server's planning + execution time of the best of `--repeat` runs (rows are produced on
the server, not shipped to the client). `--plans DIR` writes each plan as text there.

Target: every query ≤ 1 s (issue 26). The JSON carries the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Connection, Uuid, bindparam, text

from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.docs.cookbook_queries import load_queries
from tests.services.postgres import find_pg_bin, running_cluster
from tests.storage.scale_data import build_scale_database

VIEWS = [
    "episode_summary",
    "tool_failure_rates",
    "quality_by_suite",
    "quality_by_template",
    "training_lineage",
    "reproducibility_by_suite",
    "episode_tree",
]
EXTRA = {
    "episode_summary_by_verdict": "SELECT qc_verdict, count(*) FROM episode_summary GROUP BY 1",
}


def queries() -> dict[str, str]:
    """name → SQL: every view whole, the extra ones, every cookbook query."""
    found = {f"view:{v}": f"SELECT * FROM {v}" for v in VIEWS}
    found.update({f"view:{k}": sql for k, sql in EXTRA.items()})
    found.update({f"cookbook:{q.name}": q.sql for q in load_queries()})
    return found


def explain(conn: Connection, sql: str, values: dict[str, Any]) -> tuple[float, str]:
    """(planning + execution seconds, the plan as text) of one run of `sql`."""
    used = {k: v for k, v in values.items() if f":{k}" in sql}
    typed = [bindparam(k, type_=Uuid()) for k, v in used.items() if isinstance(v, uuid.UUID)]
    stmt = text(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").bindparams(*typed)
    raw = conn.execute(stmt, used).scalar_one()
    doc = raw if isinstance(raw, list) else json.loads(raw)
    seconds = (doc[0]["Planning Time"] + doc[0]["Execution Time"]) / 1000
    as_text = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").bindparams(*typed), used)
    return seconds, "\n".join(as_text.scalars())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--plans", type=Path, default=None)
    parser.add_argument("--target-s", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL binaries not found (install postgresql or set EPIFLOW_PG_BIN)")
    load_start = os.getloadavg()
    with running_cluster(bin_dir) as cluster:
        engine = make_engine(DatabaseSettings(url=cluster.url(cluster.create_database())))
        migrate.upgrade(engine)
        started = time.perf_counter()
        ids = build_scale_database(engine, base=args.base, copies=args.copies, steps=args.steps)
        build_s = time.perf_counter() - started
        timings: dict[str, float] = {}
        values = ids.query_params()
        with engine.connect() as conn:
            conn.execute(text("SET TIME ZONE 'UTC'"))
            counts = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("episode", "step", "qc_result", "dataset_episode")
            }
            for name, sql in queries().items():
                best, plan = float("inf"), ""
                for _ in range(args.repeat):
                    seconds, plan = explain(conn, sql, values)
                    best = min(best, seconds)
                timings[name] = round(best, 4)
                if args.plans is not None:
                    args.plans.mkdir(parents=True, exist_ok=True)
                    (args.plans / f"{name.replace(':', '_')}.txt").write_text(plan + "\n")
        engine.dispose()
    slowest = max(timings, key=lambda k: timings[k])
    result = {
        "episodes": counts["episode"],
        "steps": counts["step"],
        "qc_results": counts["qc_result"],
        "dataset_episodes": counts["dataset_episode"],
        "build_s": round(build_s, 1),
        "slowest_s": timings[slowest],
        "slowest_query": slowest,
        "target_s": args.target_s,
        "over_target": sorted(k for k, v in timings.items() if v > args.target_s),
        "queries": timings,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
