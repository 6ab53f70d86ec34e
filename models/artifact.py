"""`artifact`: an object in the object store that a row points at (trace, stdout, docs, …)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from sqlmodel import SQLModel

from models.columns import doc, fk, time_col

ArtifactKind = Literal["trajectory", "stdout", "stderr", "ctrf", "observation"]
"""Every kind of object the platform records an artifact row for (`storage.episodes`);
`Artifact.kind`'s comment names exactly these (tests/storage/test_view_plans.py)."""


class Artifact(SQLModel, table=True):
    """An object-store object. Objects are written before their row commits, so every
    row points at an existing object; objects without a row are orphans (collectable)."""

    __tablename__ = "artifact"

    key: str = doc("Object key, e.g. episodes/<run>/<episode>/trajectory.json.", primary_key=True)
    kind: str = doc(
        "What the object is: `trajectory` (an episode's trajectory.json), `stdout` / `stderr` "
        "(a step's raw output, kept when the row's text is truncated or not clean UTF-8), "
        "`ctrf` (a Harbor verifier's CTRF test report), or `observation` (an imported "
        "step's observation, whole, when the row's text is cut at the inline cap). Gate "
        "docs, datasets and checkpoints live in the store without artifact rows.",
        index=True,
    )
    run_id: uuid.UUID | None = fk("Collection run it belongs to, if any.", "collection_run.id")
    episode_id: uuid.UUID | None = fk(
        "Episode it belongs to, if any.", "episode.id", ondelete="CASCADE"
    )
    size: int = doc("Size in bytes.")
    sha256: str = doc("sha256 of the content.")
    content_type: str = doc("MIME type.", default="application/octet-stream")
    created_at: datetime = time_col(
        "The episode's ended_at, else started_at (UTC); not when the object or row was written."
    )
