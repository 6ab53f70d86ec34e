"""Export a run's trajectories and import files of them: ATIF, OpenAI chat messages, parquet of steps.

An import reads the file defensively (`storage.documents`), converts and validates every
document before anything is written (an error names the document and the field path),
then records the episodes under an import run that it opens and closes (`completed`, or
`failed` when the write failed). Episode ids are deterministic, so importing a file again
writes nothing and says which episodes were already there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import Engine, select
from sqlmodel import col

from agent.atif_convert import ATIF_IMPORT_RUN_KEY
from agent.atif_links import DocumentLinks, document_links, embedded_documents, with_embedded
from agent.export import from_atif, from_openai_messages, to_atif, to_openai_messages
from agent.harbor_traces import HARBOR_TRACES_RUN_KEY, from_harbor_traces
from agent.trajectory import Trajectory
from models import CollectionRun, run_id_for
from storage.documents import read_documents
from storage.episodes import persist_episodes
from storage.errors import ImportFormatError
from storage.ingest import existing_episode_ids
from storage.links import embedded_episode_ids, record_links
from storage.objects import ObjectStore
from storage.run_frames import STEP_FRAME_FORMAT, run_step_frame
from storage.run_reads import resolve_run, run_trajectories
from storage.runs import close_run, open_run

OPENAI_IMPORT_RUN_KEY = "import:openai"
"""Run key of imported OpenAI chat messages when none is given."""

IMPORT_FORMATS = ("atif", "openai", "harbor-traces")
EXPORT_FORMATS = ("atif", "openai", "parquet")


def export_run(
    engine: Engine, store: ObjectStore, run: str, fmt: str, output: Path | IO[str]
) -> int:
    """Write the episodes of run `run` (key or id) as `fmt`; returns how many.

    `parquet` is one row per step with the episode's columns beside it, read from SQL
    (`storage.run_frames.run_step_frame`); `atif` and `openai` are JSON lines, one episode each.

    Raises:
        RunNotFound: no run has that key or id.
    """
    run_id = resolve_run(engine, run)
    if fmt == "parquet":
        assert isinstance(output, Path)
        frame = run_step_frame(engine, run_id)
        frame.write_parquet(output, metadata={"epiflow_step_frame_format": STEP_FRAME_FORMAT})
        return frame["episode_id"].n_unique() if frame.height else 0
    trajectories = run_trajectories(engine, store, run_id)
    if fmt == "atif":  # an embedded sub-agent is written inside its parent's document
        inside = embedded_episode_ids(engine, [t.episode_id for t in trajectories])
        trajectories = [t for t in trajectories if t.episode_id not in inside]
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
        output.write_text(text, encoding="utf-8")
    else:
        output.write(text)
    return len(trajectories)


class ImportReport(BaseModel):
    """What an import did."""

    file: str
    """The file imported."""
    documents: int
    """Documents it held."""
    inserted: list[uuid.UUID] = Field(default_factory=list)
    """Episodes written by this import."""
    skipped_existing: list[uuid.UUID] = Field(default_factory=list)
    """Episodes that were already in the database (a re-import); left unchanged."""
    steps: int = 0
    """Step rows written."""
    run_keys: list[str] = Field(default_factory=list)
    """The runs the episodes belong to."""
    links_resolved: int = 0
    """Sub-agent and continuation references this import resolved (`episode_link`): the
    new documents' own, and earlier ones the new documents answered."""
    links_unresolved: int = 0
    """References of the new documents naming a document not imported yet (resolved when
    it is)."""

    def summary(self) -> str:
        runs = ", ".join(self.run_keys)
        text = (
            f"{self.file}: {self.documents} document(s); {len(self.inserted)} episode(s) and "
            f"{self.steps} step(s) imported into run {runs}"
        )
        if self.links_resolved or self.links_unresolved:
            text += (
                f"; {self.links_resolved} sub-agent/continuation link(s) resolved, "
                f"{self.links_unresolved} naming a file not imported yet"
            )
        if self.skipped_existing:
            text += f"; {len(self.skipped_existing)} already imported, unchanged: " + ", ".join(
                str(e) for e in self.skipped_existing
            )
        return text


