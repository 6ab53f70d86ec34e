"""`grpo_rollout` rows: each GRPO rollout's group, policy version, advantage and fate.

Written once per generation batch, after its episodes are stored and before the optimiser
step that trains on them (`collection.grpo_rollouts`); one transaction per batch. A row
written again (the same episode) is replaced, so recording is idempotent.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, col

from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus
from core.errors import reason_line
from models import Episode, GrpoRollout
from storage.errors import IngestError

__all__ = [
    "RolloutRunFigures",
    "TemplateRollouts",
    "grpo_rollouts_of_run",
    "record_grpo_rollouts",
    "rollout_run_figures",
    "rollout_run_key",
]


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


class TemplateRollouts(BaseModel):
    """One template's stored rollouts of a GRPO rollout run."""

    rollouts: int
    """Rollouts (`grpo_rollout` rows) of the template."""
    outcomes: int
    """Those that ended with an outcome (infrastructure failures aside)."""
    successes: int
    """Those that succeeded."""

    @property
    def success_rate(self) -> float | None:
        """successes / outcomes; None without an outcome."""
        return self.successes / self.outcomes if self.outcomes else None


class RolloutRunFigures(BaseModel):
    """What SQL holds of a GRPO rollout run (`rollout_run_figures`)."""

    rollouts_stored: int
    """`grpo_rollout` rows of the run's episodes."""
    episodes_stored: int
    """`episode` rows of the run."""
    sampled_tokens: int
    """Tokens the policy sampled over the run's episodes (`episode.completion_tokens`)."""
    rollout_wall_s: float
    """Wall time of the generation batches: per policy version, its first episode's start
    to its last episode's end (sandboxes, tools and verifier included), summed."""
    by_template: dict[str, TemplateRollouts] = {}
    """The stored rollouts per task template: what the run's task draw
    (`TrainingSettings.task_sampling`) spent its groups on, and how they ended."""

    @property
    def rollout_tokens_per_s(self) -> float | None:
        """Sampled tokens per second of `rollout_wall_s` (None before any batch)."""
        return self.sampled_tokens / self.rollout_wall_s if self.rollout_wall_s > 0 else None


def rollout_run_figures(engine: Engine, run_id: uuid.UUID) -> RolloutRunFigures:
    """The stored rollouts and episodes of the rollout run `run_id`, the tokens its policy
    sampled, and its generation batches' wall time."""
    with Session(engine) as session:
        episodes = session.execute(
            select(
                col(Episode.id),
                col(Episode.started_at),
                col(Episode.ended_at),
                col(Episode.completion_tokens),
                col(Episode.template),
                col(Episode.status),
            ).where(col(Episode.run_id) == run_id)
        ).all()
        versions = dict(
            session.execute(
                select(col(GrpoRollout.episode_id), col(GrpoRollout.policy_version))
                .join(Episode, col(Episode.id) == col(GrpoRollout.episode_id))
                .where(col(Episode.run_id) == run_id)
            ).all()
        )
    spans: dict[int, list[datetime]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for episode_id, started, ended, _, template, status in episodes:
        version = versions.get(episode_id)
        if version is None:
            continue
        if started is not None and ended is not None:
            spans[int(version)] += [started, ended]
        seen = counts[str(template)]
        seen[0] += 1
        if status not in INFRASTRUCTURE_STATUSES:  # StrEnum: equal to the stored strings
            seen[1] += 1
            seen[2] += status == EpisodeStatus.SUCCESS
    return RolloutRunFigures(
        rollouts_stored=len(versions),
        episodes_stored=len(episodes),
        sampled_tokens=sum(int(row[3] or 0) for row in episodes),
        rollout_wall_s=sum((max(ts) - min(ts)).total_seconds() for ts in spans.values()),
        by_template={
            t: TemplateRollouts(rollouts=n, outcomes=o, successes=s)
            for t, (n, o, s) in sorted(counts.items())
        },
    )
