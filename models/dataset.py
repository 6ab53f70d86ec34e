"""`dataset`: an immutable training-data snapshot (parquet in the object store)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class Dataset(SQLModel, table=True):
    """A snapshot: kind, filter, counts, weight sum, sha256, lineage to its QC run."""

    __tablename__ = "dataset"

    id: uuid.UUID = doc("Id of the snapshot.", primary_key=True)
    kind: str = doc("sft, dpo, kto, grpo, distill or cpt.", index=True)
    filter: dict[str, Any] = json_col("The selection that built it (runs, verdicts, templates, …).")
    qc_run_id: uuid.UUID | None = fk("Gate run whose verdicts it used, if any.", "qc_run.id")
    n_rows: int = doc("Rows (examples or pairs) in the parquet file.", default=0)
    n_episodes: int = doc("Distinct episodes it draws on.", default=0)
    weight_sum: float = doc("Sum of sampling weights.", default=0.0)
    manifest: dict[str, int] = json_col(
        "What the builder left out and why, counted (e.g. `unparsed_turns_cut`: assistant "
        "turns that did not parse, cut from whole-chat rows); {} when nothing was."
    )
    sha256: str = doc("sha256 of the parquet file.")
    object_key: str = doc("Object-store key of the parquet file.")
    created_at: datetime = time_col("When the snapshot was made (UTC).", index=True)
