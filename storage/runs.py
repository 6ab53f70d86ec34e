"""Collection runs in SQL: open, close, what is left to run, counts, lookup, trajectories.

A run's id is derived from its key (`models.run_id_for`), and episode ids from the run key,
task and rollout, so re-running a key resumes it: `remaining_episodes` returns the planned
ids not stored yet, after purging the ones an infrastructure failure spoiled
(`RETRIED_STATUSES`: `env_error`, `storage_error`, `endpoint_error`) so they run again.

A run's status is `running`, `completed`, `failed` or `interrupted` (stopped by a signal;
re-running the key resumes it). `rerun_needed` says how many of a run's episodes a re-run
would redo, and why.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, delete, false, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlmodel import col

from agent.trajectory import INFRASTRUCTURE_STATUSES, Trajectory
from models import Artifact, CollectionRun, Episode, Step, run_id_for
from storage.db import SETTING as DATABASE_SETTING
from storage.episodes import load_trajectory
from storage.errors import DatabaseUnavailable, RunNotFound
from storage.objects import ObjectStore

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
    row = {
        "id": run_id,
        "run_key": run_key,
        "suite": suite,
        "policy_id": policy,
        "parameters": json.loads(json.dumps(parameters, default=str)),
        "sandbox_spec": sandbox_spec,
        "fault_profile": fault_profile,
        "status": "running",
        "prefect_flow_run_id": None,
        "started_at": datetime.now(UTC),
        "ended_at": None,
    }
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


def remaining_episodes(engine: Engine, episode_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """The ids of `episode_ids` still to run; deletes stored episodes in `RETRIED_STATUSES`
    (rows, steps, artifact rows) so that they run again."""
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
        reason = str(e.orig or e).strip().splitlines()[0][:300]
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseUnavailable(
            f"the database {where} does not take writes: {reason}", setting=DATABASE_SETTING
        ) from e


class RerunNeeded(BaseModel):
    """Episodes of a run that a re-run of its key would redo, by status."""

    count: int
    """How many."""
    reason: str | None
    """The most frequent failure reason among them (one line)."""


def rerun_needed(engine: Engine, run_id: uuid.UUID) -> dict[str, RerunNeeded]:
    """The run's stored episodes in `RETRIED_STATUSES`, by status, with their most
    frequent reason."""
    retried = sorted(str(s) for s in RETRIED_STATUSES)
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Episode.status), col(Episode.failure_reason), func.count())
            .where(col(Episode.run_id) == run_id, col(Episode.status).in_(retried))
            .group_by(col(Episode.status), col(Episode.failure_reason))
        ).all()
    out: dict[str, RerunNeeded] = {}
    top: dict[str, int] = {}
    for status, reason, n in rows:
        entry = out.setdefault(str(status), RerunNeeded(count=0, reason=None))
        entry.count += int(n)
        if int(n) > top.get(str(status), 0):
            top[str(status)] = int(n)
            entry.reason = (reason or "").strip().splitlines()[0][:200] if reason else None
    return out


def run_flow_run_id(engine: Engine, run_id: uuid.UUID) -> str | None:
    """The Prefect flow run recorded on the run (set when the flow closes it)."""
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.prefect_flow_run_id)).where(col(CollectionRun.id) == run_id)
        ).scalar_one_or_none()
    return str(found) if found else None


def run_status(engine: Engine, run_id: uuid.UUID) -> str | None:
    """The run's status; None when it has no row."""
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.status)).where(col(CollectionRun.id) == run_id)
        ).scalar_one_or_none()
    return str(found) if found is not None else None


def run_counts(engine: Engine, run_id: uuid.UUID) -> dict[str, int]:
    """Stored episodes of the run by status."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Episode.status), func.count())
            .where(col(Episode.run_id) == run_id)
            .group_by(col(Episode.status))
        ).all()
    return {str(status): int(n) for status, n in rows}


def run_totals(engine: Engine, run_id: uuid.UUID) -> tuple[int, int]:
    """(episodes, steps) of the run stored so far, whatever wrote them."""
    with engine.connect() as conn:
        episodes, steps = conn.execute(
            select(func.count(), func.coalesce(func.sum(col(Episode.n_steps)), 0)).where(
                col(Episode.run_id) == run_id
            )
        ).one()
    return int(episodes), int(steps)


def resolve_run(engine: Engine, run: str) -> uuid.UUID:
    """The id of the run whose key, or id, is `run`.

    Raises:
        RunNotFound: no collection run has that key or id.
    """
    with engine.connect() as conn:
        found = conn.execute(
            select(col(CollectionRun.id)).where(col(CollectionRun.run_key) == run)
        ).scalar_one_or_none()
        if found is None:
            try:
                candidate = uuid.UUID(run)
            except ValueError:
                candidate = None
            if candidate is not None:
                found = conn.execute(
                    select(col(CollectionRun.id)).where(col(CollectionRun.id) == candidate)
                ).scalar_one_or_none()
    if found is None:
        raise RunNotFound(f"--run {run!r}: no collection run with that key or id", setting="--run")
    return found


def run_key_of(engine: Engine, run_id: uuid.UUID) -> str:
    """The key of run `run_id`."""
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(col(CollectionRun.run_key)).where(col(CollectionRun.id) == run_id)
            ).scalar_one()
        )


def run_sandbox_spec(engine: Engine, run_key: str) -> dict[str, Any] | None:
    """The sandbox spec run `run_key` recorded; None when the run has no row or no spec."""
    with engine.connect() as conn:
        spec = conn.execute(
            select(col(CollectionRun.sandbox_spec)).where(
                col(CollectionRun.id) == run_id_for(run_key)
            )
        ).scalar_one_or_none()
    return dict(spec) if spec else None


def run_episode_ids(engine: Engine, run_id: uuid.UUID) -> list[uuid.UUID]:
    """Ids of the run's episodes that have a stored trajectory, in start order."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(col(Episode.id))
                .where(col(Episode.run_id) == run_id, col(Episode.trajectory_key).is_not(None))
                .order_by(col(Episode.started_at), col(Episode.id))
            ).scalars()
        )


def run_trajectories(engine: Engine, store: ObjectStore, run_id: uuid.UUID) -> list[Trajectory]:
    """Every stored trajectory of the run, in start order."""
    return [load_trajectory(engine, store, eid) for eid in run_episode_ids(engine, run_id)]


def sample_episode(engine: Engine, run_id: uuid.UUID, *, success: bool) -> str | None:
    """The id of one successful (or one unsuccessful) episode of the run, the first by
    template and id; None when there is none."""
    query = select(col(Episode.id)).where(col(Episode.run_id) == run_id)
    query = query.where(
        col(Episode.status) == "success" if success else col(Episode.status) != "success"
    )
    with engine.connect() as conn:
        found = conn.execute(
            query.order_by(col(Episode.template), col(Episode.id)).limit(1)
        ).scalar_one_or_none()
    return str(found) if found else None
