"""`atif_document` and `episode_link`: who an imported ATIF trajectory is, and what it points at.

An imported ATIF document has an `atif_document` row (its `session_id`, `trajectory_id`,
the file it came from, the document that embeds it). Every reference it makes is an
`episode_link` row: a sub-agent its step delegated to (`subagent_trajectory_ref`, or an
embedded `subagent_trajectories` entry) or the trajectory that continues it
(`continued_trajectory_ref`). A reference to a document not imported yet is kept with
`child_episode_id` NULL and resolved when that document arrives (`storage.links`; the
rules are `agent.atif_links.resolve`). The `episode_tree` view walks the links.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col


class AtifDocument(SQLModel, table=True):
    """The ATIF identity of an imported episode."""

    __tablename__ = "atif_document"

    episode_id: uuid.UUID = fk(
        "The episode the document was imported as.",
        "episode.id",
        nullable=False,
        ondelete="CASCADE",
        primary_key=True,
    )
    session_id: str | None = doc(
        "The document's ATIF `session_id` (the producer's run; several documents may share "
        "one, e.g. a trajectory and its continuation).",
        default=None,
        index=True,
    )
    trajectory_id: str | None = doc(
        "The document's ATIF `trajectory_id` (v1.7), what sub-agent refs resolve by.",
        default=None,
        index=True,
    )
    schema_version: str = doc("The document's ATIF `schema_version` (`ATIF-v1.5`, …).")
    source_name: str | None = doc(
        "Name of the file it was imported from (what `trajectory_path` and "
        "`continued_trajectory_ref` resolve by); NULL when not imported from a file.",
        default=None,
        index=True,
    )
    source_dir: str | None = doc(
        "Absolute folder of that file on the machine that imported it.", default=None
    )
    embedded_in: uuid.UUID | None = fk(
        "The episode whose document embeds this one (`subagent_trajectories`, v1.7); NULL "
        "for a document of its own. An export of the run writes it inside that document only.",
        "episode.id",
        ondelete="SET NULL",
    )


class EpisodeLink(SQLModel, table=True):
    """One reference from an imported episode to another: a sub-agent or a continuation."""

    __tablename__ = "episode_link"

    parent_episode_id: uuid.UUID = fk(
        "The episode whose document makes the reference.",
        "episode.id",
        nullable=False,
        ondelete="CASCADE",
        primary_key=True,
    )
    kind: str = doc(
        "`subagent` (the parent's step delegated to the child) or `continuation` (the "
        "child continues the parent).",
        primary_key=True,
    )
    ordinal: int = doc(
        "Position of the reference among the parent's references of this kind (0-based, "
        "document order).",
        primary_key=True,
    )
    child_episode_id: uuid.UUID | None = fk(
        "The episode the reference names; NULL while that document is not imported "
        "(resolved when it is).",
        "episode.id",
        ondelete="SET NULL",
    )
    step_id: int | None = doc(
        "ATIF `step_id` of the parent's step whose observation holds a sub-agent reference; "
        "NULL for a continuation.",
        default=None,
    )
    ref_session_id: str | None = doc(
        "The `session_id` the reference names, as written.", default=None, index=True
    )
    ref_trajectory_id: str | None = doc(
        "The `trajectory_id` the reference names (v1.7), as written.", default=None, index=True
    )
    ref_path: str | None = doc(
        "The `trajectory_path` or `continued_trajectory_ref` the reference names, as written.",
        default=None,
    )
    ref_extra: dict[str, Any] | None = json_col(
        "The reference's own `extra` metadata (e.g. Harbor's summary of the sub-agent).",
        nullable=True,
    )
