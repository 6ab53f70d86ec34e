"""Export a run's trajectories and import files of them: ATIF, OpenAI chat messages, parquet of steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import polars as pl
from sqlalchemy import Engine

from agent.export import from_atif, from_openai_messages, to_atif, to_openai_messages
from agent.trajectory import Trajectory
from storage.episodes import persist_episodes
from storage.errors import ImportFormatError
from storage.ingest import IngestReport
from storage.objects import ObjectStore
from storage.rows import step_row
from storage.runs import resolve_run, run_trajectories


def export_run(
    engine: Engine, store: ObjectStore, run: str, fmt: str, output: Path | IO[str]
) -> int:
    """Write the episodes of run `run` (key or id) as `fmt`; returns how many.

    Raises:
        RunNotFound: no run has that key or id.
    """
    trajectories = run_trajectories(engine, store, resolve_run(engine, run))
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
                    raise ImportFormatError(
                        f"{path}:{n}: not JSON: {e.msg}", setting=str(path)
                    ) from e
        return docs


def import_file(
    engine: Engine, store: ObjectStore, path: Path, fmt: str, *, run_key: str
) -> IngestReport:
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
            raise ImportFormatError(
                f"{path}: document {n} is not valid {fmt}: {str(e).splitlines()[0]}",
                setting=str(path),
            ) from e
    return persist_episodes(engine, store, trajectories)
