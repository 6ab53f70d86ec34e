"""view indexes and comments

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 22:30:00.000000

Indexes the views need at scale (measured by `bench/sql_scale.py` at 100k episodes):
`qc_result (episode_id, created_at)` for `episode_summary`'s latest verdict of each
episode (without it, one scan of `qc_result` per row: 56 s at 16k episodes), and
`dataset_episode (episode_id)` for `training_lineage` by episode.
"""
from collections.abc import Sequence

from alembic import op

revision: str = '0006'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_qc_result_episode_created', 'qc_result', ['episode_id', 'created_at'], unique=False)
    op.create_index('ix_dataset_episode_episode_id', 'dataset_episode', ['episode_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_dataset_episode_episode_id', table_name='dataset_episode')
    op.drop_index('ix_qc_result_episode_created', table_name='qc_result')
