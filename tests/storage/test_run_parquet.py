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
from storage.run_reads import EPISODE_COLUMNS
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
