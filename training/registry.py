"""The checkpoint registry: `training_run` and `checkpoint` rows, model directories in the object store.

Layout: `checkpoints/<id>/model/…` (the HF directory: weights, config, tokenizer, chat
template, and `training_config.json`) and `checkpoints/<id>/training_config.json` (the
training config alone, `checkpoint.config_key`, readable without downloading weights). Objects
are written before the row that points at them commits.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, select, update
from sqlmodel import Session, col

from agent.trajectory import utcnow
from core.owner import owner_gone, this_process
from models import Checkpoint, Policy, TrainingRun
from storage.errors import ObjectStoreError
from storage.grpo_rollouts import rollout_run_key
from storage.objects import ObjectStore
from storage.runs import close_abandoned_run
from training.errors import CheckpointNotFound, RegistryError
from training.training_config import CONFIG_FILE, TrainingConfig

__all__ = [
    "MONITOR_BREACHES",
    "CheckpointInfo",
    "append_monitor_breach",
    "checkpoint_prefix",
    "fail_training_run",
    "fetch_checkpoint",
    "finish_training_run",
    "get_checkpoint",
    "load_training_config",
    "mark_crashed_training_runs",
    "previous_checkpoint",
    "record_evaluation",
    "register_base_model",
    "save_checkpoint",
    "start_training_run",
]


class CheckpointInfo(BaseModel):
    """A checkpoint row, detached (what flows pass between tasks)."""

    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    """Checkpoint id."""
    training_run_id: uuid.UUID | None
    """Training run that produced it; None for a base model."""
    parent_checkpoint_id: uuid.UUID | None
    """Checkpoint it was trained from, if any."""
    object_prefix: str
    """Object-store prefix of the HF model directory."""
    config_key: str | None
    """Object-store key of the training config."""
    protocol_version: str
    """Protocol version it was trained on."""
    metrics: dict[str, Any]
    """Training metrics at save time."""
    evaluation: dict[str, Any]
    """Latest evaluation."""

    @classmethod
    def from_row(cls, row: Checkpoint) -> CheckpointInfo:
        return cls(
            id=row.id,
            training_run_id=row.training_run_id,
            parent_checkpoint_id=row.parent_checkpoint_id,
            object_prefix=row.object_prefix,
            config_key=row.config_key,
            protocol_version=row.protocol_version,
            metrics=dict(row.metrics),
            evaluation=dict(row.evaluation),
        )


def checkpoint_prefix(checkpoint_id: uuid.UUID) -> str:
    """Object-store prefix of a checkpoint's model directory."""
    return f"checkpoints/{checkpoint_id}/model"


def _upload(
    store: ObjectStore, checkpoint_id: uuid.UUID, model_dir: Path, config: TrainingConfig
) -> tuple[str, str]:
    if not (model_dir / "config.json").is_file():
        raise RegistryError(f"{model_dir} is not an HF model directory (no config.json)")
    body = config.model_dump_json(indent=2).encode()
    (model_dir / CONFIG_FILE).write_bytes(body)
    prefix = checkpoint_prefix(checkpoint_id)
    config_key = f"checkpoints/{checkpoint_id}/{CONFIG_FILE}"
    try:
        store.put_tree(prefix, model_dir)
        store.put(config_key, body, content_type="application/json")
    except ObjectStoreError as e:
        raise RegistryError(f"cannot upload checkpoint {checkpoint_id}: {e}") from e
    return prefix, config_key


def register_base_model(
    engine: Engine,
    store: ObjectStore,
    path: Path,
    *,
    config: TrainingConfig,
    metrics: dict[str, Any] | None = None,
) -> uuid.UUID:
    """Store a base model directory as a checkpoint with no training run; returns its id.

    `metrics`: what building it measured (the copy warm-up's steps and loss, if any).

    Raises:
        RegistryError: `path` is not an HF directory, or the upload failed.
    """
    return save_checkpoint(
        engine, store, training_run_id=None, model_dir=path, config=config, metrics=metrics
    )


def start_training_run(
    engine: Engine,
    *,
    dataset_id: uuid.UUID,
    algo: str,
    base_model: str,
    config: dict[str, Any],
    prefect_flow_run_id: str | None = None,
) -> uuid.UUID:
    """A `training_run` row in status `running`, owned by this process; returns its id.
    First marks the running rows of this host's dead trainings `crashed`
    (`mark_crashed_training_runs`)."""
    mark_crashed_training_runs(engine)
    run_id = uuid.uuid4()
    with Session(engine) as session:
        session.add(
            TrainingRun(
                id=run_id,
                dataset_id=dataset_id,
                algo=algo,
                base_model=base_model,
                config=config,
                status="running",
                metrics={},
                prefect_flow_run_id=prefect_flow_run_id,
                owner=this_process(),
            )
        )
        session.commit()
    return run_id


