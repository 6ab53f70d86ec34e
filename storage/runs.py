"""A collection run's lifecycle in SQL, the writes: open, close, what is left to run.

A run's id is derived from its key (`models.run_id_for`), and episode ids from the run key,
task and rollout, so re-running a key resumes it: `remaining_episodes` returns the planned
ids not stored yet, after purging the ones an infrastructure failure spoiled
(`RETRIED_STATUSES`: `env_error`, `storage_error`, `endpoint_error`) so they run again.

A run's status is `running`, `completed`, `failed` or `interrupted` (stopped by a signal;
re-running the key resumes it). A collection's status has one writer, its lifecycle
(`collection.lifecycle.Collection.end`); evaluation runs and imports close their own
rows. One exception: a run whose process is known dead and whose key nobody runs again
(a killed GRPO training's rollout run, keyed by the training run) is closed `interrupted`
by whoever found the process dead (`close_abandoned_run`, from
`training.registry.mark_crashed_training_runs`). Every read of a run is in
`storage.run_reads`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, false, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlmodel import col

from agent.trajectory import INFRASTRUCTURE_STATUSES
from core.errors import reason_line
from models import Artifact, CollectionRun, Episode, GrpoRollout, Step, run_id_for
from storage.db import SETTING as DATABASE_SETTING
from storage.errors import DatabaseUnavailable
from storage.rows import collection_run_row

RETRIED_STATUSES = INFRASTRUCTURE_STATUSES
"""Stored episodes that a re-run of their key runs again: an infrastructure failure (the
sandbox could not start or crashed, the object store could not take the episode's
objects, the model endpoint was down) says nothing about the policy, so it is never final."""

RUN_STATUSES = ("running", "completed", "failed", "interrupted")
"""Values of `collection_run.status`."""


def open_run(
    engine: Engine,
    *,
    run_key: str,
    suite: str,
    policy: str,
    parameters: dict[str, Any],
    sandbox_spec: dict[str, Any],
    fault_profile: dict[str, Any],
) -> uuid.UUID:
    """Create the `collection_run` row of `run_key`, or mark an existing one running again."""
    run_id = run_id_for(run_key)
    row = collection_run_row(
        run_key=run_key,
        suite=suite,
        policy=policy,
        parameters=json.loads(json.dumps(parameters, default=str)),
        sandbox_spec=sandbox_spec,
        fault_profile=fault_profile,
        started_at=datetime.now(UTC),
    )
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    with engine.begin() as conn:
        conn.execute(insert(CollectionRun).values(**row).on_conflict_do_nothing())
        conn.execute(
            update(CollectionRun)
            .where(col(CollectionRun.id) == run_id)
            .values(status="running", ended_at=None, parameters=row["parameters"])
        )
    return run_id


def close_run(
    engine: Engine, run_id: uuid.UUID, *, status: str, flow_run_id: str | None = None
) -> None:
    """Mark the run `completed`, `failed` or `interrupted` (with the Prefect flow run that
    ran it)."""
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}")
    values: dict[str, Any] = {"status": status, "ended_at": datetime.now(UTC)}
    if flow_run_id:
        values["prefect_flow_run_id"] = flow_run_id
    with engine.begin() as conn:
        conn.execute(update(CollectionRun).where(col(CollectionRun.id) == run_id).values(**values))


def close_abandoned_run(conn: Connection, run_key: str, *, ended_at: datetime) -> bool:
    """Mark the run of `run_key` `interrupted` when it is still `running`, in the caller's
    transaction; the caller knows its process is dead (a SIGKILL, the OOM killer: nothing
    could close it) and that no one runs the key again. Returns whether a row changed."""
    result = conn.execute(
        update(CollectionRun)
        .where(col(CollectionRun.id) == run_id_for(run_key), col(CollectionRun.status) == "running")
        .values(status="interrupted", ended_at=ended_at)
    )
    return bool(result.rowcount)


def remaining_episodes(engine: Engine, episode_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """The ids of `episode_ids` still to run; deletes stored episodes in `RETRIED_STATUSES`
    (rows, steps, artifact rows, GRPO rollout rows) so that they run again."""
    done: set[uuid.UUID] = set()
    retry: set[uuid.UUID] = set()
    ids = list(episode_ids)
    with engine.begin() as conn:
        for i in range(0, len(ids), 500):
            rows = conn.execute(
                select(col(Episode.id), col(Episode.status)).where(
                    col(Episode.id).in_(ids[i : i + 500])
                )
            ).all()
            for eid, status in rows:
                (retry if status in RETRIED_STATUSES else done).add(eid)
        targets = list(retry)
        for i in range(0, len(targets), 500):
            chunk = targets[i : i + 500]
            conn.execute(delete(Artifact).where(col(Artifact.episode_id).in_(chunk)))
            conn.execute(delete(GrpoRollout).where(col(GrpoRollout.episode_id).in_(chunk)))
            conn.execute(delete(Step).where(col(Step.episode_id).in_(chunk)))
            conn.execute(delete(Episode).where(col(Episode.id).in_(chunk)))
    return set(ids) - done


def check_writable(engine: Engine) -> None:
    """Raise unless this database takes writes (a read-only file, mount, role or replica
    fails here, before a run row exists). Writes nothing: the statement matches no row.

    Raises:
        DatabaseUnavailable: the database refuses writes (names EPIFLOW_DATABASE_URL).
    """
    try:
        with engine.begin() as conn:
            conn.execute(update(CollectionRun).where(false()).values(status=CollectionRun.status))
    except DBAPIError as e:
        reason = reason_line(str(e.orig or e), 300)
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseUnavailable(
            f"the database {where} does not take writes: {reason}", setting=DATABASE_SETTING
        ) from e
