"""The links an ATIF document names, and how a reference finds the document it names.

A document says who it is (`session_id`, v1.7 `trajectory_id`) and points at others: an
observation result's `subagent_trajectory_ref`s name the sub-agents a step delegated to
(by `session_id` up to v1.6, by `trajectory_id` or `trajectory_path` from v1.7), the root
`continued_trajectory_ref` (v1.5) names the file that continues it, and v1.7 documents
embed sub-agents whole (`subagent_trajectories`). `document_links` reads all of that from a
document already validated (`agent.atif.AtifTrajectory`); `resolve` picks, among the
documents imported so far, the one a reference names. Pure: the SQL that stores links and
resolves them whichever file arrives first is `storage.links`.

How a reference is resolved (the first rule that applies):

1. `trajectory_id`: a document with that `trajectory_id`, one embedded in the referrer
   first (v1.7 refs resolve inside their own document).
2. `session_id` (up to v1.6 the resolution key; Harbor writes a fresh session id per
   sub-agent): a document with that `session_id`, other than the referrer.
3. `trajectory_path` / `continued_trajectory_ref`: a document imported from a file of
   that name, or whose name ends in `.` + that name (copies renamed with a prefix, like
   Harbor's golden files `terminus_2__….trajectory.cont-1.json` for `trajectory.cont-1.json`).

Ties (several candidates) go to the one in the referrer's folder, then to the one sharing
the referrer's `session_id`, then the longest common file-name prefix with the referrer
(the same trial's copies), then the smallest episode id, so the choice never depends on
import order when the candidates are the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DocumentIdentity",
    "DocumentLinks",
    "LinkKind",
    "LinkRef",
    "document_links",
    "embedded_documents",
    "resolve",
    "with_embedded",
]


class LinkKind(StrEnum):
    """What a link is."""

    SUBAGENT = "subagent"
    """The parent's step delegated to the child (a `subagent_trajectory_ref`)."""
    CONTINUATION = "continuation"
    """The child continues the parent (`continued_trajectory_ref`, e.g. after context
    summarisation)."""


class LinkRef(BaseModel):
    """One reference a document makes to another."""

    model_config = ConfigDict(frozen=True)

    kind: LinkKind
    """Sub-agent or continuation."""
    ordinal: int
    """Position among the document's references of this kind (0-based, document order)."""
    step_id: int | None = None
    """ATIF `step_id` of the step whose observation holds a sub-agent ref; None for a
    continuation."""
    session_id: str | None = None
    """The `session_id` the ref names."""
    trajectory_id: str | None = None
    """The `trajectory_id` the ref names (v1.7)."""
    path: str | None = None
    """The `trajectory_path` (or `continued_trajectory_ref`) the ref names."""
    extra: dict[str, Any] | None = None
    """The ref's own `extra` metadata."""


class DocumentIdentity(BaseModel):
    """Who an imported document is, as references find it."""

    model_config = ConfigDict(frozen=True)

    episode_id: uuid.UUID
    """The episode it was imported as."""
    session_id: str | None = None
    """Its `session_id`."""
    trajectory_id: str | None = None
    """Its `trajectory_id` (v1.7)."""
    source_name: str | None = None
    """Name of the file it was imported from."""
    source_dir: str | None = None
    """Folder of that file, as given to the import (absolute)."""
    embedded_in: uuid.UUID | None = None
    """The episode whose document embeds it (`subagent_trajectories`), if any."""


class DocumentLinks(BaseModel):
    """A document's identity and the references it makes."""

    identity: DocumentIdentity
    """Who it is."""
    schema_version: str
    """Its `schema_version`."""
    refs: list[LinkRef] = Field(default_factory=list)
    """What it points at, sub-agent refs in step order then the continuation."""


