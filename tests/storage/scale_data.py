"""A PostgreSQL database at scale: real ingest of a base corpus, then copied up in SQL.

Used by `bench/sql_scale.py` (100k episodes, 1M steps, 100k qc_result rows) and by the
plan test in `tests/storage/test_view_plans.py` (a few thousand episodes: big enough that
the planner's choice is the one it makes at scale, small enough for a test).

How the rows are made:

1. `base` episodes are built as trajectories (13 templates, three policies of which one
   perturbs its turns and makes parse errors, injected faults, mixed outcomes, spread over
   a week) and written through the real ingest path, `storage.ingest.ingest_episodes`
   (COPY on PostgreSQL), in runs of `per_run` episodes.
2. Gate runs, judgements and replays for those episodes are inserted as the rows
   `storage.qc.write_qc_run` and the replay command write (the gate itself is not what is
   measured); the first run is gated twice, so "latest verdict" has a choice to make.
3. Every collection run, episode, step, gate run, qc_result, judgement and replay row is
   copied `copies - 1` times with `INSERT … SELECT` and new ids (`md5(id || copy)` as a
   uuid, run keys suffixed `#copy`), so the copies are real rows of the real schema with
   the distributions of the base corpus.
4. A snapshot of a share of the episodes, its training run and checkpoint, a checkpoint
   fine-tuned from it on a second snapshot (generation 1), and an untrained snapshot.

Then `VACUUM ANALYZE`, as autovacuum would after a bulk load, repeated until every page
of the copied tables is marked all-visible: a VACUUM that runs beside autovacuum's own
ANALYZE of the fresh rows (it holds a snapshot) leaves pages unmarked, and the planner then
prices index-only scans as heap reads, a plan that follows a race rather than the data.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, text

from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    InjectedFault,
    ParseKind,
    Trajectory,
    episode_id_for,
)
from models import (
    Checkpoint,
    CollectionRun,
    Dataset,
    Episode,
    Judgement,
    QcResult,
    QcRun,
    ReplayResult,
    Step,
    TrainingRun,
    run_id_for,
)
from storage.ingest import EpisodeBundle, ingest_episodes
from tests.storage.builders import make_trajectory

TEMPLATES = [
    "csv_to_json",
    "log_errors",
    "config_update",
    "largest_files",
    "jsonl_extract",
    "checksums",
    "merge_csv",
    "rename_files",
    "dedupe_records",
    "dir_tree",
    "summary_stats",
    "sales_rollup",
    "fix_script",
]
POLICIES = ["scripted:oracle", "scripted:noisy?malformed=0.15", "openai:http://127.0.0.1:1#m"]
PERTURBATIONS = ["malformed", "unknown_tool", "missing_arg", "fabricated_claim"]
FAULTS = ["latency", "permission_denied", "network_failure", "tool_timeout"]
VERDICTS = ["keep", "downweight", "discard"]
EPOCH = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


NO_GRPO_RUN = uuid.UUID(int=0)
"""No GRPO run is in the scale database: its cookbook query plans an empty answer."""


@dataclass(frozen=True)
class ScaleIds:
    """Ids the cookbook's parameterised queries are run with."""

    qc_run_id: uuid.UUID
    regate_qc_run_id: uuid.UUID
    checkpoint_id: uuid.UUID
    child_checkpoint_id: uuid.UUID
    episode_id: uuid.UUID
    lineage_episode_id: uuid.UUID
    since: str

    def query_params(self) -> dict[str, Any]:
        """The cookbook's bind parameters (`:since`, `:checkpoint_id`, …) with these ids."""
        return {
            "since": self.since,
            "checkpoint_id": self.checkpoint_id,
            "episode_id": self.episode_id,
            "qc_run_id": self.qc_run_id,
            "lineage_episode_id": self.lineage_episode_id,
            "training_run_id": NO_GRPO_RUN,
            "session_id": "NORMALIZED_SESSION_ID",  # the scale database imports no ATIF files
        }


def _started(t: Trajectory) -> datetime:
    assert t.started_at is not None  # collected episodes have their times
    return t.started_at


