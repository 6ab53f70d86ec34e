"""Dataset snapshots: select scored episodes in SQL, write an immutable parquet file, record lineage.

`build_snapshot` picks episodes (by collection run, QC run, verdict, template), loads
their full trajectories from the object store, builds the rows of the requested kind
(`training.builders`), writes them as parquet (polars) under
`datasets/<id>/<kind>.parquet`, and only then commits the `dataset` row (filter, counts,
weight sum, sha256, key) and one `dataset_episode` row per (episode, role). The id is a
uuid5 of the kind, the filter and the file's sha256: the same selection over the same
data is the same snapshot, and building it again returns the existing one.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, null, select
from sqlmodel import Session, col

from agent.prompt import PromptStyle
from agent.trajectory import Trajectory
from models import Dataset, DatasetEpisode, Episode, QcResult, QcRun
from storage.errors import ObjectStoreError
from storage.objects import ObjectStore
from training.builders import BuiltRows, DatasetKind, SourceEpisode, build_rows
from training.errors import EmptySnapshot, SnapshotError

__all__ = [
    "DATASET_NAMESPACE",
    "DatasetInfo",
    "build_snapshot",
    "fetch_snapshot",
    "get_snapshot",
    "read_snapshot",
    "select_episodes",
    "write_snapshot",
]

DATASET_NAMESPACE = uuid.UUID("3b0f5f7e-2f1c-4b8e-9a55-7d0c1e6a4b21")
"""Namespace of snapshot ids. Never change it: ids on disk depend on it."""

_USABLE_VERDICTS = ("keep", "downweight")


class DatasetInfo(BaseModel):
    """A snapshot as the flows pass it around (the `dataset` row, detached)."""

    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    """Snapshot id."""
    kind: DatasetKind
    """sft, dpo, kto, grpo, distill or cpt."""
    filter: dict[str, Any]
    """The selection that built it."""
    qc_run_id: uuid.UUID | None
    """Gate run whose verdicts it used, if any."""
    n_rows: int
    """Rows in the parquet file."""
    n_episodes: int
    """Distinct episodes it draws on."""
    weight_sum: float
    """Sum of the rows' sampling weights."""
    manifest: dict[str, int] = Field(default_factory=dict)
    """What the builder left out and why, counted (`BuiltRows.manifest`)."""
    sha256: str
    """sha256 of the parquet file."""
    object_key: str
    """Object-store key of the parquet file."""

    @property
    def prompt_style(self) -> PromptStyle:
        """System prompt style of its chats (`filter["prompt_style"]`, `full` when absent)."""
        return PromptStyle(self.filter.get("prompt_style") or PromptStyle.FULL)

    @classmethod
    def from_row(cls, row: Dataset) -> DatasetInfo:
        return cls(
            id=row.id,
            kind=DatasetKind(row.kind),
            filter=dict(row.filter),
            qc_run_id=row.qc_run_id,
            n_rows=row.n_rows,
            n_episodes=row.n_episodes,
            weight_sum=row.weight_sum,
            manifest=dict(row.manifest or {}),
            sha256=row.sha256,
            object_key=row.object_key,
        )


def select_episodes(
    engine: Engine,
    store: ObjectStore,
    *,
    run_ids: Sequence[uuid.UUID] | None = None,
    qc_run_id: uuid.UUID | None = None,
    verdicts: Sequence[str] = _USABLE_VERDICTS,
    templates: Sequence[str] | None = None,
    only_episodes: set[uuid.UUID] | None = None,
) -> list[SourceEpisode]:
    """Episodes matching the selection, with their verdicts and full trajectories.

    With `qc_run_id`, only episodes that gate run judged with one of `verdicts` are
    returned (and, without `run_ids`, the runs default to the one it gated). `only_episodes`
    keeps only those ids.

    Raises:
        SnapshotError: the QC run does not exist, or a trajectory cannot be read.
    """
    runs = list(run_ids) if run_ids else []
    with Session(engine) as session:
        if qc_run_id is not None:
            qc_run = session.get(QcRun, qc_run_id)
            if qc_run is None:
                raise SnapshotError(f"no qc_run {qc_run_id}")
            if not runs:
                runs = [qc_run.run_id]
        query: Any
        if qc_run_id is not None:
            query = (
                select(
                    col(Episode.id),
                    col(Episode.trajectory_key),
                    col(QcResult.verdict),
                    col(QcResult.quality_score),
                )
                .join(
                    QcResult,
                    (col(QcResult.episode_id) == col(Episode.id))
                    & (col(QcResult.qc_run_id) == qc_run_id),
                )
                .where(col(QcResult.verdict).in_(list(verdicts)))
            )
        else:
            query = select(
                col(Episode.id),
                col(Episode.trajectory_key),
                null().label("verdict"),
                null().label("q"),
            )
        if runs:
            query = query.where(col(Episode.run_id).in_(runs))
        if templates:
            query = query.where(col(Episode.template).in_(list(templates)))
        query = query.where(col(Episode.trajectory_key).is_not(None)).order_by(col(Episode.id))
        selected = session.execute(query).all()
    episodes: list[SourceEpisode] = []
    for episode_id, key, verdict, quality in selected:
        if only_episodes is not None and episode_id not in only_episodes:
            continue
        try:
            trajectory = Trajectory.model_validate_json(store.get(key))
        except ObjectStoreError as e:
            raise SnapshotError(f"cannot read the trajectory {key}: {e}") from e
        episodes.append(
            SourceEpisode(trajectory=trajectory, verdict=verdict, quality_score=quality)
        )
    return episodes


