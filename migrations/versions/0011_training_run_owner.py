"""training run owner: who runs a training, so a killed one can be marked crashed

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 04:45:00.000000

`training_run` gains `owner` (host, pid and process start time of the process running
it), and `training_run.status` the value `crashed` (its process died while running: the
next training on its host, or `epiflow db orphans --fix`, marks it); the status change is
only the column's comment, and only PostgreSQL stores comments.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUS = (
    "running, completed or failed.",
    "running, completed, failed or crashed (its process died while running: marked by the "
    "next training on its host or by `epiflow db orphans --fix`).",
)
_OWNER = (
    "Process that ran it: host, pid and process start time (NULL on rows older than the "
    "column)."
)


def _comment(new: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    old_text, new_text = _STATUS
    op.alter_column(
        'training_run',
        'status',
        existing_type=sqlmodel.sql.sqltypes.AutoString(),
        existing_nullable=False,
        comment=new_text if new else old_text,
        existing_comment=old_text if new else new_text,
    )


def upgrade() -> None:
    _comment(new=True)
    # Plain ALTER TABLE (SQLite >= 3.35 adds and drops columns in place): a batch rebuild
    # of `training_run` would break the `training_lineage` view that reads it.
    op.add_column('training_run', sa.Column('owner', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment=_OWNER))


def downgrade() -> None:
    op.drop_column('training_run', 'owner')
    _comment(new=False)
