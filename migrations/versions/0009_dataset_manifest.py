"""dataset manifest

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01 22:10:00.000000

`dataset.manifest`: what the builder left out of a snapshot and why, counted (e.g. the
assistant turns that did not parse, cut from whole-chat SFT rows). Existing snapshots get
an empty object: nothing was counted when they were built.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0009'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
COMMENT = (
    "What the builder left out and why, counted (e.g. `unparsed_turns_cut`: assistant turns "
    "that did not parse, cut from whole-chat rows); {} when nothing was."
)


# Plain ALTER TABLE (not a batch copy): SQLite adds and drops a column in place (3.35+),
# and a table copy would break the views that read `dataset`.
def upgrade() -> None:
    op.add_column(
        'dataset',
        sa.Column('manifest', _JSON, server_default='{}', nullable=False, comment=COMMENT),
    )


def downgrade() -> None:
    op.drop_column('dataset', 'manifest')
