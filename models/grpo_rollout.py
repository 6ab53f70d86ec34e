"""`grpo_rollout`: what GRPO made of an episode that was one of its rollouts.

A rollout of agentic GRPO is an ordinary episode of the training run's collection run
(`episode`, `step`, the trajectory object with its token ids and logprobs); this row adds
what only the trainer knows: which group it was in, which policy version sampled it, its
advantage (and, with per-turn returns, each turn's: one float per turn, so a JSON cell,
not an object), and whether its group was trained or dropped (and why). Written once the group
is judged, before the optimiser step that uses it.
"""

from __future__ import annotations

import uuid

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col


class GrpoRollout(SQLModel, table=True):
    """An episode's place in GRPO: group, policy version, advantage, fate."""

    __tablename__ = "grpo_rollout"

    episode_id: uuid.UUID = fk(
        "The episode the rollout is.",
        "episode.id",
        nullable=False,
        ondelete="CASCADE",
        primary_key=True,
    )
    training_run_id: uuid.UUID | None = fk(
        "Training run whose trainer asked for the rollout; NULL when none was registered.",
        "training_run.id",
        ondelete="SET NULL",
        index=True,
    )
    policy_version: int = doc(
        "Optimiser steps the sampling policy had taken (0: the starting weights).", index=True
    )
    group_index: int = doc("Position of the rollout's group in its generation batch (0-based).")
    task_id: str = doc("Task every rollout of the group worked on.")
    group_fate: str = doc(
        "`trained`, or why the group was dropped before the optimiser step: "
        "`infrastructure` (a rollout ended env_error, storage_error or endpoint_error) or "
        "`zero_variance` (every rollout got the same reward).",
        index=True,
    )
    reward: float | None = doc(
        "The reward GRPO used: the episode's total_reward; NULL for an infrastructure outcome.",
        default=None,
    )
    advantage: float | None = doc(
        "Group-normalised advantage the loss used (with per-turn returns: its first turn's); "
        "NULL when the group was dropped.",
        default=None,
    )
    sampled_tokens: int | None = doc(
        "Completion tokens the model sampled (in the loss when the group is trained); NULL "
        "when the episode recorded no token ids.",
        default=None,
    )
    observation_tokens: int | None = doc(
        "Tokens the environment wrote between turns (never in the loss); NULL when the "
        "episode recorded no token ids.",
        default=None,
    )
    turn_advantages: list[float] | None = json_col(
        "With per-turn returns (EPIFLOW_TRAINING_RETURNS_GAMMA), the advantage the loss gave "
        "each assistant turn's tokens, in step order; NULL without them or when not trained.",
        nullable=True,
    )
