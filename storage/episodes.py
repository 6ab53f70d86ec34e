"""Persist and load episodes: objects first, then the rows that point at them.

Order matters: an episode's objects (full trajectory JSON, raw stdout/stderr bytes that
the SQL text could not hold) are written before its rows commit, so no row ever points
at a missing object. An episode whose objects cannot be written is recorded as
`storage_error` with the reason and no object keys. Objects whose rows never committed
are orphans: `storage.orphans` finds them and collects them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, select
from sqlmodel import col

from agent.trajectory import Trajectory
from models import Episode
from models.artifact import ArtifactKind
from storage.errors import ObjectNotFound, ObjectStoreError
from storage.harbor_rows import write_harbor_rows
from storage.ingest import (
    ArtifactRef,
    EpisodeBundle,
    IngestReport,
    existing_episode_ids,
    ingest_episodes,
)
from storage.objects import ObjectStore
from storage.rows import EpisodeRows, mark_storage_error
from storage.sanitize import decode_row_text

SQL_OUTPUT_CAP = 16_384
"""Characters of stdout/stderr kept in the `step` row; the rest is in the object store."""


def episode_prefix(t: Trajectory) -> str:
    return f"episodes/{t.run_key}/{t.episode_id}"


def _write_objects(store: ObjectStore, t: Trajectory) -> list[ArtifactRef]:
    """Upload what the rows will point at. Raw outputs are kept when the row's text is not
    the whole truth: truncated, or not clean UTF-8 / containing NULs."""
    refs: list[ArtifactRef] = []
    prefix = episode_prefix(t)
    streams: tuple[ArtifactKind, ...] = ("stdout", "stderr")
    for s in t.steps:
        for stream in streams:
            raw: bytes | None = getattr(s, f"{stream}_bytes")
            if raw is None:
                continue
            _, truncated, lossy = decode_row_text(raw, SQL_OUTPUT_CAP)
            if truncated or lossy or getattr(s, f"{stream}_truncated"):
                info = store.put(f"{prefix}/steps/{s.index:04d}.{stream}", raw)
                refs.append(ArtifactRef(info=info, kind=stream, step_index=s.index))
    ctrf = (t.verifier_details or {}).get("harbor", {}).get("ctrf")
    if isinstance(ctrf, str):  # a Harbor verifier's CTRF report (tasks/harbor_verify.py)
        info = store.put(
            f"{prefix}/verifier/ctrf.json", ctrf.encode(), content_type="application/json"
        )
        refs.append(ArtifactRef(info=info, kind="ctrf"))
    body = t.model_dump_json(by_alias=True).encode()
    info = store.put(f"{prefix}/trajectory.json", body, content_type="application/json")
    refs.append(ArtifactRef(info=info, kind="trajectory"))
    return refs


def persist_episodes(
    engine: Engine,
    store: ObjectStore,
    trajectories: Sequence[Trajectory],
    *,
    upload_workers: int = 8,
    rows: Mapping[uuid.UUID, EpisodeRows] | None = None,
) -> IngestReport:
    """Write objects (concurrently) then rows (one transaction). Idempotent on episode id;
    an id named twice in one batch is written once, as its first occurrence. `rows`: the
    episodes' rows already built where they finished (`storage.ingest.rows_for`), by
    episode id; those that do not fit (a storage error changes the outcome) are rebuilt.

    Raises:
        IngestError: the SQL batch failed; objects written for it are orphans.
    """
    with engine.connect() as conn:
        present = existing_episode_ids(conn, (t.episode_id for t in trajectories))
    # One episode id, one upload: a batch naming an id twice would write one key twice and
    # leave SQL describing one version while the object holds the other.
    first: dict[uuid.UUID, Trajectory] = {}
    for t in trajectories:
        first.setdefault(t.episode_id, t)
    todo = [t for i, t in first.items() if i not in present]

    built = rows or {}

    def upload(t: Trajectory) -> EpisodeBundle:
        ready = built.get(t.episode_id)
        try:
            return EpisodeBundle(trajectory=t, artifacts=_write_objects(store, t), rows=ready)
        except ObjectStoreError as e:
            failed = mark_storage_error(t, f"object store: {e}")
            return EpisodeBundle(trajectory=failed, rows=ready)

    if len(todo) > 1 and upload_workers > 1:
        with ThreadPoolExecutor(max_workers=upload_workers) as pool:
            bundles = list(pool.map(upload, todo))
    else:
        bundles = [upload(t) for t in todo]
    report = ingest_episodes(engine, bundles)
    write_harbor_rows(engine, [b.trajectory for b in bundles], report.inserted)
    report.skipped_existing = sorted(set(report.skipped_existing) | present, key=str)
    return report


def trajectory_bytes(engine: Engine, store: ObjectStore, episode_id: uuid.UUID) -> bytes:
    """The stored `trajectory.json` object of an episode, byte for byte.

    Raises:
        ObjectNotFound: no such episode, or it has no stored trajectory (a storage error).
    """
    with engine.connect() as conn:
        key = conn.execute(
            select(col(Episode.trajectory_key)).where(col(Episode.id) == episode_id)
        ).scalar_one_or_none()
    if key is None:
        raise ObjectNotFound(f"episode {episode_id} has no stored trajectory")
    return store.get(key)


def load_trajectory(engine: Engine, store: ObjectStore, episode_id: uuid.UUID) -> Trajectory:
    """The full trajectory of an episode, from the object its row points at.

    Raises:
        ObjectNotFound: no such episode, or it has no stored trajectory (a storage error).
    """
    return Trajectory.model_validate_json(trajectory_bytes(engine, store, episode_id))
