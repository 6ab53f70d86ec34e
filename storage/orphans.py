"""Objects without a row, rows without their object: what crashes leave in the object store.

Every writer puts its objects before the row that points at them commits, so a process
killed in between leaves objects that no row owns. The key layout, by the row that owns
each object:

| prefix | written by | owned by |
|---|---|---|
| `episodes/<run key>/<episode>/…` (`trajectory.json`, `steps/NNNN.stdout|stderr`, `verifier/ctrf.json`) | `storage.episodes` | an `artifact` row with that key |
| `qc/<run key>/<qc run>/…` (GX data docs) | `flows.qc` `publish-data-docs` | the `qc_run` row (its docs index is `qc_run.docs_key`) |
| `datasets/<dataset>/<kind>.parquet` | `training.snapshots` | the `dataset` row (`dataset.object_key`) |
| `checkpoints/<checkpoint>/model/…`, `checkpoints/<checkpoint>/training_config.json` | `training.registry` | the `checkpoint` row (`object_prefix`, `config_key`) |
| `preflight/probe-…` | `collection.preflight` (deleted at once) | nothing: a killed preflight's probe |

`list_orphans` lists the store once (through the S3 retry policy, like every other call)
and reports both directions: objects under those prefixes that no row owns (`keys`,
collectable with `delete_orphans`), and rows whose object is absent (`missing`: a store
restored from an older backup, a hand-deleted key; never deleted here). Keys outside
those prefixes are not epiflow's and are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel
from sqlalchemy import Engine, select
from sqlmodel import col

from models import Artifact, Checkpoint, CollectionRun, Dataset, QcRun
from storage.objects import ObjectStore

PREFIXES = ("episodes/", "qc/", "datasets/", "checkpoints/", "preflight/")
"""Every top-level prefix epiflow writes."""


class MissingObject(BaseModel):
    """A row that points at an object the store does not hold."""

    table: str
    """The row's table."""
    row: str
    """The row's id (an artifact's: its key)."""
    key: str
    """The key (or prefix) it points at."""


class OrphanReport(BaseModel):
    """What `list_orphans` found."""

    keys: list[str]
    """Objects under epiflow's prefixes that no row owns."""
    missing: list[MissingObject]
    """Rows whose object is absent from the store."""


def _dirs(keys: Iterable[str]) -> set[str]:
    """Every ancestor prefix (ending in `/`) of `keys`."""
    dirs: set[str] = set()
    for key in keys:
        parts = key.split("/")[:-1]
        for n in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:n]) + "/")
    return dirs


def _owned(key: str, exact: set[str], prefixes: set[str]) -> bool:
    if key in exact:
        return True
    parts = key.split("/")[:-1]
    return any("/".join(parts[:n]) + "/" in prefixes for n in range(1, len(parts) + 1))


def list_orphans(engine: Engine, store: ObjectStore) -> OrphanReport:
    """Objects no row owns and rows whose object is gone (see the module docstring).

    Raises:
        ObjectStoreError: the store cannot be listed within its retry policy.
    """
    with engine.connect() as conn:
        artifacts = set(conn.execute(select(col(Artifact.key))).scalars())
        qc_runs = conn.execute(
            select(col(QcRun.id), col(CollectionRun.run_key), col(QcRun.docs_key)).join(
                CollectionRun, col(CollectionRun.id) == col(QcRun.run_id)
            )
        ).all()
        datasets = conn.execute(select(col(Dataset.id), col(Dataset.object_key))).all()
        checkpoints = conn.execute(
            select(col(Checkpoint.id), col(Checkpoint.object_prefix), col(Checkpoint.config_key))
        ).all()
    present = [k for k in store.list("") if k.startswith(PREFIXES)]
    present_set = set(present)
    present_dirs = _dirs(present)

    exact = artifacts | {key for _, key in datasets}
    prefixes = {f"qc/{run_key}/{qc_id}/" for qc_id, run_key, _ in qc_runs}
    prefixes |= {f"checkpoints/{checkpoint_id}/" for checkpoint_id, _, _ in checkpoints}
    keys = [k for k in present if not _owned(k, exact, prefixes)]

    missing = [
        MissingObject(table="artifact", row=k, key=k) for k in sorted(artifacts - present_set)
    ]
    missing += [
        MissingObject(table="qc_run", row=str(qc_id), key=docs)
        for qc_id, _, docs in qc_runs
        if docs is not None and docs not in present_set
    ]
    missing += [
        MissingObject(table="dataset", row=str(dataset_id), key=key)
        for dataset_id, key in datasets
        if key not in present_set
    ]
    for checkpoint_id, prefix, config_key in checkpoints:
        if prefix.rstrip("/") + "/" not in present_dirs:
            missing.append(MissingObject(table="checkpoint", row=str(checkpoint_id), key=prefix))
        if config_key is not None and config_key not in present_set:
            missing.append(
                MissingObject(table="checkpoint", row=str(checkpoint_id), key=config_key)
            )
    return OrphanReport(keys=keys, missing=missing)


def delete_orphans(engine: Engine, store: ObjectStore) -> OrphanReport:
    """Delete the objects `list_orphans` finds no row for (rows without objects are only
    reported); returns the report.

    Raises:
        ObjectStoreError: the store cannot be listed, or refuses a delete.
    """
    report = list_orphans(engine, store)
    for key in report.keys:
        store.delete(key)
    return report