def latest_gate_of_episodes(
    engine: Engine, qc_run_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID]:
    """For each episode any of these gate runs judged, the one whose verdict is the latest
    (by the result's time; a tie goes to the gate listed last)."""
    order = {q: i for i, q in enumerate(qc_run_ids)}
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                col(QcResult.episode_id), col(QcResult.qc_run_id), col(QcResult.created_at)
            ).where(col(QcResult.qc_run_id).in_(list(qc_run_ids)))
        ).all()
    latest: dict[uuid.UUID, uuid.UUID] = {}
    for episode_id, qc_id, _at in sorted(rows, key=lambda r: (r[2], order[r[1]])):
        latest[episode_id] = qc_id
    return latest


def _parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    pl.DataFrame(rows, infer_schema_length=None).write_parquet(buffer, statistics=False)
    return buffer.getvalue()


def _snapshot_id(kind: DatasetKind, filter_: dict[str, Any], sha256: str) -> uuid.UUID:
    canonical = json.dumps(filter_, sort_keys=True, default=str, separators=(",", ":"))
    return uuid.uuid5(DATASET_NAMESPACE, f"{kind.value}\x1f{canonical}\x1f{sha256}")


def write_snapshot(
    engine: Engine,
    store: ObjectStore,
    *,
    kind: DatasetKind,
    built: BuiltRows,
    filter_: dict[str, Any],
    qc_run_id: uuid.UUID | None = None,
) -> DatasetInfo:
    """Write built rows as a snapshot: parquet object first, then the rows that point at it.

    Raises:
        EmptySnapshot: no rows.
        SnapshotError: the object cannot be written.
    """
    if not built.rows:
        raise EmptySnapshot(f"no usable episodes for a {kind.value} snapshot with filter {filter_}")
    data = _parquet_bytes(built.rows)
    sha256 = hashlib.sha256(data).hexdigest()
    dataset_id = _snapshot_id(kind, filter_, sha256)
    with Session(engine, expire_on_commit=False) as session:
        existing = session.get(Dataset, dataset_id)
        if existing is not None:
            return DatasetInfo.from_row(existing)
    key = f"datasets/{dataset_id}/{kind.value}.parquet"
    try:
        store.put(key, data, content_type="application/vnd.apache.parquet")
    except ObjectStoreError as e:
        raise SnapshotError(f"cannot write the snapshot {key}: {e}") from e
    row = Dataset(
        id=dataset_id,
        kind=kind.value,
        filter=json.loads(json.dumps(filter_, default=str)),
        qc_run_id=qc_run_id,
        n_rows=len(built.rows),
        n_episodes=len({entry.episode_id for entry in built.lineage}),
        weight_sum=built.weight_sum,
        manifest=built.manifest,
        sha256=sha256,
        object_key=key,
    )
    with Session(engine, expire_on_commit=False) as session:
        session.add(row)
        session.flush()
        session.add_all(
            DatasetEpisode(
                dataset_id=dataset_id, episode_id=e.episode_id, role=e.role, weight=e.weight
            )
            for e in built.lineage
        )
        session.commit()
        return DatasetInfo.from_row(row)


