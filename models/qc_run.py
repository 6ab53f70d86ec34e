"""`qc_run`: one pass of the quality gate over a collection run."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class QcRun(SQLModel, table=True):
    """A gate run: suite versions, the batch verdict, counts, where the data docs are."""

    __tablename__ = "qc_run"

    id: uuid.UUID = doc("Id of the gate run.", primary_key=True)
    run_id: uuid.UUID = fk("Collection run that was gated.", "collection_run.id", nullable=False)
    suite_versions: dict[str, Any] = json_col("Versions of the GX suites used, by suite name.")
    batch_passed: bool = doc("True when every batch-level expectation passed.", default=False)
    batch_failures: list[Any] = json_col(
        "Failed batch expectations with observed values.", factory=list
    )
    n_episodes: int = doc("Episodes gated.", default=0)
    n_keep: int = doc("Episodes kept at full weight.", default=0)
    n_downweight: int = doc("Episodes kept with reduced weight.", default=0)
    n_discard: int = doc("Episodes discarded.", default=0)
    mean_quality: float | None = doc("Mean quality score of the gated episodes.", default=None)
    docs_key: str | None = doc("Object-store key of the GX data docs index page.", default=None)
    triggered_training: bool = doc(
        "True when this gate run triggered the train deployment.", default=False
    )
    started_at: datetime = time_col("When the gate started (UTC).", index=True)
    ended_at: datetime | None = time_col("When the gate ended (UTC).", nullable=True)
