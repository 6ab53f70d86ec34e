"""Bulk ingest of episodes with their steps and artifacts, idempotent on episode id.

PostgreSQL gets `COPY … FROM STDIN` for episodes, steps and artifacts, streamed: each row
is built from its trajectory as it is written, so the server stores earlier rows while
later ones are being built (the COPY is server-bound; building every row first and
copying afterwards made the two wait for each other). Rows are built once: step rows
straight as COPY values (`storage.rows.step_values`), JSON columns cleaned and
serialized in one step (`storage.sanitize.json_text`, orjson). A collection builds each
episode's episode and step rows where the episode finishes (`EpisodeBundle.rows`,
`rows_for`), so the one writer only copies them and puts in the object keys. Parents (task, policy,
run) go in with one statement per table. SQLite gets `executemany`. One transaction per batch: a failure leaves
nothing of the batch behind. Episodes already present are skipped and reported, so a
second ingest changes nothing.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, Engine, Table, insert, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import col

from agent.trajectory import Trajectory
from core.errors import reason_line
from models import Artifact, CollectionRun, Episode, Policy, Step, Task
from models.artifact import ArtifactKind
from storage.errors import IngestError
from storage.objects import ObjectInfo
from storage.rows import (
    STEP_COLUMNS,
    EpisodeRows,
    JsonFinisher,
    episode_row,
    policy_row,
    prepare_rows,
    recorded_at,
    run_id_of,
    run_row,
    step_values,
    task_row,
    with_output_keys,
)
from storage.sanitize import clean_json, json_text


class ArtifactRef(BaseModel):
    """An object already written to the store, to be recorded with its episode."""

    info: ObjectInfo
    """What was written."""
    kind: ArtifactKind
    """What the object is (`models.artifact.ArtifactKind`)."""
    step_index: int | None = None
    """The step whose output it is, for stdout/stderr objects."""


class EpisodeBundle(BaseModel):
    """One episode ready for ingest: the trajectory and the objects already written for it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    trajectory: Trajectory
    """The episode."""
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    """Objects in the store that its rows will point at."""
    rows: EpisodeRows | None = None
    """Its episode and step rows, built where the episode finished (`rows_for`); used
    when they fit the trajectory and the writer, else built here."""


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


def rows_for(engine: Engine, t: Trajectory) -> EpisodeRows:
    """`t`'s episode and step rows in the form `ingest_episodes` writes them on `engine`: built where an
    episode finishes, off the writer's path (`EpisodeBundle.rows`)."""
    return prepare_rows(t, json_text=engine.dialect.name == "postgresql")