def _error_lines(error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(document)"
        lines.append(f"{where}: {item['msg']}")
    return lines


def _convert(doc: Any, fmt: str, run_key: str | None) -> Trajectory:
    if fmt == "atif":
        return from_atif(doc, run_key=run_key)
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        messages = doc["messages"]
    elif isinstance(doc, list):
        messages = doc
    else:
        raise ValueError('expected {"messages": [...]} or a list of chat messages')
    if not all(isinstance(m, dict) for m in messages):
        raise ValueError("every chat message must be a JSON object")
    return from_openai_messages(messages, run_key=run_key or OPENAI_IMPORT_RUN_KEY)


def _atif_episodes(
    doc: Any, t: Trajectory, source: Path, *, embedded_in: uuid.UUID | None = None
) -> tuple[list[Trajectory], list[DocumentLinks]]:
    """The embedded sub-agents of an ATIF document (at any depth) as episodes of their own,
    and the links of the document and of each of them (`agent.atif_links`)."""
    trajectories: list[Trajectory] = []
    links: list[DocumentLinks] = []
    children: list[DocumentLinks] = []
    for child_doc in embedded_documents(doc):
        child = from_atif(child_doc, run_key=t.run_key)
        more, child_links = _atif_episodes(child_doc, child, source, embedded_in=t.episode_id)
        trajectories += [child, *more]
        children.append(child_links[0])
        links += child_links
    own = document_links(doc, episode_id=t.episode_id, source=str(source), embedded_in=embedded_in)
    return trajectories, [with_embedded(own, children), *links]


def parse_file(path: Path, fmt: str, *, run_key: str | None = None) -> list[Trajectory]:
    """Every document of `path` as a trajectory (an ATIF document's embedded sub-agents
    after it, each as its own); nothing is written.

    Raises:
        ImportFormatError: the file is hostile, empty or not JSON, or a document is not
            valid `fmt` (the message names the document and the field path).
    """
    return _parse(path, fmt, run_key=run_key)[0]


def _parse(
    path: Path, fmt: str, *, run_key: str | None
) -> tuple[list[Trajectory], list[DocumentLinks]]:
    """`parse_file`, with the links of the foreign ATIF documents (episodes epiflow ran
    link nothing)."""
    trajectories: list[Trajectory] = []
    links: list[DocumentLinks] = []
    documents = read_documents(path)
    if fmt == "harbor-traces":
        # The file is one list of rows (or JSON lines of them); a trial is several rows.
        rows = documents[0] if len(documents) == 1 and isinstance(documents[0], list) else documents
        try:
            return [t for _, t in from_harbor_traces(rows, run_key=run_key)], []
        except ValueError as e:
            raise ImportFormatError(
                f"{path}: not valid harbor-traces: {e}", setting=str(path)
            ) from e
    for n, doc in enumerate(documents, start=1):
        where = f"{path}: document {n}"
        try:
            t = _convert(doc, fmt, run_key)
            trajectories.append(t)
            if fmt == "atif" and t.agent is not None:
                embedded, doc_links = _atif_episodes(doc, t, path)
                trajectories += embedded
                links += doc_links
        except ValidationError as e:
            lines = _error_lines(e)
            more = f" (and {len(lines) - 1} more error(s), listed below)" if len(lines) > 1 else ""
            raise ImportFormatError(
                f"{where} is not valid {fmt}: {lines[0]}{more}"
                + "".join(f"\n{x}" for x in lines[1:]),
                setting=str(path),
            ) from e
        except (ValueError, KeyError, TypeError) as e:
            first = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
            raise ImportFormatError(
                f"{where} is not valid {fmt}: {first}", setting=str(path)
            ) from e
    return trajectories, links


def _open_import_runs(
    engine: Engine, trajectories: Sequence[Trajectory], *, fmt: str, path: Path
) -> list[uuid.UUID]:
    """Open a run row for each run key the import writes into, unless it belongs to a
    collection (re-importing an export into the database it came from leaves that run as
    it is). Returns the runs opened, to close afterwards."""
    opened: list[uuid.UUID] = []
    for key in dict.fromkeys(t.run_key for t in trajectories):
        run_id = run_id_for(key)
        with engine.connect() as conn:
            parameters = conn.execute(
                select(col(CollectionRun.parameters)).where(col(CollectionRun.id) == run_id)
            ).one_or_none()
        if parameters is not None and not (parameters[0] or {}).get("import"):
            continue
        first = next(t for t in trajectories if t.run_key == key)
        open_run(
            engine,
            run_key=key,
            suite=first.suite,
            policy=first.policy,
            parameters={"import": {"format": fmt, "file": path.name}},
            sandbox_spec={},
            fault_profile={},
        )
        opened.append(run_id)
    return opened


def import_file(
    engine: Engine, store: ObjectStore, path: Path, fmt: str, *, run_key: str | None = None
) -> ImportReport:
    """Parse every document in `path` (all validated before anything is written) and
    persist them under `run_key` (default: an epiflow export's own run, `import:atif` or
    `import:openai` for foreign documents); the import's run is closed either way.

    Raises:
        ImportFormatError: the file or a document is not valid (nothing was written).
        IngestError: the database write failed (the import run is marked `failed`).
    """
    trajectories, documents = _parse(path, fmt, run_key=run_key)
    with engine.connect() as conn:
        present = existing_episode_ids(conn, (t.episode_id for t in trajectories))
    # A run gets opened and closed (its status and ended_at rewritten) only when this
    # import adds to it: importing a file again changes no row at all.
    fresh = [t for t in trajectories if t.episode_id not in present]
    opened = _open_import_runs(engine, fresh, fmt=fmt, path=path)
    try:
        ingest = persist_episodes(engine, store, trajectories)
        links = record_links(engine, documents)
    except Exception:
        for run_id in opened:
            close_run(engine, run_id, status="failed")
        raise
    for run_id in opened:
        close_run(engine, run_id, status="completed")
    return ImportReport(
        file=str(path),
        documents=len(trajectories),
        inserted=ingest.inserted,
        skipped_existing=ingest.skipped_existing,
        steps=ingest.steps,
        run_keys=list(dict.fromkeys(t.run_key for t in trajectories)),
        links_resolved=links.resolved,
        links_unresolved=links.unresolved,
    )


__all__ = [
    "ATIF_IMPORT_RUN_KEY",
    "EXPORT_FORMATS",
    "HARBOR_TRACES_RUN_KEY",
    "IMPORT_FORMATS",
    "OPENAI_IMPORT_RUN_KEY",
    "ImportReport",
    "export_run",
    "import_file",
    "parse_file",
]
