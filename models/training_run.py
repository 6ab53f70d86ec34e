"""`training_run`: one TRL training job on a dataset snapshot."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col, time_col


class TrainingRun(SQLModel, table=True):
    """Algorithm, config, base model, status and metrics of a training job."""

    __tablename__ = "training_run"

    id: uuid.UUID = doc("Id of the training run.", primary_key=True)
    dataset_id: uuid.UUID = fk("Dataset snapshot trained on.", "dataset.id", nullable=False)
    algo: str = doc("sft, dpo, kto or grpo.", index=True)
    base_model: str = doc("Base model path or checkpoint id it started from.")
    config: dict[str, Any] = json_col("Training settings (learning rate, epochs, beta, …).")
    status: str = doc(
        "running, completed, failed or crashed (its process died while running: marked by "
        "the next training on its host or by `epiflow db orphans --fix`).",
        default="running",
        index=True,
    )
    error: str | None = text_col("Why it failed, if it failed.", nullable=True)
    metrics: dict[str, Any] = json_col("Final metrics (loss, tokens/s, steps, …).")
    prefect_flow_run_id: str | None = doc("Prefect flow run that trained it, if any.", default=None)
    owner: str | None = doc(
        "Process that ran it: host, pid and process start time (NULL on rows older than "
        "the column).",
        default=None,
    )
    started_at: datetime = time_col("When training started (UTC).", index=True)
    ended_at: datetime | None = time_col("When training ended (UTC).", nullable=True)
