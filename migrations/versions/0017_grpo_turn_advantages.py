"""grpo turn advantages: each GRPO rollout's advantage per assistant turn

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 01:30:00.000000

`grpo_rollout.turn_advantages` (JSON, JSONB on PostgreSQL, nullable): with per-turn
discounted returns (`EPIFLOW_TRAINING_RETURNS_GAMMA`, opt-in), the advantage the loss gave
each assistant turn's tokens, in step order; NULL for rows written without them (every
row before this revision). One float per turn, so a cell next to `advantage` rather than
an object. `grpo_rollout.advantage`'s comment says it is then the first turn's. Comments
are stored by PostgreSQL only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), "postgresql")

_TURNS = (
    "With per-turn returns (EPIFLOW_TRAINING_RETURNS_GAMMA), the advantage the loss gave "
    "each assistant turn's tokens, in step order; NULL without them or when not trained."
)
_ADVANTAGE = (
    "Group-normalised advantage the loss used; NULL when the group was dropped.",
    "Group-normalised advantage the loss used (with per-turn returns: its first turn's); "
    "NULL when the group was dropped.",
)


def _advantage_comment(new: bool) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column(
        "grpo_rollout",
        "advantage",
        existing_type=sa.Float(),
        existing_nullable=True,
        comment=_ADVANTAGE[1] if new else _ADVANTAGE[0],
        existing_comment=_ADVANTAGE[0] if new else _ADVANTAGE[1],
    )


def upgrade() -> None:
    with op.batch_alter_table("grpo_rollout", schema=None) as batch_op:
        batch_op.add_column(sa.Column("turn_advantages", _JSON, nullable=True, comment=_TURNS))
    _advantage_comment(True)


def downgrade() -> None:
    _advantage_comment(False)
    with op.batch_alter_table("grpo_rollout", schema=None) as batch_op:
        batch_op.drop_column("turn_advantages")
