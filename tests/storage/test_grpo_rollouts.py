"""`grpo_rollout` rows: written after their episodes, read per run, replaced on rewrite,
purged with an infrastructure episode that a re-run redoes (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from agent.trajectory import EpisodeStatus, FailureCategory
from models import GrpoRollout, run_id_for
from storage.episodes import persist_episodes
from storage.grpo_rollouts import (
    TemplateRollouts,
    grpo_rollouts_of_run,
    record_grpo_rollouts,
    rollout_run_figures,
)
from storage.objects import LocalObjectStore
from storage.runs import open_run, remaining_episodes
from tests.training.factory import call_step, episode, final_step

RUN_KEY = "grpo-rollouts-test"
START = datetime(2026, 1, 1, tzinfo=UTC)


def _row(t_id: uuid.UUID, *, version: int, fate: str, advantage: float | None) -> GrpoRollout:
    return GrpoRollout(
        episode_id=t_id,
        policy_version=version,
        group_index=0,
        task_id="builtin/csv_to_json@1#0-0000000000",
        group_fate=fate,
        reward=None if fate == "infrastructure" else 1.0,
        advantage=advantage,
        turn_advantages=None if advantage is None else [advantage, advantage + 0.25],
        sampled_tokens=12,
        observation_tokens=30,
    )


def test_rows_round_trip_and_go_with_a_purged_episode(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    open_run(
        migrated_engine,
        run_key=RUN_KEY,
        suite="builtin",
        policy="scripted:oracle",
        parameters={},
        sandbox_spec={},
        fault_profile={},
    )
    good = episode(run_key=RUN_KEY, rollout=0)
    broken = episode(run_key=RUN_KEY, rollout=1, success=False)
    broken.status, broken.failure_category = EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR
    persist_episodes(migrated_engine, store, [good, broken])

    rows = [
        _row(broken.episode_id, version=1, fate="infrastructure", advantage=None),
        _row(good.episode_id, version=1, fate="trained", advantage=0.7),
    ]
    assert record_grpo_rollouts(migrated_engine, rows) == 2
    assert record_grpo_rollouts(migrated_engine, rows[1:]) == 1  # rewritten, not doubled
    read = grpo_rollouts_of_run(migrated_engine, run_id_for(RUN_KEY))
    assert [(r.episode_id, r.group_fate, r.advantage) for r in read] == [
        (good.episode_id, "trained", 0.7),
        (broken.episode_id, "infrastructure", None),
    ]
    # Per-turn advantages (EPIFLOW_TRAINING_RETURNS_GAMMA) round-trip as a JSON array.
    assert [r.turn_advantages for r in read] == [[0.7, 0.95], None]

    # A re-run of the key redoes the infrastructure episode: its rows go with it.
    todo = remaining_episodes(migrated_engine, [good.episode_id, broken.episode_id])
    assert todo == {broken.episode_id}
    assert [r.episode_id for r in grpo_rollouts_of_run(migrated_engine, run_id_for(RUN_KEY))] == [
        good.episode_id
    ]


def test_rollout_run_figures_count_the_stored_rollouts_and_time_the_batches(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Two generation batches of two rollouts (policy versions 0 and 1), each batch 10 s
    from its first start to its last end, 30 sampled tokens an episode; a fifth episode of
    the run has no `grpo_rollout` row (an episode, not a rollout). The second batch is of
    `dir_tree`, one rollout failed, the other's jail did not start."""
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    trajectories = []
    for i in range(5):
        steps = [call_step(0, "ls"), final_step(1)]
        for step in steps:
            step.completion_tokens = 15
        template = "dir_tree" if i in (2, 3) else "csv_to_json"
        t = episode(
            run_key=RUN_KEY, task=i // 2, rollout=i % 2, steps=steps, template=template,
            success=i != 2,
        )  # fmt: skip
        if i == 3:
            t.status, t.failure_category = EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR
        started = START + timedelta(seconds=100 * (i // 2) + 4 * (i % 2))
        t.started_at, t.ended_at = started, started + timedelta(seconds=6)
        trajectories.append(t)
    persist_episodes(migrated_engine, store, trajectories)
    rows = [
        _row(t.episode_id, version=i // 2, fate="trained", advantage=0.0)
        for i, t in enumerate(trajectories[:4])
    ]
    record_grpo_rollouts(migrated_engine, rows)

    figures = rollout_run_figures(migrated_engine, run_id_for(RUN_KEY))

    assert (figures.rollouts_stored, figures.episodes_stored) == (4, 5)
    assert figures.sampled_tokens == 5 * 30
    assert figures.rollout_wall_s == 20.0  # 2 batches × (4 s apart + 6 s long)
    assert figures.rollout_tokens_per_s == 150 / 20.0
    # Per template: the rollouts (not the fifth episode), outcomes without the infrastructure one.
    assert figures.by_template == {
        "csv_to_json": TemplateRollouts(rollouts=2, outcomes=2, successes=2),
        "dir_tree": TemplateRollouts(rollouts=2, outcomes=1, successes=0),
    }
    assert figures.by_template["dir_tree"].success_rate == 0.0
    empty = rollout_run_figures(migrated_engine, uuid.uuid4())
    assert (empty.rollouts_stored, empty.episodes_stored, empty.rollout_tokens_per_s) == (
        0,
        0,
        None,
    )
