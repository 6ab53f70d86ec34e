"""collection run status interrupted

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 16:30:00.000000

`collection_run.status` gains the value `interrupted` (a run stopped by a signal); only
the column's comment changes, and only PostgreSQL stores comments.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW = (
    "`running`, `completed`, `failed` or `interrupted` (stopped by a signal; re-running "
    "the key resumes it)."
)
OLD = "`running`, `completed` or `failed`."


def _comment(comment: str, existing: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        'collection_run',
        'status',
        existing_type=sa.String(),
        existing_nullable=False,
        comment=comment,
        existing_comment=existing,
    )


def upgrade() -> None:
    _comment(NEW, OLD)


def downgrade() -> None:
    _comment(OLD, NEW)
