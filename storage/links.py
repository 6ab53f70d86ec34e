"""Links between imported ATIF episodes in SQL: `atif_document` and `episode_link` rows.

`record_links` runs after an import's episodes are stored (`storage.exchange.import_file`),
in one transaction of its own: it writes the identity and the references of every
document not recorded yet, resolving each reference against the documents already
imported (`agent.atif_links.resolve`), then resolves the references left open by earlier
imports that the new documents answer. So a parent and its sub-agent (or a trajectory and
its continuation) are linked whichever file is imported first. A document already
recorded is left as it is and a reference is resolved once: importing a file again
changes no row. `embedded_episode_ids` names the episodes an export writes inside their
parent's document only.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection, Engine, Table, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlmodel import col

from agent.atif_links import DocumentIdentity, DocumentLinks, LinkKind, LinkRef, resolve
from core.errors import reason_line
from models import AtifDocument, Episode, EpisodeLink
from storage.errors import IngestError
from storage.sanitize import clean_json, clean_text

__all__ = ["LinkReport", "embedded_episode_ids", "record_links"]

_DOCUMENTS: Table = AtifDocument.__table__  # type: ignore[attr-defined]
_LINKS: Table = EpisodeLink.__table__  # type: ignore[attr-defined]


class LinkReport(BaseModel):
    """What `record_links` did."""

    documents: int = 0
    """Documents recorded by this call (already recorded ones are not counted)."""
    resolved: int = 0
    """References resolved by this call: new ones that found their document, and earlier
    ones the new documents answered."""
    unresolved: int = 0
    """References of the recorded documents still naming no imported document."""


def _identity(row: Any) -> DocumentIdentity:
    return DocumentIdentity(
        episode_id=row.episode_id,
        session_id=row.session_id,
        trajectory_id=row.trajectory_id,
        source_name=row.source_name,
        source_dir=row.source_dir,
        embedded_in=row.embedded_in,
    )


def _text(value: str | None) -> str | None:
    return clean_text(value) if value is not None else None


def _insert_new(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """INSERT … ON CONFLICT DO NOTHING: a concurrent import of the same file wrote them."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(pg_insert(table).on_conflict_do_nothing(), rows)
    elif conn.dialect.name == "sqlite":
        conn.execute(sqlite_insert(table).on_conflict_do_nothing(), rows)
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        conn.execute(insert(table), rows)


def _link_row(parent: uuid.UUID, ref: LinkRef, child: uuid.UUID | None) -> dict[str, Any]:
    return {
        "parent_episode_id": parent,
        "kind": str(ref.kind),
        "ordinal": ref.ordinal,
        "child_episode_id": child,
        "step_id": ref.step_id,
        "ref_session_id": _text(ref.session_id),
        "ref_trajectory_id": _text(ref.trajectory_id),
        "ref_path": _text(ref.path),
        "ref_extra": clean_json(ref.extra) if ref.extra is not None else None,
    }


def record_links(engine: Engine, documents: Sequence[DocumentLinks]) -> LinkReport:
    """Record the identity and references of `documents` (their episodes are stored) and
    resolve what can be resolved now; see the module docstring.

    Raises:
        IngestError: the transaction failed (nothing of it was committed; importing the
            file again records the links).
    """
    report = LinkReport()
    if not documents:
        return report
    ids = list(dict.fromkeys(d.identity.episode_id for d in documents))
    try:
        with engine.begin() as conn:
            stored = set(
                conn.execute(select(col(Episode.id)).where(col(Episode.id).in_(ids))).scalars()
            )
            recorded = set(
                conn.execute(
                    select(col(AtifDocument.episode_id)).where(
                        col(AtifDocument.episode_id).in_(ids)
                    )
                ).scalars()
            )
            fresh: dict[uuid.UUID, DocumentLinks] = {}
            for d in documents:
                eid = d.identity.episode_id
                if eid in stored and eid not in recorded:
                    fresh.setdefault(eid, d)
            if not fresh:
                return report
            _insert_new(
                conn,
                _DOCUMENTS,
                [
                    {
                        "episode_id": eid,
                        "session_id": _text(d.identity.session_id),
                        "trajectory_id": _text(d.identity.trajectory_id),
                        "schema_version": d.schema_version,
                        "source_name": _text(d.identity.source_name),
                        "source_dir": _text(d.identity.source_dir),
                        "embedded_in": d.identity.embedded_in,
                    }
                    for eid, d in fresh.items()
                ],
            )
            known = [_identity(r) for r in conn.execute(select(_DOCUMENTS))]
            links: list[dict[str, Any]] = []
            for eid, d in fresh.items():
                for ref in d.refs:
                    child = resolve(ref, d.identity, known)
                    report.resolved += child is not None
                    report.unresolved += child is None
                    links.append(_link_row(eid, ref, child))
            _insert_new(conn, _LINKS, links)
            report.resolved += _resolve_open(conn, known, set(fresh))
            report.documents = len(fresh)
    except DBAPIError as e:
        raise IngestError(
            f"recording the links of {len(documents)} document(s) failed, nothing was "
            f"committed (import the file again): {reason_line(str(e.orig or e), 300)}"
        ) from e
    return report


def _resolve_open(conn: Connection, known: list[DocumentIdentity], fresh: set[uuid.UUID]) -> int:
    """Resolve the open references of documents recorded earlier against every document
    known now; returns how many were resolved."""
    by_id = {k.episode_id: k for k in known}
    table = _LINKS
    resolved = 0
    for row in conn.execute(select(table).where(table.c.child_episode_id.is_(None))).all():
        referrer = by_id.get(row.parent_episode_id)
        if referrer is None or row.parent_episode_id in fresh:
            continue
        ref = LinkRef(
            kind=LinkKind(row.kind),
            ordinal=row.ordinal,
            step_id=row.step_id,
            session_id=row.ref_session_id,
            trajectory_id=row.ref_trajectory_id,
            path=row.ref_path,
        )
        child = resolve(ref, referrer, known)
        if child is None:
            continue
        conn.execute(
            update(table)
            .where(
                table.c.parent_episode_id == row.parent_episode_id,
                table.c.kind == row.kind,
                table.c.ordinal == row.ordinal,
                table.c.child_episode_id.is_(None),
            )
            .values(child_episode_id=child)
        )
        resolved += 1
    return resolved


def embedded_episode_ids(engine: Engine, episode_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Those of `episode_ids` whose document another of them embeds (an ATIF export writes
    them inside that document, not on their own)."""
    wanted = set(episode_ids)
    if not wanted:
        return set()
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(AtifDocument.episode_id), col(AtifDocument.embedded_in)).where(
                col(AtifDocument.embedded_in).is_not(None)
            )
        ).all()
    return {eid for eid, parent in rows if eid in wanted and parent in wanted}
