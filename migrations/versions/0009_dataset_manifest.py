"""dataset manifest, checkpoint config comment

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01 22:10:00.000000

`dataset.manifest`: what the builder left out of a snapshot and why, counted (e.g. the
assistant turns that did not parse, cut from whole-chat SFT rows). Existing snapshots get
an empty object: nothing was counted when they were built.
`checkpoint.config_key`'s comment follows the rename of the training config (it is not an
`artifact` row). Comments are stored by PostgreSQL only.
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


CONFIG_KEY = (
    "Object-store key of the training config artifact (tools, prompt, protocol).",
    "Object-store key of the training config (tools, prompt, protocol).",
)


def _config_key_comment(old: str, new: str) -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.alter_column(
        'checkpoint',
        'config_key',
        existing_type=sa.String(),
        existing_nullable=True,
        comment=new,
        existing_comment=old,
    )


# Plain ALTER TABLE (not a batch copy): SQLite adds and drops a column in place (3.35+),
# and a table copy would break the views that read `dataset`.
def upgrade() -> None:
    op.add_column(
        'dataset',
        sa.Column('manifest', _JSON, server_default='{}', nullable=False, comment=COMMENT),
    )
    _config_key_comment(*CONFIG_KEY)


def downgrade() -> None:
    _config_key_comment(CONFIG_KEY[1], CONFIG_KEY[0])
    op.drop_column('dataset', 'manifest')
