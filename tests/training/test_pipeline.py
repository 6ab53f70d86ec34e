"""The closed loop on SQLite: base model → snapshot → SFT checkpoint → hf: policy in real sandboxes.

One end-to-end test (slow) plus the failure bookkeeping. The lineage view is covered on
PostgreSQL too in test_snapshots.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session, select

from agent.trajectory import Trajectory
from collection.evaluation import evaluation_settings, run_model_evaluation
from config.settings import load_settings
from models import Checkpoint, QcResult, QcRun, TrainingRun, run_id_for
from sandbox.tool_specs import BUILTIN_TOOLS
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from suites.builtin import builtin_suite
from tasks.types import TaskInstance
from tests.training.factory import call_step, episode, final_step
from training.errors import TrainerError
from training.evaluation import EvaluationMetrics, compare_metrics, evaluation_metrics
from training.pipeline import prepare_base_model, train_checkpoint
from training.registry import (
    fetch_checkpoint,
    get_checkpoint,
    load_training_config,
    previous_checkpoint,
    record_evaluation,
)
from training.snapshots import build_snapshot
from training.training_config import check_deployment


def _collected(engine: Engine, store: LocalObjectStore, *, with_failures: bool = True) -> uuid.UUID:
    """Three tasks, a win and (optionally) a failure each, persisted and gated; the QC run id."""
    trajectories = []
    for task in range(3):
        trajectories.append(
            episode(
                task=task,
                rollout=0,
                steps=[call_step(0, "ls"), call_step(1, "cat data.csv"), final_step(2)],
            )
        )
        if with_failures:
            trajectories.append(
                episode(
                    task=task,
                    rollout=1,
                    success=False,
                    steps=[call_step(0, "ls"), final_step(1, "no")],
                )
            )
    persist_episodes(engine, store, trajectories)
    qc_run_id = uuid.uuid4()
    with Session(engine) as session:
        session.add(
            QcRun(id=qc_run_id, run_id=run_id_for("train-run"), n_episodes=len(trajectories))
        )
        session.flush()
        for t in trajectories:
            session.add(
                QcResult(
                    qc_run_id=qc_run_id, episode_id=t.episode_id, verdict="keep", quality_score=0.8
                )
            )
        session.commit()
    return qc_run_id


@pytest.mark.slow
def test_train_register_fetch_and_evaluate_in_sandboxes(
    engine, store, tmp_path, tiny_corpus, tiny_settings
):
    base_id = prepare_base_model(
        engine, store, work_dir=tmp_path / "b", corpus=tiny_corpus, settings=tiny_settings
    )
    assert get_checkpoint(engine, base_id).training_run_id is None
    info = build_snapshot(engine, store, kind="sft", qc_run_id=_collected(engine, store))

    outcome = train_checkpoint(
        engine,
        store,
        algo="sft",
        dataset_id=info.id,
        base_checkpoint_id=base_id,
        work_dir=tmp_path / "t",
        settings=tiny_settings,
    )
    checkpoint = get_checkpoint(engine, outcome.checkpoint_id)
    assert checkpoint.training_run_id == outcome.training_run_id
    assert checkpoint.parent_checkpoint_id == base_id
    assert checkpoint.metrics["steps"] == tiny_settings.max_steps
    with Session(engine) as session:
        run = session.get(TrainingRun, outcome.training_run_id)
        assert run is not None and run.status == "completed" and run.ended_at is not None
        assert (
            run.metrics["tokens"] > 0
            and run.config["sft_learning_rate"] == tiny_settings.sft_learning_rate
        )

    # the training config says what deployment must show the model
    config = load_training_config(engine, store, outcome.checkpoint_id)
    assert config.dataset_id == info.id and config.algo == "sft"
    assert check_deployment(config, BUILTIN_TOOLS.values()) == []
    assert check_deployment(config, [BUILTIN_TOOLS["read_file"]]) != []

    # lineage: checkpoint → run → dataset → the three successful episodes
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT COUNT(DISTINCT episode_id) FROM training_lineage WHERE checkpoint_id = :c"
            ),
            {"c": outcome.checkpoint_id.hex},
        ).scalar_one()
    assert n == 3

    # the checkpoint, fetched from the store, is an hf: policy in real nsjail sandboxes
    model_dir = fetch_checkpoint(engine, store, outcome.checkpoint_id, tmp_path / "fetched")
    tasks = builtin_suite().heldout_instances(1, templates=["csv_to_json", "dir_tree"])
    metrics, trajectories = _evaluate(engine, store, model_dir, tasks, run_key="eval")
    assert metrics.n_episodes == 2 and len(trajectories) == 2
    assert all(t.policy == f"hf:{model_dir}" for t in trajectories)
    assert all(t.n_steps >= 1 and t.steps[0].raw_output for t in trajectories)
    assert 0.0 <= metrics.completion_rate <= 1.0 and 0.0 <= metrics.tool_failure_rate <= 1.0
    assert 1.0 <= metrics.avg_steps <= 2.0

    previous = previous_checkpoint(engine, outcome.checkpoint_id)
    assert previous == base_id
    base_dir = fetch_checkpoint(engine, store, base_id, tmp_path / "base")
    base_metrics, _ = _evaluate(engine, store, base_dir, tasks, run_key="eval-base")
    delta = compare_metrics(metrics, base_metrics)
    assert set(delta) == {"completion_rate", "avg_steps", "tool_failure_rate"}
    record_evaluation(engine, outcome.checkpoint_id, {**metrics.model_dump(), "delta": delta})
    assert get_checkpoint(engine, outcome.checkpoint_id).evaluation["n_episodes"] == 2


def _evaluate(
    engine: Engine,
    store: LocalObjectStore,
    model_dir: Path,
    tasks: list[TaskInstance],
    *,
    run_key: str,
) -> tuple[EvaluationMetrics, list[Trajectory]]:
    """The checkpoint at `model_dir` on `tasks` (two turns of 12 tokens), as an evaluation
    collection run stored in `engine`: its metrics and episodes."""
    settings = evaluation_settings(load_settings(), max_steps=2)
    trajectories = asyncio.run(
        run_model_evaluation(
            model_dir,
            tasks,
            run_key=run_key,
            suite="builtin",
            settings=settings,
            max_new_tokens=12,
            engine=engine,
            store=store,
        )
    )
    with engine.connect() as conn:  # a run like any collection: ended, every episode stored
        status, stored = conn.execute(
            text(
                "SELECT r.status, COUNT(e.id) FROM collection_run r "
                "JOIN episode e ON e.run_id = r.id WHERE r.run_key = :k GROUP BY r.status"
            ),
            {"k": run_key},
        ).one()
    assert (status, stored) == ("completed", len(tasks))
    return evaluation_metrics(trajectories, tasks), trajectories


def test_failed_training_is_recorded(engine, store, tmp_path, tiny_base_model, tiny_settings):
    qc_run_id = _collected(engine, store, with_failures=False)
    info = build_snapshot(engine, store, kind="kto", qc_run_id=qc_run_id)
    with pytest.raises(TrainerError, match="trains on sft"):
        train_checkpoint(
            engine,
            store,
            algo="sft",
            dataset_id=info.id,
            base_model_dir=tiny_base_model,
            work_dir=tmp_path,
            settings=tiny_settings,
        )
    with Session(engine) as session:
        assert session.exec(select(TrainingRun)).all() == []  # refused before a run started

    # only desirable examples: KTO fails inside the trainer, the run records why
    with pytest.raises(TrainerError, match="both desirable and undesirable"):
        train_checkpoint(
            engine,
            store,
            algo="kto",
            dataset_id=info.id,
            base_model_dir=tiny_base_model,
            work_dir=tmp_path,
            settings=tiny_settings,
        )
    with Session(engine) as session:
        runs = session.exec(select(TrainingRun)).all()
        assert [(r.status, r.algo, r.dataset_id) for r in runs] == [("failed", "kto", info.id)]
        assert runs[0].error is not None and "both desirable" in runs[0].error
        assert runs[0].ended_at is not None
        assert session.exec(select(Checkpoint)).all() == []
