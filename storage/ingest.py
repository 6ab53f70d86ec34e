"""Bulk ingest of episodes with their steps and artifacts, idempotent on episode id.

PostgreSQL gets `COPY … FROM STDIN` for episodes, steps and artifacts; SQLite gets
`executemany`. One transaction per batch: a failure leaves nothing of the batch behind.
Episodes already present are skipped and reported, so a second ingest changes nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from pydantic import BaseModel, Field
from sqlalchemy import Connection, Engine, Table, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import col

from agent.trajectory import Trajectory
from models import Artifact, CollectionRun, Episode, Policy, Step, Task
from storage.errors import IngestError
from storage.objects import ObjectInfo
from storage.rows import episode_row, policy_row, run_row, step_row, task_row


class ArtifactRef(BaseModel):
    """An object already written to the store, to be recorded with its episode."""

    info: ObjectInfo
    """What was written."""
    kind: str
    """trajectory, stdout, stderr, …"""
    step_index: int | None = None
    """The step whose output it is, for stdout/stderr objects."""


class EpisodeBundle(BaseModel):
    """One episode ready for ingest: the trajectory and the objects already written for it."""

    trajectory: Trajectory
    """The episode."""
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    """Objects in the store that its rows will point at."""


class IngestReport(BaseModel):
    """What an ingest did."""

    inserted: list[uuid.UUID] = Field(default_factory=list)
    """Episodes written by this call."""
    skipped_existing: list[uuid.UUID] = Field(default_factory=list)
    """Episodes already in the database; left unchanged."""
    steps: int = 0
    """Step rows written."""

    def summary(self) -> str:
        return (
            f"{len(self.inserted)} episode(s) and {self.steps} step(s) written, "
            f"{len(self.skipped_existing)} already present (unchanged)"
        )


def existing_episode_ids(conn: Connection, ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    wanted = list(ids)
    found: set[uuid.UUID] = set()
    for i in range(0, len(wanted), 500):
        chunk = wanted[i : i + 500]
        found.update(
            conn.execute(select(col(Episode.id)).where(col(Episode.id).in_(chunk))).scalars()
        )
    return found


def ingest_episodes(engine: Engine, bundles: Sequence[EpisodeBundle]) -> IngestReport:
    """Write episodes, steps and artifact rows in one transaction; skip episodes already present.

    Raises:
        IngestError: the batch could not be written (nothing of it was committed).
    """
    report = IngestReport()
    if not bundles:
        return report
    try:
        with engine.begin() as conn:
            present = existing_episode_ids(conn, (b.trajectory.episode_id for b in bundles))
            fresh: dict[uuid.UUID, EpisodeBundle] = {}
            for b in bundles:
                eid = b.trajectory.episode_id
                if eid in present or eid in fresh:
                    report.skipped_existing.append(eid)
                else:
                    fresh[eid] = b
            if not fresh:
                return report
            todo = list(fresh.values())
            _insert_missing(conn, Task.__table__, [task_row(b.trajectory) for b in todo])  # type: ignore[attr-defined]
            _insert_missing(conn, Policy.__table__, [policy_row(b.trajectory) for b in todo])  # type: ignore[attr-defined]
            _insert_missing(conn, CollectionRun.__table__, [run_row(b.trajectory) for b in todo])  # type: ignore[attr-defined]
            episodes, steps, artifacts = _rows(todo)
            _bulk(conn, Episode.__table__, episodes)  # type: ignore[attr-defined]
            _bulk(conn, Step.__table__, steps)  # type: ignore[attr-defined]
            _bulk(conn, Artifact.__table__, artifacts)  # type: ignore[attr-defined]
            report.inserted = list(fresh)
            report.steps = len(steps)
    except (IntegrityError, psycopg.errors.IntegrityError) as e:
        raise IngestError(
            f"ingest of {len(bundles)} episode(s) conflicted with rows written concurrently; "
            f"nothing was committed, retry the batch: {_first_line(e)}"
        ) from e
    except (DBAPIError, psycopg.Error) as e:
        raise IngestError(
            f"ingest of {len(bundles)} episode(s) failed, nothing was committed: {_first_line(e)}"
        ) from e
    return report


def _first_line(e: Exception) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _rows(
    bundles: Sequence[EpisodeBundle],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    episodes: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    artifacts: list[dict[str, Any]] = []
    for b in bundles:
        t = b.trajectory
        trajectory_key = next((a.info.key for a in b.artifacts if a.kind == "trajectory"), None)
        outputs: dict[int, dict[str, str]] = {}
        for a in b.artifacts:
            if a.step_index is not None:
                outputs.setdefault(a.step_index, {})[a.kind] = a.info.key
        episodes.append(episode_row(t, trajectory_key=trajectory_key))
        steps.extend(step_row(t.episode_id, s, output_keys=outputs.get(s.index)) for s in t.steps)
        run_id = episodes[-1]["run_id"]
        artifacts.extend(
            {
                "key": a.info.key,
                "kind": a.kind,
                "run_id": run_id,
                "episode_id": t.episode_id,
                "size": a.info.size,
                "sha256": a.info.sha256,
                "content_type": a.info.content_type,
                "created_at": t.ended_at or t.started_at,
            }
            for a in b.artifacts
        )
    return episodes, steps, artifacts


def _insert_missing(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """INSERT … ON CONFLICT DO NOTHING (parents shared by many episodes: task, policy, run)."""
    unique = list({r["id"]: r for r in rows}.values())
    if not unique:
        return
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.execute(pg_insert(table).on_conflict_do_nothing(), unique)
    elif dialect == "sqlite":
        conn.execute(sqlite_insert(table).on_conflict_do_nothing(), unique)
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        existing = set(
            conn.execute(
                select(table.c.id).where(table.c.id.in_([r["id"] for r in unique]))
            ).scalars()
        )
        conn.execute(insert(table), [r for r in unique if r["id"] not in existing])


def _bulk(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        copy_rows(conn, table, rows)
    else:
        conn.execute(insert(table), rows)


def copy_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """COPY rows into `table` through the connection's psycopg cursor (same transaction)."""
    columns = [c.name for c in table.columns]
    json_columns = {
        c.name
        for c in table.columns
        if c.type.__class__.__name__ in ("JSON", "JSONB") or "JSON" in repr(c.type)
    }
    raw = conn.connection.driver_connection
    sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
    with raw.cursor() as cur, cur.copy(sql) as copy:  # type: ignore[union-attr]
        for row in rows:
            copy.write_row([_copy_value(row.get(c), c in json_columns) for c in columns])


def _copy_value(value: Any, is_json: bool) -> Any:
    if value is None:
        return None
    if is_json:
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
