"""`replay_result`: an episode's recorded tool calls re-executed in a fresh jail, compared step by step."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class ReplayResult(SQLModel, table=True):
    """How reproducible an episode is: identical steps out of replayed steps."""

    __tablename__ = "replay_result"

    id: uuid.UUID = doc("Id of the replay.", primary_key=True)
    episode_id: uuid.UUID = fk(
        "Episode replayed.", "episode.id", nullable=False, ondelete="CASCADE"
    )
    steps: int = doc("Tool-call steps replayed.")
    identical_steps: int = doc("Steps whose exit code, outputs, files changed and fault matched.")
    first_divergence: dict[str, Any] | None = json_col(
        "First differing step: {step, field, recorded, replayed}; NULL when identical.",
        nullable=True,
    )
    created_at: datetime = time_col("When the replay ran (UTC).", index=True)