def document_links(
    document: Mapping[str, Any],
    *,
    episode_id: uuid.UUID,
    source: str | None = None,
    embedded_in: uuid.UUID | None = None,
) -> DocumentLinks:
    """The identity and references of a valid ATIF document imported as `episode_id`
    (`source`: the file it came from)."""
    refs: list[LinkRef] = []
    for step in document.get("steps") or []:
        observation = step.get("observation") or {}
        for result in observation.get("results") or []:
            for ref in result.get("subagent_trajectory_ref") or []:
                refs.append(
                    LinkRef(
                        kind=LinkKind.SUBAGENT,
                        ordinal=len(refs),
                        step_id=step.get("step_id"),
                        session_id=ref.get("session_id"),
                        trajectory_id=ref.get("trajectory_id"),
                        path=ref.get("trajectory_path"),
                        extra=ref.get("extra"),
                    )
                )
    continued = document.get("continued_trajectory_ref")
    if isinstance(continued, str):
        refs.append(LinkRef(kind=LinkKind.CONTINUATION, ordinal=0, path=continued))
    where = Path(source).resolve() if source is not None else None
    return DocumentLinks(
        identity=DocumentIdentity(
            episode_id=episode_id,
            session_id=document.get("session_id"),
            trajectory_id=document.get("trajectory_id"),
            source_name=where.name if where else None,
            source_dir=str(where.parent) if where else None,
            embedded_in=embedded_in,
        ),
        schema_version=str(document.get("schema_version")),
        refs=refs,
    )


def embedded_documents(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The sub-agent documents a v1.7+ document embeds (`subagent_trajectories`), each a
    whole ATIF document."""
    return [dict(d) for d in document.get("subagent_trajectories") or []]


def with_embedded(parent: DocumentLinks, children: Sequence[DocumentLinks]) -> DocumentLinks:
    """`parent`'s links plus a sub-agent link to each embedded child no ref of the parent
    names (a v1.7 document may embed a sub-agent without a step referring to it)."""
    named = {r.trajectory_id for r in parent.refs if r.kind == LinkKind.SUBAGENT}
    refs = list(parent.refs)
    ordinal = sum(r.kind == LinkKind.SUBAGENT for r in refs)
    for child in children:
        if child.identity.trajectory_id in named:
            continue
        refs.insert(
            ordinal,
            LinkRef(
                kind=LinkKind.SUBAGENT, ordinal=ordinal, trajectory_id=child.identity.trajectory_id
            ),
        )
        ordinal += 1
    return parent.model_copy(update={"refs": refs})


def _names(path: str, name: str | None) -> bool:
    if name is None:
        return False
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return name == base or name.endswith("." + base)


def _common_prefix(a: str | None, b: str | None) -> int:
    """Characters two file names share at the start (names, not paths: a character
    comparison is what is meant)."""
    n = 0
    for x, y in zip(a or "", b or "", strict=False):
        if x != y:
            break
        n += 1
    return n


def resolve(
    ref: LinkRef, referrer: DocumentIdentity, candidates: Iterable[DocumentIdentity]
) -> uuid.UUID | None:
    """The episode `ref` (made by `referrer`) names among `candidates`; None when no
    candidate fits (the ref stays unresolved until the document it names is imported)."""
    others = [c for c in candidates if c.episode_id != referrer.episode_id]
    if ref.trajectory_id is not None:
        fits = [c for c in others if c.trajectory_id == ref.trajectory_id]
        inside = [c for c in fits if c.embedded_in == referrer.episode_id]
        fits = inside or fits
    elif ref.session_id is not None:
        fits = [c for c in others if c.session_id == ref.session_id]
    elif ref.path is not None:
        path = ref.path
        fits = [c for c in others if _names(path, c.source_name)]
    else:
        return None
    if not fits:
        return None
    best = min(
        fits,
        key=lambda c: (
            c.source_dir != referrer.source_dir,
            not (ref.path is not None and _names(ref.path, c.source_name)),
            c.session_id != referrer.session_id,
            -_common_prefix(c.source_name, referrer.source_name),
            str(c.episode_id),
        ),
    )
    return best.episode_id
