"""`grpo_rollout` rows: each GRPO rollout's group, policy version, advantage and fate.

Written once per generation batch, after its episodes are stored and before the optimiser
step that trains on them (`collection.grpo_rollouts`); one transaction per batch. A row
written again (the same episode) is replaced, so recording is idempotent.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, col

from core.errors import reason_line
from models import Episode, GrpoRollout
from storage.errors import IngestError

__all__ = ["grpo_rollouts_of_run", "record_grpo_rollouts", "rollout_run_key"]


def rollout_run_key(training_run_key: str) -> str:
    """The collection run key of a training run's rollouts (one rollout run per training
    run; `training.registry` closes it when it finds the training's process dead)."""
    return f"grpo-rollouts-{training_run_key}"


def record_grpo_rollouts(engine: Engine, rows: Sequence[GrpoRollout]) -> int:
    """Write `rows` (their episodes are stored) in one transaction; returns how many.

    Raises:
        IngestError: the transaction failed (nothing of it was committed).
    """
    if not rows:
        return 0
    ids = [r.episode_id for r in rows]
    try:
        with Session(engine) as session, session.begin():
            session.execute(delete(GrpoRollout).where(col(GrpoRollout.episode_id).in_(ids)))
            session.add_all([GrpoRollout.model_validate(r.model_dump()) for r in rows])
    except DBAPIError as e:
        raise IngestError(
            f"cannot record {len(rows)} GRPO rollout row(s): {reason_line(str(e))}"
        ) from e
    return len(rows)


def grpo_rollouts_of_run(engine: Engine, run_id: uuid.UUID) -> list[GrpoRollout]:
    """The `grpo_rollout` rows of the collection run `run_id`'s episodes, by policy
    version, group and episode."""
    with Session(engine) as session:
        rows = session.execute(
            select(GrpoRollout)
            .join(Episode, col(Episode.id) == col(GrpoRollout.episode_id))
            .where(col(Episode.run_id) == run_id)
            .order_by(
                col(GrpoRollout.policy_version),
                col(GrpoRollout.group_index),
                col(Episode.rollout_index),
            )
        ).scalars()
        return [GrpoRollout.model_validate(r.model_dump()) for r in rows]
