"""model aliases: `model_alias_change` (every promotion and rollback) and `model_history`

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 16:00:00.000000

A named alias (`champion`, …) points at a checkpoint or an endpoint; every change is a
row with who, when, why and the evidence (issue 45). `model_history` lists each change
with the span it was current (`valid_from`, `valid_to`). Comments are stored by
PostgreSQL only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

from models.columns import UTCDateTime
from models.model_alias import ModelAliasChange
from models.views import view_comments

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), "postgresql")

MODEL_HISTORY = """
        SELECT c.alias, c.seq, c.action, c.checkpoint_id, c.policy_spec,
               c.previous_checkpoint_id, c.changed_at AS valid_from,
               (SELECT MIN(n.changed_at) FROM model_alias_change n
                WHERE n.alias = c.alias AND n.seq > c.seq) AS valid_to,
               CASE WHEN c.seq = (SELECT MAX(m.seq) FROM model_alias_change m
                                  WHERE m.alias = c.alias) THEN 1 ELSE 0 END AS is_current,
               c.reason, c.evidence, c.actor
        FROM model_alias_change c
"""


def _doc(name: str) -> str:
    return str(ModelAliasChange.model_fields[name].description)


def upgrade() -> None:
    op.create_table(
        "model_alias_change",
        sa.Column("id", sa.Integer(), nullable=False, comment=_doc("id")),
        sa.Column(
            "alias", sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment=_doc("alias")
        ),
        sa.Column("seq", sa.Integer(), nullable=False, comment=_doc("seq")),
        sa.Column(
            "action", sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment=_doc("action")
        ),
        sa.Column("checkpoint_id", sa.Uuid(), nullable=True, comment=_doc("checkpoint_id")),
        sa.Column(
            "policy_spec",
            sqlmodel.sql.sqltypes.AutoString(),
            nullable=True,
            comment=_doc("policy_spec"),
        ),
        sa.Column(
            "previous_checkpoint_id",
            sa.Uuid(),
            nullable=True,
            comment=_doc("previous_checkpoint_id"),
        ),
        sa.Column("reason", sa.Text(), nullable=False, comment=_doc("reason")),
        sa.Column("evidence", _JSON, nullable=False, comment=_doc("evidence")),
        sa.Column(
            "actor", sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment=_doc("actor")
        ),
        sa.Column("changed_at", UTCDateTime(), nullable=False, comment=_doc("changed_at")),
        sa.ForeignKeyConstraint(["checkpoint_id"], ["checkpoint.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("alias", "seq", name="uq_model_alias_change_seq"),
    )
    op.create_index("ix_model_alias_change_alias", "model_alias_change", ["alias"])
    op.create_index("ix_model_alias_change_checkpoint_id", "model_alias_change", ["checkpoint_id"])
    op.create_index("ix_model_alias_change_changed_at", "model_alias_change", ["changed_at"])
    op.execute(f"CREATE VIEW model_history AS {MODEL_HISTORY}")
    if op.get_bind().dialect.name == "postgresql":
        for view, columns in view_comments(["model_history"]).items():
            for column, text in columns.items():
                quoted = text.replace("'", "''")
                op.execute(f"COMMENT ON COLUMN {view}.{column} IS '{quoted}'")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS model_history")
    op.drop_index("ix_model_alias_change_changed_at", table_name="model_alias_change")
    op.drop_index("ix_model_alias_change_checkpoint_id", table_name="model_alias_change")
    op.drop_index("ix_model_alias_change_alias", table_name="model_alias_change")
    op.drop_table("model_alias_change")