def mark_crashed_training_runs(engine: Engine, *, dry_run: bool = False) -> list[uuid.UUID]:
    """Mark `crashed` every `running` training run whose owner process ran on this host and
    is gone (killed with SIGKILL, out of memory: nothing could close its row), and its GRPO
    rollout collection run (`grpo-rollouts-<training run id>`, when one is still
    `running`) `interrupted`; returns the training runs' ids (`dry_run`: only finds them).
    Another host's rows, and rows without an owner, are left alone."""
    with engine.connect() as conn:
        running = conn.execute(
            select(col(TrainingRun.id), col(TrainingRun.owner)).where(
                col(TrainingRun.status) == "running", col(TrainingRun.owner).is_not(None)
            )
        ).all()
    dead = [(run_id, owner) for run_id, owner in running if owner and owner_gone(owner)]
    if not dead or dry_run:
        return [run_id for run_id, _ in dead]
    now = utcnow()
    with engine.begin() as conn:
        for run_id, owner in dead:
            conn.execute(
                update(TrainingRun)
                .where(col(TrainingRun.id) == run_id, col(TrainingRun.status) == "running")
                .values(
                    status="crashed",
                    error=f"its process ({owner}) ended without closing the run",
                    ended_at=now,
                )
            )
            # A GRPO training's rollouts were a collection run of that same process, keyed
            # by this training run: no one runs that key again, so it is closed here.
            close_abandoned_run(conn, rollout_run_key(str(run_id)), ended_at=now)
    return [run_id for run_id, _ in dead]


def _end_run(
    engine: Engine, run_id: uuid.UUID, *, status: str, metrics: dict[str, Any], error: str | None
) -> None:
    with Session(engine) as session:
        run = session.get(TrainingRun, run_id)
        if run is None:
            raise RegistryError(f"no training_run {run_id}")
        run.status = status
        run.metrics = metrics
        run.error = error
        run.ended_at = utcnow()
        session.add(run)
        session.commit()


def finish_training_run(engine: Engine, run_id: uuid.UUID, *, metrics: dict[str, Any]) -> None:
    """Mark the run `completed` with its final metrics.

    Raises:
        RegistryError: no such run.
    """
    _end_run(engine, run_id, status="completed", metrics=metrics, error=None)


def fail_training_run(engine: Engine, run_id: uuid.UUID, *, error: str) -> None:
    """Mark the run `failed` with the reason.

    Raises:
        RegistryError: no such run.
    """
    _end_run(engine, run_id, status="failed", metrics={}, error=error)


def save_checkpoint(
    engine: Engine,
    store: ObjectStore,
    *,
    training_run_id: uuid.UUID | None,
    model_dir: Path,
    config: TrainingConfig,
    parent_checkpoint_id: uuid.UUID | None = None,
    metrics: dict[str, Any] | None = None,
) -> uuid.UUID:
    """Upload a model directory with its training config and record the checkpoint
    (`training_run_id` None: a base model).

    Raises:
        RegistryError: not an HF directory, or the upload failed.
    """
    checkpoint_id = uuid.uuid4()
    prefix, config_key = _upload(store, checkpoint_id, model_dir, config)
    with Session(engine) as session:
        session.add(
            Checkpoint(
                id=checkpoint_id,
                training_run_id=training_run_id,
                parent_checkpoint_id=parent_checkpoint_id,
                object_prefix=prefix,
                config_key=config_key,
                protocol_version=config.protocol_version,
                metrics=metrics or {},
                evaluation={},
            )
        )
        session.commit()
    return checkpoint_id


