"""Dataset snapshots on SQLite and PostgreSQL: parquet in the store, `dataset` rows, SQL lineage."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import Engine, select, text
from sqlmodel import Session, col

from models import Dataset, DatasetEpisode, QcResult, QcRun, run_id_for
from sandbox.tool_specs import BUILTIN_TOOLS
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from tests.training.factory import call_step, episode, final_step
from training.errors import EmptySnapshot, SnapshotError
from training.registry import save_checkpoint, start_training_run
from training.snapshots import build_snapshot, fetch_snapshot, read_snapshot
from training.training_config import build_training_config


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


def _gate(engine: Engine, run_key: str, verdicts: dict[uuid.UUID, tuple[str, float]]) -> uuid.UUID:
    """A QC run over `run_key` with the given verdicts (what flows/qc writes)."""
    qc_run_id = uuid.uuid4()
    with Session(engine) as session:
        session.add(QcRun(id=qc_run_id, run_id=run_id_for(run_key), n_episodes=len(verdicts)))
        session.flush()
        for episode_id, (verdict, quality) in verdicts.items():
            session.add(
                QcResult(
                    qc_run_id=qc_run_id,
                    episode_id=episode_id,
                    verdict=verdict,
                    quality_score=quality,
                )
            )
        session.commit()
    return qc_run_id


@pytest.fixture
def scored(migrated_engine: Engine, store: LocalObjectStore):
    """Four episodes over two tasks, persisted, and a QC run judging them."""
    win1 = episode(
        task=1, rollout=0, steps=[call_step(0, "ls"), call_step(1, "cat a"), final_step(2)]
    )
    loss1 = episode(
        task=1, rollout=1, success=False, steps=[call_step(0, "ls"), final_step(1, "no")]
    )
    win2 = episode(task=2, rollout=0)
    junk = episode(task=2, rollout=1)
    report = persist_episodes(migrated_engine, store, [win1, loss1, win2, junk])
    assert not report.failed if hasattr(report, "failed") else True
    qc_run_id = _gate(
        migrated_engine,
        "train-run",
        {
            win1.episode_id: ("keep", 0.9),
            loss1.episode_id: ("downweight", 0.3),
            win2.episode_id: ("downweight", 0.5),
            junk.episode_id: ("discard", 0.0),
        },
    )
    return {"win1": win1, "loss1": loss1, "win2": win2, "junk": junk, "qc_run_id": qc_run_id}


def test_sft_snapshot_rows_parquet_and_lineage(migrated_engine, store, scored):
    info = build_snapshot(migrated_engine, store, kind="sft", qc_run_id=scored["qc_run_id"])
    assert info.n_rows == 2 and info.n_episodes == 2
    assert info.weight_sum == pytest.approx(0.9 + 0.5)
    assert info.object_key == f"datasets/{info.id}/sft.parquet"
    data = store.get(info.object_key)
    assert hashlib.sha256(data).hexdigest() == info.sha256
    frame = read_snapshot(store, info)
    assert sorted(frame["episode_id"].to_list()) == sorted(
        [str(scored["win1"].episode_id), str(scored["win2"].episode_id)]
    )
    assert (
        frame.filter(pl.col("episode_id") == str(scored["win1"].episode_id))["weight"].item() == 0.9
    )
    with Session(migrated_engine) as session:
        row = session.get(Dataset, info.id)
        assert row is not None and row.qc_run_id == scored["qc_run_id"] and row.kind == "sft"
        assert row.filter["qc_run_id"] == str(scored["qc_run_id"])
        lineage = session.execute(
            select(
                col(DatasetEpisode.episode_id), col(DatasetEpisode.role), col(DatasetEpisode.weight)
            ).where(col(DatasetEpisode.dataset_id) == info.id)
        ).all()
    assert {(e, r, w) for e, r, w in lineage} == {
        (scored["win1"].episode_id, "example", 0.9),
        (scored["win2"].episode_id, "example", 0.5),
    }


def test_same_selection_is_the_same_snapshot(migrated_engine, store, scored):
    first = build_snapshot(migrated_engine, store, kind="sft", qc_run_id=scored["qc_run_id"])
    again = build_snapshot(migrated_engine, store, kind="sft", qc_run_id=scored["qc_run_id"])
    assert again == first
    with Session(migrated_engine) as session:
        assert len(session.execute(select(col(Dataset.id))).all()) == 1


def test_dpo_snapshot_pairs_within_the_gated_run(migrated_engine, store, scored):
    info = build_snapshot(migrated_engine, store, kind="dpo", qc_run_id=scored["qc_run_id"])
    frame = read_snapshot(store, info)
    assert frame.height == 1
    assert frame["chosen_episode_id"].item() == str(scored["win1"].episode_id)
    assert frame["rejected_episode_id"].item() == str(scored["loss1"].episode_id)


def test_training_lineage_view_reaches_the_episodes(
    migrated_engine, store, scored, tiny_base_model, tiny_settings
):
    info = build_snapshot(migrated_engine, store, kind="sft", qc_run_id=scored["qc_run_id"])
    run_id = start_training_run(
        migrated_engine, dataset_id=info.id, algo="sft", base_model="tiny", config={}
    )
    config = build_training_config(
        tiny_base_model,
        tools=BUILTIN_TOOLS.values(),
        settings=tiny_settings,
        algo="sft",
        dataset_id=info.id,
    )
    model_copy = store.root.parent / "model"
    model_copy.mkdir()
    for f in tiny_base_model.iterdir():
        (model_copy / f.name).write_bytes(f.read_bytes())
    checkpoint_id = save_checkpoint(
        migrated_engine, store, training_run_id=run_id, model_dir=model_copy, config=config
    )
    with migrated_engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT episode_id, role, weight, template FROM training_lineage "
                "WHERE checkpoint_id = :c ORDER BY weight DESC"
            ),
            {
                "c": checkpoint_id
                if migrated_engine.dialect.name == "postgresql"
                else checkpoint_id.hex
            },
        ).all()
    assert [(uuid.UUID(str(r[0])), r[1], r[2]) for r in rows] == [
        (scored["win1"].episode_id, "example", 0.9),
        (scored["win2"].episode_id, "example", 0.5),
    ]
    assert {r[3] for r in rows} == {"csv_to_json"}


def test_empty_selection_is_an_error(migrated_engine, store, scored):
    with pytest.raises(EmptySnapshot):
        build_snapshot(
            migrated_engine, store, kind="sft", qc_run_id=scored["qc_run_id"], verdicts=["discard"]
        )


def test_unknown_kind_and_missing_qc_run_are_errors(migrated_engine, store, scored):
    with pytest.raises(SnapshotError, match="unknown dataset kind"):
        build_snapshot(migrated_engine, store, kind="rlhf")
    with pytest.raises(SnapshotError, match="no qc_run"):
        build_snapshot(migrated_engine, store, kind="sft", qc_run_id=uuid.uuid4())


def test_tampered_snapshot_is_refused(migrated_engine, store, scored, tmp_path):
    info = build_snapshot(migrated_engine, store, kind="cpt", run_ids=[run_id_for("train-run")])
    assert info.n_rows == 4  # no gate: every episode with steps, failures included
    path = fetch_snapshot(store, info, tmp_path / "copy.parquet")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == info.sha256
    store.put(info.object_key, b"not parquet")
    with pytest.raises(SnapshotError, match="sha256"):
        read_snapshot(store, info)


def test_the_manifest_counts_unparsed_turns_cut_from_sft_rows(migrated_engine, store):
    """The `dataset` row (and so `epiflow_dataset.json`) says how many assistant turns the
    SFT rows left out because they did not parse."""
    from tests.training.factory import garbage_step

    recovered = episode(task=7, steps=[call_step(0, "ls"), garbage_step(1), final_step(2)])
    persist_episodes(migrated_engine, store, [recovered, episode(task=8)])
    info = build_snapshot(migrated_engine, store, kind="sft")
    assert info.manifest == {
        "episodes_cut": 1,
        "turns_after_unparsed_cut": 1,
        "unparsed_turns_cut": 1,
    }
    with Session(migrated_engine) as session:
        row = session.get(Dataset, info.id)
        assert row is not None and row.manifest == info.manifest
