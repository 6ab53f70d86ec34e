"""Check that every `artifact` row matches its object: present, same size, same sha256.

`list_orphans` finds objects no row points at; this is the other direction. The objects
are downloaded one at a time into a temporary file and hashed streamed, so memory stays
flat whatever their size. Nothing is changed: the report says what disagrees.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import Engine, select
from sqlmodel import col

from models import Artifact
from storage.errors import ObjectNotFound
from storage.objects import ObjectStore

__all__ = ["ArtifactProblem", "VerifyReport", "verify_artifacts"]


class ArtifactProblem(BaseModel):
    """One artifact row its object does not match."""

    key: str
    """The object key."""
    problem: Literal["missing", "size", "sha256"]
    """No object under the key, a different size, or the same size and other content."""
    detail: str
    """What SQL says and what the store holds."""


class VerifyReport(BaseModel):
    """What `verify_artifacts` checked and found."""

    checked: int
    """Artifact rows checked."""
    problems: list[ArtifactProblem]
    """Rows whose object disagrees, in key order."""


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_artifacts(engine: Engine, store: ObjectStore, prefix: str = "") -> VerifyReport:
    """Every artifact row under `prefix` against its object.

    Raises:
        ObjectStoreError: the store could not be read (an outage, not a mismatch).
    """
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Artifact.key), col(Artifact.size), col(Artifact.sha256))
            .where(col(Artifact.key).startswith(prefix))
            .order_by(col(Artifact.key))
        ).all()
    problems: list[ArtifactProblem] = []
    with tempfile.TemporaryDirectory(prefix="epiflow-verify-") as tmp:
        dest = Path(tmp) / "object"
        for key, size, sha256 in rows:
            try:
                store.get_file(key, dest)
            except ObjectNotFound:
                problems.append(
                    ArtifactProblem(key=key, problem="missing", detail="no object under the key")
                )
                continue
            actual = dest.stat().st_size
            if actual != size:
                problems.append(
                    ArtifactProblem(
                        key=key,
                        problem="size",
                        detail=f"SQL says {size} bytes, the object has {actual}",
                    )
                )
            else:
                digest = _digest(dest)
                if digest != sha256:
                    problems.append(
                        ArtifactProblem(
                            key=key,
                            problem="sha256",
                            detail=f"SQL says sha256 {sha256}, the object's is {digest}",
                        )
                    )
            dest.unlink()
    return VerifyReport(checked=len(rows), problems=problems)