def get_checkpoint(engine: Engine, checkpoint_id: uuid.UUID) -> CheckpointInfo:
    """The checkpoint row.

    Raises:
        CheckpointNotFound: no such checkpoint.
    """
    with Session(engine) as session:
        row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}")
        return CheckpointInfo.from_row(row)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files of a model directory that hold weights (what `weights=False` leaves out)."""


def fetch_checkpoint(
    engine: Engine,
    store: ObjectStore,
    checkpoint_id: uuid.UUID,
    dest: Path,
    *,
    weights: bool = True,
) -> Path:
    """Download the checkpoint's HF directory into `dest`; returns `dest` (an `hf:` policy
    path). Without `weights`, only its configuration and tokenizer files (what a check of
    the tokenizer or its chat template needs, without the download of a model).

    Raises:
        CheckpointNotFound: no such checkpoint, or no stored files under its prefix.
        RegistryError: the download failed.
    """
    info = get_checkpoint(engine, checkpoint_id)
    base = info.object_prefix.rstrip("/") + "/"
    try:
        if weights:
            written = store.get_tree(info.object_prefix, dest)
        else:
            written = [
                store.get_file(key, dest / key[len(base) :])
                for key in store.list(base)
                if not key.endswith(WEIGHT_SUFFIXES)
            ]
    except ObjectStoreError as e:
        raise RegistryError(f"cannot download checkpoint {checkpoint_id}: {e}") from e
    if not written:
        raise CheckpointNotFound(
            f"checkpoint {checkpoint_id} has no files under {info.object_prefix}"
        )
    return dest


def load_training_config(
    engine: Engine, store: ObjectStore, checkpoint_id: uuid.UUID
) -> TrainingConfig:
    """The checkpoint's training config, without downloading weights.

    Raises:
        CheckpointNotFound: no such checkpoint or it has no training config.
        RegistryError: the training config cannot be read.
    """
    info = get_checkpoint(engine, checkpoint_id)
    if info.config_key is None:
        raise CheckpointNotFound(f"checkpoint {checkpoint_id} has no training config")
    try:
        return TrainingConfig.model_validate_json(store.get(info.config_key))
    except ObjectStoreError as e:
        raise RegistryError(f"cannot read {info.config_key}: {e}") from e


def record_evaluation(engine: Engine, checkpoint_id: uuid.UUID, evaluation: dict[str, Any]) -> None:
    """Store the latest evaluation on the checkpoint row (the production monitor's
    breaches recorded against it, `monitor_breaches`, are kept).

    Raises:
        CheckpointNotFound: no such checkpoint.
    """
    with Session(engine) as session:
        row = session.get(Checkpoint, checkpoint_id, with_for_update=True)
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}")
        breaches = (row.evaluation or {}).get(MONITOR_BREACHES)
        row.evaluation = {**evaluation, **({MONITOR_BREACHES: breaches} if breaches else {})}
        session.add(row)
        session.commit()


MONITOR_BREACHES = "monitor_breaches"
"""Key of the production monitor's breaches in a checkpoint's `evaluation` (oldest first)."""


def append_monitor_breach(engine: Engine, checkpoint_id: uuid.UUID, breach: dict[str, Any]) -> int:
    """Add a production-monitor breach to the checkpoint's evaluation (in one transaction,
    the row locked on PostgreSQL); returns how many it has now.

    Raises:
        CheckpointNotFound: no such checkpoint.
    """
    with Session(engine) as session:
        row = session.get(Checkpoint, checkpoint_id, with_for_update=True)
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}")
        evaluation = dict(row.evaluation or {})
        breaches = [*evaluation.get(MONITOR_BREACHES, []), breach]
        row.evaluation = {**evaluation, MONITOR_BREACHES: breaches}
        session.add(row)
        session.commit()
        return len(breaches)


def previous_checkpoint(engine: Engine, checkpoint_id: uuid.UUID) -> uuid.UUID | None:
    """The checkpoint to compare against: its parent, else the newest one saved before it.

    Raises:
        CheckpointNotFound: no such checkpoint.
    """
    with Session(engine) as session:
        row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}")
        if row.parent_checkpoint_id is not None:
            return row.parent_checkpoint_id
        earlier = session.execute(
            select(col(Checkpoint.id))
            .where(col(Checkpoint.created_at) < row.created_at)
            .order_by(col(Checkpoint.created_at).desc())
            .limit(1)
        ).scalar_one_or_none()
        return earlier


def newest_base_model(engine: Engine) -> uuid.UUID | None:
    """The most recently registered base model (a checkpoint no training run produced)."""
    with engine.connect() as conn:
        found: uuid.UUID | None = conn.execute(
            select(col(Checkpoint.id))
            .where(col(Checkpoint.training_run_id).is_(None))
            .order_by(col(Checkpoint.created_at).desc())
            .limit(1)
        ).scalar_one_or_none()
    return found


def link_policy_to_checkpoint(engine: Engine, spec: str, checkpoint_id: uuid.UUID) -> None:
    """Record on the `policy` row `spec` that it runs checkpoint `checkpoint_id` (kind `hf`)."""
    with engine.begin() as conn:
        conn.execute(
            update(Policy)
            .where(col(Policy.id) == spec)
            .values(kind="hf", checkpoint_id=checkpoint_id)
        )