def existing_episode_ids(conn: Connection, ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    wanted = list(ids)
    found: set[uuid.UUID] = set()
    # SQLite caps the variables of one statement; PostgreSQL takes a batch in one query.
    size = 10_000 if conn.dialect.name == "postgresql" else 500
    for i in range(0, len(wanted), size):
        chunk = wanted[i : i + size]
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
            # One row per distinct parent (a run's episodes share their run and policy).
            tasks = {b.trajectory.task_id: b.trajectory for b in todo}
            policies = {b.trajectory.policy: b.trajectory for b in todo}
            runs = {b.trajectory.run_key: b.trajectory for b in todo}
            _insert_missing(conn, Task.__table__, [task_row(t) for t in tasks.values()])  # type: ignore[attr-defined]
            _insert_missing(conn, Policy.__table__, [policy_row(t) for t in policies.values()])  # type: ignore[attr-defined]
            _insert_missing(conn, CollectionRun.__table__, [run_row(t) for t in runs.values()])  # type: ignore[attr-defined]
            if conn.dialect.name == "postgresql":
                copy_rows(conn, Episode.__table__, _episode_rows(todo, json_text), json_ready=True)  # type: ignore[attr-defined]
                report.steps = copy_values(
                    conn, Step.__tablename__, STEP_COLUMNS, _step_values(todo, json_text)
                )
                copy_rows(conn, Artifact.__table__, _artifact_rows(todo))  # type: ignore[attr-defined]
            else:
                steps = [
                    dict(zip(STEP_COLUMNS, v, strict=True)) for v in _step_values(todo, clean_json)
                ]
                _insert_rows(conn, Episode.__table__, list(_episode_rows(todo, clean_json)))  # type: ignore[attr-defined]
                _insert_rows(conn, Step.__table__, steps)  # type: ignore[attr-defined]
                _insert_rows(conn, Artifact.__table__, list(_artifact_rows(todo)))  # type: ignore[attr-defined]
                report.steps = len(steps)
            report.inserted = list(fresh)
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
    return reason_line(text, 300) if text.strip() else type(e).__name__


def _trajectory_key(b: EpisodeBundle) -> str | None:
    return next((a.info.key for a in b.artifacts if a.kind == "trajectory"), None)


def _episode_rows(bundles: Sequence[EpisodeBundle], json: JsonFinisher) -> Iterator[dict[str, Any]]:
    for b in bundles:
        key = _trajectory_key(b)
        prepared = b.rows
        if prepared is not None and prepared.fits(b.trajectory, json_text=json is json_text):
            yield prepared.episode if key is None else {**prepared.episode, "trajectory_key": key}
        else:
            yield episode_row(b.trajectory, trajectory_key=key, json=json)


def _step_values(bundles: Sequence[EpisodeBundle], json: JsonFinisher) -> Iterator[tuple[Any, ...]]:
    for b in bundles:
        t = b.trajectory
        outputs: dict[int, dict[str, str]] = {}
        for a in b.artifacts:
            if a.step_index is not None:
                outputs.setdefault(a.step_index, {})[a.kind] = a.info.key
        prepared = b.rows
        if prepared is not None and prepared.fits(t, json_text=json is json_text):
            if not outputs:
                yield from prepared.steps
                continue
            for s, values in zip(t.steps, prepared.steps, strict=True):
                keys = outputs.get(s.index)
                yield values if keys is None else with_output_keys(values, keys)
            continue
        for s in t.steps:
            yield step_values(t.episode_id, s, output_keys=outputs.get(s.index), json=json)


def _artifact_rows(bundles: Sequence[EpisodeBundle]) -> Iterator[dict[str, Any]]:
    for b in bundles:
        t = b.trajectory
        run_id = run_id_of(t.run_key)
        created = recorded_at(t)
        for a in b.artifacts:
            yield {
                "key": a.info.key,
                "kind": a.kind,
                "run_id": run_id,
                "episode_id": t.episode_id,
                "size": a.info.size,
                "sha256": a.info.sha256,
                "content_type": a.info.content_type,
                "created_at": created,
            }


def _insert_missing(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """INSERT … ON CONFLICT DO NOTHING (parents shared by many episodes: task, policy, run)."""
    unique = list({r["id"]: r for r in rows}.values())
    if not unique:
        return
    dialect = conn.dialect.name
    if dialect == "postgresql":
        # One statement and one parameter for the whole batch: the rows as a JSON array,
        # turned back into records by the server (a multi-row VALUES costs a bind
        # parameter per value, and its client-side processing per row).
        columns = ", ".join(c.name for c in table.columns)
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:  # type: ignore[union-attr]
            cur.execute(
                f"INSERT INTO {table.name} ({columns}) SELECT {columns} "
                f"FROM json_populate_recordset(NULL::{table.name}, %s::json) "
                "ON CONFLICT DO NOTHING",
                (json_text(unique),),
            )
    elif dialect == "sqlite":
        conn.execute(sqlite_insert(table).on_conflict_do_nothing(), unique)
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        existing = set(
            conn.execute(
                select(table.c.id).where(table.c.id.in_([r["id"] for r in unique]))
            ).scalars()
        )
        conn.execute(insert(table), [r for r in unique if r["id"] not in existing])


def _insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(insert(table), rows)


def copy_rows(
    conn: Connection,
    table: Table,
    rows: Iterable[Mapping[str, Any]],
    *,
    json_ready: bool = False,
) -> int:
    """COPY `rows` (dicts: column → value) into `table`; see `copy_values`. Every row must
    have the keys of the first, in the same order (rows from one builder do). With
    `json_ready`, JSON columns already hold their text (rows built with `json=json_text`)."""
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        return 0
    columns = list(first.keys())
    json_names = {c.name for c in table.columns if _is_json(c)}
    json_positions = [] if json_ready else [i for i, c in enumerate(columns) if c in json_names]

    def values() -> Iterator[Sequence[Any]]:
        for row in itertools.chain((first,), iterator):
            if json_positions:
                items = list(row.values())
                for i in json_positions:
                    if items[i] is not None:
                        items[i] = json_text(items[i])
                yield items
            else:
                yield tuple(row.values())

    return copy_values(conn, table.name, columns, values())


def copy_values(
    conn: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """COPY `rows` (values in `columns` order, JSON columns as text) into `table` through
    the connection's psycopg cursor, in the same transaction; returns how many.

    `rows` may be a generator: each row is written as it is built, so the server stores
    rows while the client is still making the next ones (the COPY is server-bound).
    """
    raw = conn.connection.driver_connection
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    count = 0
    with raw.cursor() as cur, cur.copy(sql) as copy:  # type: ignore[union-attr]
        write_row = copy.write_row
        for row in rows:
            write_row(row)
            count += 1
    return count


def _is_json(column: Any) -> bool:
    return column.type.__class__.__name__ in ("JSON", "JSONB") or "JSON" in repr(column.type)
