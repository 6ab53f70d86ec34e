"""`qc_result`: the gate's verdict and quality score for one episode."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Index
from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class QcResult(SQLModel, table=True):
    """Verdict (keep / downweight / discard), quality score in [0, 1], and the reasons."""

    __tablename__ = "qc_result"
    # The primary key starts with the gate run; "the latest verdict of an episode"
    # (episode_summary) needs the episode first, or it scans qc_result once per row.
    __table_args__ = (Index("ix_qc_result_episode_created", "episode_id", "created_at"),)

    qc_run_id: uuid.UUID = fk(
        "Gate run.", "qc_run.id", nullable=False, primary_key=True, ondelete="CASCADE"
    )
    episode_id: uuid.UUID = fk(
        "Episode judged.", "episode.id", nullable=False, primary_key=True, ondelete="CASCADE"
    )
    verdict: str = doc("keep, downweight or discard.", index=True)
    quality_score: float = doc("Quality score in [0, 1]; the sampling weight for training.")
    reward_sign: int = doc(
        "+1 when the final reward is non-negative (success or enough partial credit), -1 otherwise.",
        default=0,
    )
    reasons: list[Any] = json_col(
        "Failed expectations and rule findings that shaped the verdict.", factory=list
    )
    created_at: datetime = time_col("When the row was written (UTC).", index=True)
