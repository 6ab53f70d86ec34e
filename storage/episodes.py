"""Persist and load episodes: objects first, then the rows that point at them.

Order matters: an episode's objects (full trajectory JSON, raw stdout/stderr bytes that
the SQL text could not hold) are written before its rows commit, so no row ever points
at a missing object. An episode whose objects cannot be written is recorded as
`storage_error` with the reason and no object keys. Objects whose rows never committed
are orphans: `storage.orphans` finds them and collects them.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlmodel import col

from agent.trajectory import Step as StepData
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
from storage.objects import ObjectInfo, ObjectStore
from storage.rows import EpisodeRows, mark_storage_error
from storage.sanitize import decode_row_text

SQL_OUTPUT_CAP = 16_384
"""Characters of stdout/stderr kept in the `step` row; the rest is in the object store."""


def run_prefix(run_key: str) -> str:
    """Where a run's episode objects live: one folder per episode below it."""
    return f"episodes/{run_key}/"


def episode_prefix(t: Trajectory) -> str:
    return f"{run_prefix(t.run_key)}{t.episode_id}"


def _write_objects(store: ObjectStore, t: Trajectory) -> list[ArtifactRef]:
    """Upload what the rows will point at. Raw outputs are kept when the row's text is not
    the whole truth: truncated, or not clean UTF-8 / containing NULs; so is an imported
    observation that the row holds cut (`Step.observation_whole`)."""
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
        if s.observation_whole is not None:  # an imported observation past the inline cap
            info = store.put(
                f"{prefix}/steps/{s.index:04d}.observation",
                s.observation_whole.encode("utf-8", "surrogatepass"),
                content_type="text/plain; charset=utf-8",
            )
            refs.append(ArtifactRef(info=info, kind="observation", step_index=s.index))
    ctrf = (t.verifier_details or {}).get("harbor", {}).get("ctrf")
    if isinstance(ctrf, str):  # a Harbor verifier's CTRF report (tasks/harbor_verify.py)
        info = store.put(
            f"{prefix}/verifier/ctrf.json", ctrf.encode(), content_type="application/json"
        )
        refs.append(ArtifactRef(info=info, kind="ctrf"))
    refs.append(ArtifactRef(info=_put_trajectory(store, t), kind="trajectory"))
    return refs


TRAJECTORY_SPOOL_BYTES = 8 * 1024 * 1024
"""A trajectory JSON up to this size is uploaded from memory; a larger one is spooled to
a temporary file step by step and uploaded streamed (`ObjectStore.put_file`)."""

_BEFORE_STEPS = [name for name in Trajectory.model_fields if name != "steps"][
    : list(Trajectory.model_fields).index("steps")
]
_AFTER_STEPS = list(Trajectory.model_fields)[list(Trajectory.model_fields).index("steps") + 1 :]


def trajectory_json_chunks(t: Trajectory) -> Iterator[bytes]:
    """`t.model_dump_json(by_alias=True)` as bytes, in pieces: the fields before the steps,
    each step, the fields after. The same bytes as the whole dump (a test keeps them so),
    without ever holding that text and its encoding at once: a 100 MB import would
    otherwise hold the trajectory, its JSON text and the encoded bytes together."""
    head = t.model_dump_json(by_alias=True, include=set(_BEFORE_STEPS))
    yield (head[:-1] + ',"steps":[').encode()
    for i, step in enumerate(t.steps):
        if i:
            yield b","
        if _text_size(step) > TRAJECTORY_SPOOL_BYTES:
            # One huge string (a 100 MB observation kept whole in the ATIF remainder):
            # pydantic's JSON of the step would be a second and third copy of it.
            yield from _json_pieces(step.model_dump(mode="json", by_alias=True))
        else:
            yield step.__pydantic_serializer__.to_json(step, by_alias=True)
    tail = t.model_dump_json(by_alias=True, include=set(_AFTER_STEPS))
    yield b"]" + (b"," + tail[1:].encode() if len(tail) > 2 else b"}")


_STEP_TEXT_FIELDS = (
    "raw_output",
    "observation",
    "stdout",
    "stderr",
    "reasoning_content",
    "final_answer",
    "parse_error",
)
_STRING_CHUNK = 1 << 20


def _strings_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _strings_size(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_strings_size(v) for v in value)
    return 0


def _text_size(step: StepData) -> int:
    """Characters of a step's text, roughly (what can make its JSON large)."""
    size = sum(len(getattr(step, name) or "") for name in _STEP_TEXT_FIELDS)
    if step.atif_remainder is not None:
        size += _strings_size(step.atif_remainder.values)
    return size


def _json_pieces(value: Any) -> Iterator[bytes]:
    """JSON of a JSON-mode dump, in pieces: containers item by item, a long string in
    chunks (JSON escapes one character at a time, so the chunks' escapes joined are the
    whole string's)."""
    if isinstance(value, dict):
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            yield (b"," if i else b"") + json.dumps(key, ensure_ascii=False).encode() + b":"
            yield from _json_pieces(item)
        yield b"}"
    elif isinstance(value, list):
        yield b"["
        for i, item in enumerate(value):
            if i:
                yield b","
            yield from _json_pieces(item)
        yield b"]"
    elif isinstance(value, str) and len(value) > _STRING_CHUNK:
        yield b'"'
        for start in range(0, len(value), _STRING_CHUNK):
            yield json.dumps(value[start : start + _STRING_CHUNK], ensure_ascii=False)[
                1:-1
            ].encode()
        yield b'"'
    else:
        yield json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _put_trajectory(store: ObjectStore, t: Trajectory) -> ObjectInfo:
    key = f"{episode_prefix(t)}/trajectory.json"
    chunks = trajectory_json_chunks(t)
    held: list[bytes] = []
    size = 0
    for chunk in chunks:
        held.append(chunk)
        size += len(chunk)
        if size > TRAJECTORY_SPOOL_BYTES:
            break
    else:  # small: one upload from memory
        return store.put(key, b"".join(held), content_type="application/json")
    with tempfile.NamedTemporaryFile(prefix="epiflow-trajectory-", suffix=".json") as spool:
        for chunk in held:
            spool.write(chunk)
        held.clear()
        for chunk in chunks:
            spool.write(chunk)
        spool.flush()
        return store.put_file(key, Path(spool.name), content_type="application/json")


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
