"""`harbor_episode` and `harbor_test`: what a Harbor task's verifier reported, per episode.

One `harbor_episode` row per episode of a Harbor task (`suites/harbor/`): the task's
metadata as columns to group by (difficulty label, category, tags), the image it ran in
and every substitution made to run it here, the reward file's keys; one `harbor_test` row
per test of its CTRF report (`/logs/verifier/ctrf.json`, also stored as an object with its
`artifact` row).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col


class HarborEpisode(SQLModel, table=True):
    """The Harbor side of one episode."""

    __tablename__ = "harbor_episode"

    episode_id: uuid.UUID = fk(
        "The episode.", "episode.id", nullable=False, ondelete="CASCADE", primary_key=True
    )
    task_name: str = doc("Harbor task name (`[task] name` or the directory name).", index=True)
    task_version: str = doc("The task's version from task.toml.")
    content_hash: str = doc("sha256 of the task directory (every file).", index=True)
    difficulty: str = doc("task.toml metadata.difficulty (easy, medium, hard…).", index=True)
    category: str = doc("task.toml metadata.category.", index=True)
    tags: list[str] = json_col("task.toml metadata.tags.", factory=list)
    image_digest: str = doc("Digest of the image the episode ran in.", index=True)
    substitutions: list[str] = json_col(
        "What was mapped or ignored to run the task here (base image → Debian release, …).",
        factory=list,
    )
    reward: dict[str, Any] = json_col("Every key of reward.txt / reward.json.")
    reward_source: str = doc("reward.txt or reward.json; empty when neither was written.")
    test_sh_exit_code: int | None = doc("Exit code of tests/test.sh.", default=None)
    tests_total: int = doc("Tests in the CTRF report (0 without one).", default=0)
    tests_passed: int = doc("Tests that passed.", default=0)
    build_s: float = doc("Seconds the image's build took (when it was built).", default=0.0)
    verify_s: float | None = doc("Seconds the verifier took (export, jail, test.sh).", default=None)


class HarborTest(SQLModel, table=True):
    """One test of an episode's CTRF report."""

    __tablename__ = "harbor_test"

    episode_id: uuid.UUID = fk(
        "The episode.", "episode.id", nullable=False, ondelete="CASCADE", primary_key=True
    )
    index: int = doc("Position in the CTRF report.", primary_key=True)
    name: str = text_col("Test name (e.g. test_outputs.py::test_data).")
    status: str = doc("passed, failed, skipped, pending or other.", index=True)
    duration_ms: float | None = doc("Duration reported by CTRF, milliseconds.", default=None)
    message: str = text_col("Failure message or trace (clipped to 2000 characters).")
