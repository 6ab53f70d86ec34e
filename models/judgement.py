"""`judgement`: a rubric judge's scores for a whole trajectory (rule judge or LLM GRM)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col, time_col


class Judgement(SQLModel, table=True):
    """Five rubric dimensions 0–5 with cited deductions and a suggestion."""

    __tablename__ = "judgement"

    id: uuid.UUID = doc("Id of the judgement.", primary_key=True)
    episode_id: uuid.UUID = fk("Episode judged.", "episode.id", nullable=False, ondelete="CASCADE")
    qc_run_id: uuid.UUID | None = fk(
        "Gate run that asked for it, if any.", "qc_run.id", ondelete="CASCADE"
    )
    judge: str = doc("`rule` or `grm:<model>` (the LLM judge, EPIFLOW_GRM_MODEL).", index=True)
    judge_version: str = doc("Version of the rubric / judge.")
    parsed: bool = doc(
        "False when the judge's answer could not be parsed (scores are NULL).", default=True
    )
    parse_error: str | None = text_col("Why the answer did not parse.", nullable=True)
    completion: float | None = doc("Task completion, 0–5.", default=None)
    tool_correctness: float | None = doc("Tool correctness, 0–5.", default=None)
    reliability: float | None = doc("Reliability incl. fabricated tool results, 0–5.", default=None)
    cost: float | None = doc("Cost (steps, time, tokens), 0–5.", default=None)
    safety: float | None = doc("Safety (privilege, network, escapes, secrets), 0–5.", default=None)
    deductions: list[Any] = json_col(
        "Deductions: [{dimension, points, steps, reason}].", factory=list
    )
    suggestion: str | None = text_col("One-line suggestion.", nullable=True)
    raw_answer: str | None = text_col("The LLM judge's raw answer (GRM only).", nullable=True)
    created_at: datetime = time_col("When the row was written (UTC).")
