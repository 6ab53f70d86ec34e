"""`epiflow export --format parquet`: a run's steps with the episode's columns beside them,
read from SQL (SQLite and PostgreSQL), so episode questions need no join and the object
keys are the ones SQL has."""

from __future__ import annotations

import uuid
from pathlib import Path

import polars as pl
from sqlalchemy import Engine, select
from sqlmodel import Session, col

from models import QcResult, QcRun, Step, run_id_for
from storage.episodes import persist_episodes
from storage.exchange import export_run
from storage.objects import LocalObjectStore
from storage.run_frames import EPISODE_COLUMNS, STEP_FRAME_FORMAT, step_frame_schema
from tests.storage.builders import make_trajectory


def test_parquet_carries_episode_columns_and_object_keys(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    big = b"x" * 40_000  # longer than the SQL text cap: the raw bytes become an object
    gated = make_trajectory("pq-run", "builtin/csv_to_json@1#0-abc", 0, stdout=big, n_steps=3)
    other = make_trajectory("pq-run", "builtin/csv_to_json@1#1-def", 0, n_steps=2)
    persist_episodes(migrated_engine, store, [gated, other])
    qc_run_id = uuid.uuid4()
    with Session(migrated_engine) as session:
        session.add(QcRun(id=qc_run_id, run_id=run_id_for("pq-run"), n_episodes=1))
        session.flush()
        session.add(
            QcResult(
                qc_run_id=qc_run_id, episode_id=gated.episode_id, verdict="keep", quality_score=0.8
            )
        )
        session.commit()

    out = tmp_path / "steps.parquet"
    assert export_run(migrated_engine, store, "pq-run", "parquet", out) == 2
    frame = pl.read_parquet(out)
    assert frame.height == 5
    step_columns = [c.name for c in Step.__table__.columns]  # type: ignore[attr-defined]
    assert frame.columns == step_columns + list(EPISODE_COLUMNS)
    with migrated_engine.connect() as conn:
        keys = {
            (str(e), i): k
            for e, i, k in conn.execute(
                select(col(Step.episode_id), col(Step.step_index), col(Step.stdout_key))
            )
        }
    assert any(keys.values())
    for row in frame.iter_rows(named=True):
        assert row["stdout_key"] == keys[(row["episode_id"], row["step_index"])]
    first = frame.filter(pl.col("episode_id") == str(gated.episode_id)).row(0, named=True)
    assert (first["policy_id"], first["task_id"], first["template"], first["status"]) == (
        gated.policy,
        gated.task_id,
        gated.template,
        str(gated.status),
    )
    assert (first["qc_verdict"], first["quality_score"], first["qc_run_id"]) == (
        "keep",
        0.8,
        str(qc_run_id),
    )
    assert first["episode_started_at"] == gated.started_at
    assert first["verifier_score"] == gated.verifier_score
    assert first["trajectory_key"] == f"episodes/pq-run/{gated.episode_id}/trajectory.json"
    assert frame.schema["episode_started_at"] == pl.Datetime("us", "UTC")
    assert frame.schema["started_at"] == pl.Datetime("us", "UTC")
    ungated = frame.filter(pl.col("episode_id") == str(other.episode_id))
    assert ungated["qc_verdict"].to_list() == [None, None]


def test_exports_of_any_two_runs_concatenate(migrated_engine: Engine, tmp_path: Path) -> None:
    """One run has object keys and a gate verdict, the other has neither (those columns all
    NULL there): each export still has the one fixed schema, so the two `pl.concat`."""
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    big = b"y" * 40_000  # over the SQL text cap: `stdout_key` set in run A only
    a = make_trajectory("pq-a", "builtin/csv_to_json@1#0-abc", 0, stdout=big, n_steps=3)
    b = make_trajectory("pq-b", "builtin/csv_to_json@1#1-def", 0, n_steps=2)
    persist_episodes(migrated_engine, store, [a])
    persist_episodes(migrated_engine, store, [b])
    qc_run_id = uuid.uuid4()
    with Session(migrated_engine) as session:
        session.add(QcRun(id=qc_run_id, run_id=run_id_for("pq-a"), n_episodes=1))
        session.flush()
        session.add(
            QcResult(qc_run_id=qc_run_id, episode_id=a.episode_id, verdict="keep", quality_score=1)
        )
        session.commit()

    frames = []
    for run in ("pq-a", "pq-b"):
        out = tmp_path / f"{run}.parquet"
        assert export_run(migrated_engine, store, run, "parquet", out) == 1
        assert pl.read_parquet_metadata(out)["epiflow_step_frame_format"] == STEP_FRAME_FORMAT
        frame = pl.read_parquet(out)
        assert frame.schema == step_frame_schema()
        frames.append(frame)
    only_b = frames[1]
    assert only_b["stdout_key"].null_count() == only_b.height
    assert only_b["qc_verdict"].null_count() == only_b.height

    both = pl.concat(frames)
    assert both.height == 5
    assert both.schema == step_frame_schema()
    assert both.schema["stdout_key"] == pl.String
    assert both.schema["quality_score"] == pl.Float64
    assert both.group_by("run_key").len().sort("run_key").rows() == [("pq-a", 3), ("pq-b", 2)]
    assert both.filter(pl.col("stdout_key").is_not_null())["run_key"].unique().to_list() == ["pq-a"]
