"""`grpo_rollout` rows: written after their episodes, read per run, replaced on rewrite,
purged with an infrastructure episode that a re-run redoes (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import Engine

from agent.trajectory import EpisodeStatus, FailureCategory
from models import GrpoRollout, run_id_for
from storage.episodes import persist_episodes
from storage.grpo_rollouts import grpo_rollouts_of_run, record_grpo_rollouts
from storage.objects import LocalObjectStore
from storage.runs import open_run, remaining_episodes
from tests.training.factory import episode

RUN_KEY = "grpo-rollouts-test"


def _row(t_id: uuid.UUID, *, version: int, fate: str, advantage: float | None) -> GrpoRollout:
    return GrpoRollout(
        episode_id=t_id,
        policy_version=version,
        group_index=0,
        task_id="builtin/csv_to_json@1#0-0000000000",
        group_fate=fate,
        reward=None if fate == "infrastructure" else 1.0,
        advantage=advantage,
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

    # A re-run of the key redoes the infrastructure episode: its rows go with it.
    todo = remaining_episodes(migrated_engine, [good.episode_id, broken.episode_id])
    assert todo == {broken.episode_id}
    assert [r.episode_id for r in grpo_rollouts_of_run(migrated_engine, run_id_for(RUN_KEY))] == [
        good.episode_id
    ]
