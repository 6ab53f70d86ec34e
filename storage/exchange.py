"""Export and import trajectories: ATIF, OpenAI chat messages, parquet of steps."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import IO, Any

import polars as pl
from sqlalchemy import Engine, select
from sqlmodel import col

from agent.export import from_atif, from_openai_messages, to_atif, to_openai_messages
from agent.trajectory import Trajectory
from collection.errors import CollectError
from config.settings import Settings
from models import CollectionRun, Episode
from storage.db import make_engine
from storage.episodes import load_trajectory, persist_episodes
from storage.ingest import IngestReport
from storage.migrate import ensure_current
from storage.objects import make_object_store
from storage.rows import step_row


def resolve_run(engine: Engine, run: str) -> uuid.UUID:
    """A run id from a run key or an id."""
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
        raise CollectError(f"--run {run!r}: no collection run with that key or id")
    return found


def run_trajectories(settings: Settings, run: str) -> list[Trajectory]:
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    run_id = resolve_run(engine, run)
    with engine.connect() as conn:
        ids = list(
            conn.execute(
                select(col(Episode.id))
                .where(col(Episode.run_id) == run_id, col(Episode.trajectory_key).is_not(None))
                .order_by(col(Episode.started_at), col(Episode.id))
            ).scalars()
        )
    trajectories = [load_trajectory(engine, store, eid) for eid in ids]
    engine.dispose()
    return trajectories


def export_run(settings: Settings, run: str, fmt: str, output: Path | IO[str]) -> int:
    """Write the run's episodes; returns how many."""
    trajectories = run_trajectories(settings, run)
    if fmt == "parquet":
        assert isinstance(output, Path)
        rows: list[dict[str, Any]] = []
        for t in trajectories:
            for s in t.steps:
                row = step_row(t.episode_id, s)
                row.update(
                    episode_id=str(t.episode_id),
                    run_key=t.run_key,
                    template=t.template,
                    status=str(t.status),
                    started_at=s.started_at.isoformat(),
                )
                for key in (
                    "args",
                    "native_tool_calls",
                    "files_changed",
                    "parse_tolerances",
                    "injected_fault",
                ):
                    row[key] = json.dumps(row[key], ensure_ascii=False)
                rows.append(row)
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(output)
        return len(trajectories)
    lines = []
    for t in trajectories:
        doc = (
            to_atif(t)
            if fmt == "atif"
            else {"episode_id": str(t.episode_id), "messages": to_openai_messages(t)}
        )
        lines.append(json.dumps(doc, ensure_ascii=False))
    text = "\n".join(lines) + ("\n" if lines else "")
    if isinstance(output, Path):
        output.write_text(text)
    else:
        output.write(text)
    return len(trajectories)


def _documents(path: Path) -> list[Any]:
    raw = path.read_text()
    stripped = raw.strip()
    if not stripped:
        return []
    try:
        whole = json.loads(stripped)
        return (
            whole
            if isinstance(whole, list) and (not whole or isinstance(whole[0], dict))
            else [whole]
        )
    except json.JSONDecodeError:
        docs = []
        for n, line in enumerate(raw.splitlines(), start=1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise CollectError(f"{path}:{n}: not JSON: {e.msg}") from e
        return docs


def import_file(settings: Settings, path: Path, fmt: str, *, run_key: str) -> IngestReport:
    """Parse every document in `path` and persist it (validated before anything is written)."""
    trajectories: list[Trajectory] = []
    for n, doc in enumerate(_documents(path), start=1):
        try:
            if fmt == "atif":
                trajectories.append(from_atif(doc))
            else:
                messages = doc["messages"] if isinstance(doc, dict) else doc
                trajectories.append(from_openai_messages(messages, run_key=run_key))
        except (ValueError, KeyError, TypeError) as e:
            raise CollectError(
                f"{path}: document {n} is not valid {fmt}: {str(e).splitlines()[0]}"
            ) from e
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    store.check()
    report = persist_episodes(engine, store, trajectories)
    engine.dispose()
    return report
