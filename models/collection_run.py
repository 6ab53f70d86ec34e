"""`collection_run`: one run of the collection flow (a nightly batch, a demo, a shard)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, json_col, time_col

RUN_NAMESPACE = uuid.UUID("0b8f5a52-3f0e-4f0a-9c47-5d7e1f2a3b4c")


def run_id_for(run_key: str) -> uuid.UUID:
    """The deterministic id of the run with key `run_key` (re-runs resume the same row)."""
    return uuid.uuid5(RUN_NAMESPACE, run_key)


class CollectionRun(SQLModel, table=True):
    """A collection run. Its id is derived from its key, so a re-run resumes it."""

    __tablename__ = "collection_run"

    id: uuid.UUID = doc("Deterministic id: uuid5 of the run key.", primary_key=True)
    run_key: str = doc(
        "Human-chosen or generated key; re-running the same key resumes.", unique=True
    )
    suite: str | None = doc("Suite collected from.", default=None, index=True)
    # Not a foreign key: policy -> checkpoint -> training_run -> dataset -> qc_run -> collection_run
    # would close a cycle. Episodes carry the enforced `episode.policy_id`.
    policy_id: str | None = doc("Policy spec that produced the episodes.", default=None, index=True)
    parameters: dict[str, Any] = json_col("Flow parameters (tasks, rollouts, concurrency, …).")
    sandbox_spec: dict[str, Any] = json_col("The sandbox spec the run used.")
    fault_profile: dict[str, Any] = json_col("Fault-injection profile in force; empty when off.")
    status: str = doc(
        "`running`, `completed`, `failed` or `interrupted` (stopped by a signal; re-running "
        "the key resumes it).",
        default="running",
        index=True,
    )
    prefect_flow_run_id: str | None = doc(
        "Prefect flow run that collected it, if any.", default=None
    )
    started_at: datetime = time_col("When the run started (UTC).", index=True)
    ended_at: datetime | None = time_col("When the run ended (UTC).", nullable=True)
