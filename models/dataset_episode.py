"""`dataset_episode`: lineage, which episodes a dataset snapshot was built from."""

from __future__ import annotations

import uuid

from sqlalchemy import Index
from sqlmodel import SQLModel

from models.columns import doc, fk


class DatasetEpisode(SQLModel, table=True):
    """One episode's membership in a dataset, with its weight and role."""

    __tablename__ = "dataset_episode"
    # "Which snapshots is this episode in" (training_lineage by episode): the primary
    # key starts with the dataset.
    __table_args__ = (Index("ix_dataset_episode_episode_id", "episode_id"),)

    dataset_id: uuid.UUID = fk(
        "Dataset snapshot.", "dataset.id", nullable=False, primary_key=True, ondelete="CASCADE"
    )
    episode_id: uuid.UUID = fk("Episode used.", "episode.id", nullable=False, primary_key=True)
    role: str = doc(
        "How it is used: example, chosen, rejected, desirable, undesirable, prompt.",
        primary_key=True,
    )
    weight: float = doc("Sampling weight in the snapshot (the quality score for SFT).", default=1.0)