def build_snapshot(
    engine: Engine,
    store: ObjectStore,
    *,
    kind: DatasetKind | str,
    run_ids: Sequence[uuid.UUID] | None = None,
    qc_run_id: uuid.UUID | Sequence[uuid.UUID] | None = None,
    verdicts: Sequence[str] = _USABLE_VERDICTS,
    templates: Sequence[str] | None = None,
    pair_by: str = "task",
    prompt_style: PromptStyle | str = PromptStyle.FULL,
) -> DatasetInfo:
    """Select, build and write a snapshot of `kind`; returns it (existing one if identical).

    Args:
        kind: sft, dpo, kto, grpo, distill or cpt.
        run_ids: collection runs to draw from (default: the QC runs', else every run).
        qc_run_id: gate run whose verdicts and quality scores to use, or several (e.g. an
            oracle and a noisy collection gated separately, or every gate the volume
            trigger counted): each admits episodes of the run it gated; an episode several
            of them judged appears once, with its latest verdict.
        verdicts: verdicts admitted (with `qc_run_id`).
        templates: restrict to these task templates.
        pair_by: DPO grouping, `task` (same instance) or `template`.
        prompt_style: system prompt style of the chats (`full`, or `compact` for small
            local models); recorded in the filter when not `full`.

    Raises:
        EmptySnapshot: nothing usable matched.
        SnapshotError: bad kind, missing QC run, unreadable trajectory or store failure.
    """
    try:
        chosen = DatasetKind(kind)
    except ValueError as e:
        raise SnapshotError(f"unknown dataset kind {kind!r}") from e
    if pair_by not in ("task", "template"):
        raise SnapshotError(f"pair_by must be 'task' or 'template', got {pair_by!r}")
    qc_runs = (
        []
        if qc_run_id is None
        else [qc_run_id]
        if isinstance(qc_run_id, uuid.UUID)
        else list(qc_run_id)
    )
    if len(qc_runs) <= 1:
        episodes = select_episodes(
            engine,
            store,
            run_ids=run_ids,
            qc_run_id=qc_runs[0] if qc_runs else None,
            verdicts=verdicts,
            templates=templates,
        )
    else:
        episodes = []
        latest = latest_gate_of_episodes(engine, qc_runs)
        for q in qc_runs:
            episodes.extend(
                select_episodes(
                    engine,
                    store,
                    run_ids=run_ids,
                    qc_run_id=q,
                    verdicts=verdicts,
                    templates=templates,
                    only_episodes={e for e, gate in latest.items() if gate == q},
                )
            )
    filter_: dict[str, Any] = {
        "run_ids": sorted(str(r) for r in run_ids) if run_ids else None,
        "qc_run_id": str(qc_runs[0]) if len(qc_runs) == 1 else None,
        "verdicts": sorted(verdicts) if qc_runs else None,
        "templates": sorted(templates) if templates else None,
    }
    if len(qc_runs) > 1:
        filter_["qc_run_ids"] = sorted(str(q) for q in qc_runs)
    if chosen == DatasetKind.DPO:
        filter_["pair_by"] = pair_by
    style = PromptStyle(prompt_style)
    if style != PromptStyle.FULL:
        # Only when not the default, so the ids of full-style snapshots stay what they were.
        filter_["prompt_style"] = style.value
    built = build_rows(chosen, episodes, pair_by=pair_by, prompt_style=style)
    return write_snapshot(
        engine,
        store,
        kind=chosen,
        built=built,
        filter_=filter_,
        qc_run_id=qc_runs[0] if len(qc_runs) == 1 else None,
    )


def get_snapshot(engine: Engine, dataset_id: uuid.UUID) -> DatasetInfo:
    """The snapshot with that id.

    Raises:
        SnapshotError: no such snapshot.
    """
    with Session(engine) as session:
        row = session.get(Dataset, dataset_id)
        if row is None:
            raise SnapshotError(f"no dataset {dataset_id}")
        return DatasetInfo.from_row(row)


def read_snapshot(store: ObjectStore, info: DatasetInfo) -> pl.DataFrame:
    """The snapshot's rows, checked against its sha256.

    Raises:
        SnapshotError: the object is missing, unreadable or does not match its sha256.
    """
    return pl.read_parquet(io.BytesIO(_snapshot_bytes(store, info)))


def _snapshot_bytes(store: ObjectStore, info: DatasetInfo) -> bytes:
    try:
        data = store.get(info.object_key)
    except ObjectStoreError as e:
        raise SnapshotError(f"cannot read the snapshot {info.object_key}: {e}") from e
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise SnapshotError(f"snapshot {info.id} does not match its sha256 (the object changed)")
    return data


def fetch_snapshot(store: ObjectStore, info: DatasetInfo, dest: Path) -> Path:
    """Download the snapshot's parquet file to `dest` (a file path), byte for byte, sha256-checked.

    Raises:
        SnapshotError: the object is missing, unreadable or does not match its sha256.
    """
    data = _snapshot_bytes(store, info)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return dest
