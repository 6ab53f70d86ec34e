"""Replay results in SQL: one `replay_result` row per replay of an episode."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, insert

from agent.trajectory import utcnow
from models import ReplayResult


def record_replay(
    engine: Engine,
    *,
    episode_id: uuid.UUID,
    steps: int,
    identical_steps: int,
    first_divergence: dict[str, Any] | None,
) -> uuid.UUID:
    """Store one replay's comparison (`reproducibility_by_suite` reads them); returns its id."""
    replay_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            insert(ReplayResult).values(
                id=replay_id,
                episode_id=episode_id,
                steps=steps,
                identical_steps=identical_steps,
                first_divergence=first_divergence,
                created_at=utcnow(),
            )
        )
    return replay_id
