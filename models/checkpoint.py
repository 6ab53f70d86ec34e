"""`checkpoint`: a trained model directory in the object store, with its training config."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class Checkpoint(SQLModel, table=True):
    """A checkpoint: where it is, what produced it, and how it evaluated."""

    __tablename__ = "checkpoint"

    id: uuid.UUID = doc("Id of the checkpoint.", primary_key=True)
    training_run_id: uuid.UUID | None = fk(
        "Training run that produced it (NULL for a base model).", "training_run.id"
    )
    parent_checkpoint_id: uuid.UUID | None = fk(
        "Checkpoint it was trained from, if any.", "checkpoint.id"
    )
    object_prefix: str = doc("Object-store prefix of the HF model directory.")
    config_key: str | None = doc(
        "Object-store key of the training config (tools, prompt, protocol).", default=None
    )
    protocol_version: str = doc("Tool-call protocol the model was trained on.", default="1")
    metrics: dict[str, Any] = json_col("Training metrics at save time.")
    evaluation: dict[str, Any] = json_col(
        "Latest evaluation: completion_rate, avg_steps, tool_failure_rate, …"
    )
    created_at: datetime = time_col("When it was saved (UTC).", index=True)
