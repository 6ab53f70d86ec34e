"""endpoint outcomes: the endpoint_error status and the per-step retries and model

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 22:10:00.000000

`episode.status` and `episode.failure_category` gain the value `endpoint_error` (the model
endpoint failed: an infrastructure outcome, never the agent's); only the columns'
comments change, and only PostgreSQL stores comments. `step` gains `endpoint_retries`
and `response_model`.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUS = (
    "How it ended: success, failed, timeout, env_error, policy_error, storage_error, aborted.",
    "How it ended: success, failed, timeout, env_error, policy_error, storage_error, "
    "endpoint_error, aborted.",
)
_CATEGORY = (
    "Why it ended: success, verifier_failed, max_steps, timeout, parse_failures, env_error, "
    "policy_error, storage_error, aborted.",
    "Why it ended: success, verifier_failed, max_steps, timeout, parse_failures, env_error, "
    "policy_error, storage_error, endpoint_error, aborted.",
)
_RETRIES = (
    "Retries of the policy request before this answer (transport errors, timeouts, "
    "429/5xx, bodies that were not a chat completion); 0 for policies without an endpoint."
)
_MODEL = "Model name the endpoint reported in its answer, when it reported one."


def _comments(new: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column, (old_text, new_text) in (("status", _STATUS), ("failure_category", _CATEGORY)):
        op.alter_column(
            'episode',
            column,
            existing_type=sqlmodel.sql.sqltypes.AutoString(),
            existing_nullable=False,
            comment=new_text if new else old_text,
            existing_comment=old_text if new else new_text,
        )


def upgrade() -> None:
    _comments(new=True)
    # Plain ALTER TABLE (SQLite >= 3.35 adds and drops columns in place): a batch rebuild
    # of `step` would break the analyst views that read it.
    op.add_column('step', sa.Column('endpoint_retries', sa.Integer(), nullable=False, server_default='0', comment=_RETRIES))
    op.add_column('step', sa.Column('response_model', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment=_MODEL))


def downgrade() -> None:
    op.drop_column('step', 'response_model')
    op.drop_column('step', 'endpoint_retries')
    _comments(new=False)