def base_trajectory(i: int, *, per_run: int, steps: int) -> Trajectory:
    """Episode `i` of the base corpus: deterministic, varied like a nightly collection."""
    run = i // per_run
    policy = POLICIES[i % len(POLICIES)]
    template = TEMPLATES[(i // len(POLICIES)) % len(TEMPLATES)]
    task = f"builtin/{template}@1#{i}-{i:08x}"
    run_key = f"scale-{run}"
    t = make_trajectory(run_key, task, 0, n_steps=steps)
    started = EPOCH + timedelta(days=run % 7, seconds=i)
    new_steps = []
    for s in t.steps:
        update: dict[str, Any] = {"started_at": started + timedelta(seconds=s.index)}
        if s.parse_kind == ParseKind.TOOL_CALL:
            update["duration_ms"] = float((i * 7 + s.index * 13) % 500) + 0.5
            update["exit_code"] = 0 if (i + s.index) % 5 else 1
            update["injected_fault"] = (
                InjectedFault(kind=FAULTS[(i + s.index) % len(FAULTS)], detail={})
                if (i + s.index) % 11 == 0
                else None
            )
            if policy.startswith("scripted:noisy") and (i + s.index) % 4 == 0:
                update["policy_perturbation"] = PERTURBATIONS[(i + s.index) % len(PERTURBATIONS)]
                if (i + s.index) % 8 == 0:
                    update["parse_kind"] = ParseKind.ERROR
                    update["parse_error_code"] = "unknown_tool"
                    update["tool"] = None
        new_steps.append(s.model_copy(update=update))
    success = i % 3 != 1
    return t.model_copy(
        update={
            "episode_id": episode_id_for(run_key, task, 0),
            "template": template,
            "policy": policy,
            "started_at": started,
            "ended_at": started + timedelta(seconds=steps + 1),
            "status": EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILED,
            "failure_category": FailureCategory.SUCCESS
            if success
            else FailureCategory.VERIFIER_FAILED,
            "verifier_score": 1.0 if success else 0.25,
            "steps": new_steps,
        }
    )


def _md5_uuid(column: str, copy: str = "g") -> str:
    return f"CAST(md5(CAST({column} AS text) || ':' || CAST({copy} AS text)) AS uuid)"


def _copy_up(conn: Any, table: str, columns: list[str], replaced: dict[str, str], n: int) -> None:
    """`INSERT … SELECT` every row of `table` once per copy 1..n-1, columns in `replaced`
    computed from the copy number `g`."""
    if n <= 1:
        return
    names = ", ".join(columns)
    values = ", ".join(replaced.get(c, c) for c in columns)
    conn.execute(
        text(
            f"INSERT INTO {table} ({names}) SELECT {values} "
            f"FROM {table} CROSS JOIN generate_series(1, {n - 1}) AS g"
        )
    )


def _columns(model: Any) -> list[str]:
    return [c.name for c in model.__table__.columns]


def build_scale_database(
    engine: Engine, *, base: int, copies: int, steps: int = 10, per_run: int = 500
) -> ScaleIds:
    """Fill a migrated, empty PostgreSQL database; `base × copies` episodes of `steps` steps."""
    batch = 500
    trajectories: list[Trajectory] = []
    for start in range(0, base, batch):
        chunk = [
            base_trajectory(i, per_run=per_run, steps=steps)
            for i in range(start, min(base, start + batch))
        ]
        ingest_episodes(engine, [EpisodeBundle(trajectory=t) for t in chunk])
        trajectories.extend(chunk)

    runs = sorted({t.run_key for t in trajectories})
    qc_ids = {key: uuid.uuid5(uuid.NAMESPACE_URL, f"qc:{key}") for key in runs}
    regate = uuid.uuid5(uuid.NAMESPACE_URL, f"qc2:{runs[0]}")
    with engine.begin() as conn:
        gates = [(key, qc_ids[key], 0) for key in runs] + [(runs[0], regate, 1)]
        for key, qc_id, second in gates:
            members = [t for t in trajectories if t.run_key == key]
            at = members[0].ended_at or members[0].started_at
            assert at is not None  # collected episodes have their times
            conn.execute(
                insert(QcRun.__table__),  # type: ignore[attr-defined]
                {
                    "id": qc_id,
                    "run_id": run_id_for(key),
                    "suite_versions": {"episode": "1", "batch": "1"},
                    "batch_passed": True,
                    "batch_failures": [],
                    "n_episodes": len(members),
                    "n_keep": 0,
                    "n_downweight": 0,
                    "n_discard": 0,
                    "mean_quality": 0.5,
                    "docs_key": None,
                    "triggered_training": False,
                    "started_at": at + timedelta(hours=1 + second),
                    "ended_at": at + timedelta(hours=1 + second, minutes=1),
                },
            )
            conn.execute(
                insert(QcResult.__table__),  # type: ignore[attr-defined]
                [
                    {
                        "qc_run_id": qc_id,
                        "episode_id": t.episode_id,
                        "verdict": VERDICTS[(n + second) % 3],
                        "quality_score": ((n * 37 + second * 11) % 100) / 100,
                        "reward_sign": 1,
                        "reasons": [],
                        "created_at": at + timedelta(hours=1 + second, seconds=n),
                    }
                    for n, t in enumerate(members)
                ],
            )
            conn.execute(
                insert(Judgement.__table__),  # type: ignore[attr-defined]
                [
                    {
                        "id": uuid.uuid5(qc_id, str(t.episode_id)),
                        "episode_id": t.episode_id,
                        "qc_run_id": qc_id,
                        "judge": "rule",
                        "judge_version": "1",
                        "parsed": True,
                        "completion": float(n % 6),
                        "tool_correctness": 4.0,
                        "reliability": 3.0,
                        "cost": 5.0,
                        "safety": 5.0,
                        "deductions": [],
                        "created_at": at + timedelta(hours=1 + second),
                    }
                    for n, t in enumerate(members)
                ],
            )
        conn.execute(
            insert(ReplayResult.__table__),  # type: ignore[attr-defined]
            [
                {
                    "id": uuid.uuid5(uuid.NAMESPACE_URL, f"replay:{t.episode_id}"),
                    "episode_id": t.episode_id,
                    "steps": len(t.steps),
                    "identical_steps": len(t.steps) - (n % 2),
                    "first_divergence": None,
                    "created_at": _started(t) + timedelta(days=1),
                }
                for n, t in enumerate(trajectories[::20])
            ],
        )

        g = "g"
        _copy_up(
            conn,
            "collection_run",
            _columns(CollectionRun),
            {"id": _md5_uuid("id"), "run_key": f"run_key || '#' || CAST({g} AS text)"},
            copies,
        )
        _copy_up(
            conn,
            "episode",
            _columns(Episode),
            {"id": _md5_uuid("id"), "run_id": _md5_uuid("run_id")},
            copies,
        )
        _copy_up(conn, "step", _columns(Step), {"episode_id": _md5_uuid("episode_id")}, copies)
        _copy_up(
            conn,
            "qc_run",
            _columns(QcRun),
            {"id": _md5_uuid("id"), "run_id": _md5_uuid("run_id")},
            copies,
        )
        _copy_up(
            conn,
            "qc_result",
            _columns(QcResult),
            {"qc_run_id": _md5_uuid("qc_run_id"), "episode_id": _md5_uuid("episode_id")},
            copies,
        )
        _copy_up(
            conn,
            "judgement",
            _columns(Judgement),
            {
                "id": _md5_uuid("id"),
                "qc_run_id": _md5_uuid("qc_run_id"),
                "episode_id": _md5_uuid("episode_id"),
            },
            copies,
        )
        _copy_up(
            conn,
            "replay_result",
            _columns(ReplayResult),
            {"id": _md5_uuid("id"), "episode_id": _md5_uuid("episode_id")},
            copies,
        )
    ids = _lineage(engine, base=base, copies=copies)
    _vacuum_until_all_visible(engine)
    first = trajectories[1]  # a noisy episode
    return ScaleIds(
        qc_run_id=qc_ids[runs[0]],
        regate_qc_run_id=regate,
        checkpoint_id=ids[0],
        child_checkpoint_id=ids[1],
        episode_id=first.episode_id,
        lineage_episode_id=ids[2],
        since=(EPOCH + timedelta(days=3)).date().isoformat(),
    )


def _lineage(engine: Engine, *, base: int, copies: int) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """Three snapshots (trained, fine-tuned from, untrained) with their runs and checkpoints."""
    total = base * copies
    ns = uuid.NAMESPACE_URL
    parent_ds, child_ds, untrained_ds = (uuid.uuid5(ns, f"dataset:{n}") for n in range(3))
    run0, run1 = uuid.uuid5(ns, "train:0"), uuid.uuid5(ns, "train:1")
    ckpt0, ckpt1 = uuid.uuid5(ns, "ckpt:0"), uuid.uuid5(ns, "ckpt:1")
    sizes = {parent_ds: total // 5, child_ds: total // 10, untrained_ds: total // 20}
    with engine.begin() as conn:
        for n, (ds, size) in enumerate(sizes.items()):
            conn.execute(
                insert(Dataset.__table__),  # type: ignore[attr-defined]
                {
                    "id": ds,
                    "kind": "sft",
                    "filter": {},
                    "qc_run_id": None,
                    "n_rows": size,
                    "n_episodes": size,
                    "weight_sum": float(size),
                    "sha256": "0" * 64,
                    "object_key": f"datasets/{ds}/data.parquet",
                    "created_at": EPOCH + timedelta(days=8 + n),
                },
            )
            # A different slice of the episodes per snapshot (offset by n, every k-th).
            conn.execute(
                text(
                    "INSERT INTO dataset_episode (dataset_id, episode_id, role, weight) "
                    "SELECT :ds, id, 'example', 1.0 FROM ("
                    "  SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS rn FROM episode"
                    ") e WHERE (rn + :n) % :k = 0"
                ),
                {"ds": ds, "n": n, "k": max(1, total // size)},
            )
        for run, ds, algo, day in ((run0, parent_ds, "sft", 9), (run1, child_ds, "dpo", 10)):
            conn.execute(
                insert(TrainingRun.__table__),  # type: ignore[attr-defined]
                {
                    "id": run,
                    "dataset_id": ds,
                    "algo": algo,
                    "base_model": "tiny",
                    "config": {},
                    "status": "completed",
                    "metrics": {},
                    "started_at": EPOCH + timedelta(days=day),
                    "ended_at": EPOCH + timedelta(days=day, hours=1),
                },
            )
        for ckpt, run, parent, day in ((ckpt0, run0, None, 9), (ckpt1, run1, ckpt0, 10)):
            conn.execute(
                insert(Checkpoint.__table__),  # type: ignore[attr-defined]
                {
                    "id": ckpt,
                    "training_run_id": run,
                    "parent_checkpoint_id": parent,
                    "object_prefix": f"checkpoints/{ckpt}",
                    "protocol_version": "1",
                    "metrics": {},
                    "evaluation": {},
                    "created_at": EPOCH + timedelta(days=day, hours=1),
                },
            )
        lineage_episode = conn.execute(
            text("SELECT MIN(CAST(episode_id AS text)) FROM dataset_episode WHERE dataset_id = :d"),
            {"d": parent_ds},
        ).scalar_one()
    return ckpt0, ckpt1, uuid.UUID(lineage_episode)


VACUUMED = ("step", "episode", "qc_result", "dataset_episode")
"""The tables whose visibility the view plans depend on (index-only scans)."""


def _vacuum_until_all_visible(engine: Engine, *, attempts: int = 60) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for _ in range(attempts):
            conn.execute(text("VACUUM ANALYZE"))
            unmarked = conn.execute(
                text(
                    "SELECT count(*) FROM pg_class WHERE relname = ANY(:names) "
                    "AND relallvisible < relpages"
                ),
                {"names": list(VACUUMED)},
            ).scalar_one()
            if unmarked == 0:
                return
            # Between VACUUM attempts (bounded by `attempts`), not a clock.
            time.sleep(0.5)
    raise RuntimeError(f"pages of {VACUUMED} still not all-visible after {attempts} VACUUMs")
