"""honest imported outcomes: the imported status, times only from the file

Revision ID: 0013
Revises: 0014
Create Date: 2026-12-02 04:50:00.000000

`episode.status` and `episode.failure_category` gain the value `imported` (an imported
file recorded no outcome: unknown, not `aborted`); only the comments change, and only
PostgreSQL stores comments. `episode.started_at` and `step.started_at` become nullable: an
imported file with no timestamps leaves them NULL instead of the import time.
`step.observation_key` (and `artifact.kind` `observation`): the object holding an imported observation whole when the row's
`observation` is cut at the inline cap (as `stdout_key` does for stdout).

Existing rows are left as they are: an old import's `aborted` cannot be told from a real
abort, and its invented times from real ones (re-import the file into a new run key).
Downgrade refuses while NULL times exist (it cannot invent them back).

SQLite rebuilds both tables (batch mode) with `legacy_alter_table` on, so renaming the
rebuilt table does not re-check the views that read it (they name the table, not its
storage, and read the new one as they did the old).
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import models.columns  # custom column types (UTCDateTime)

revision: str = '0013'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIME = models.columns.UTCDateTime(timezone=True)
_STATUS = (
    "How it ended: success, failed, timeout, env_error, policy_error, storage_error, "
    "endpoint_error, aborted.",
    "How it ended: success, failed, timeout, env_error, policy_error, storage_error, "
    "endpoint_error, aborted, imported (an imported file recorded no outcome: unknown).",
)
_CATEGORY = (
    "Why it ended: success, verifier_failed, max_steps, timeout, parse_failures, env_error, "
    "policy_error, storage_error, endpoint_error, aborted.",
    "Why it ended: success, verifier_failed, max_steps, timeout, parse_failures, env_error, "
    "policy_error, storage_error, endpoint_error, aborted, imported (unknown).",
)
_EPISODE_STARTED = (
    "When the episode started (UTC).",
    "When the episode started (UTC); NULL for an imported episode whose file has no "
    "timestamp (never the import time).",
)
_STEP_STARTED = (
    "When the policy request was made (UTC).",
    "When the policy request was made (UTC); NULL for an imported step whose file gave "
    "no timestamp.",
)
_CREATED = (
    "When the episode's record was complete: its ended_at, else started_at (UTC); "
    "not when the row was written (an import keeps the episode's own times).",
    "When the episode's record was complete: its ended_at, else started_at (UTC); "
    "when the row was written only for an imported file that has no times.",
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == 'sqlite'


def _comments(new: bool) -> None:
    if _sqlite():
        return
    for column, (old_text, new_text) in (
        ('status', _STATUS),
        ('failure_category', _CATEGORY),
    ):
        op.alter_column(
            'episode',
            column,
            existing_type=sqlmodel.sql.sqltypes.AutoString(),
            existing_nullable=False,
            comment=new_text if new else old_text,
            existing_comment=old_text if new else new_text,
        )
    op.alter_column(
        'episode',
        'created_at',
        existing_type=_TIME,
        existing_nullable=False,
        comment=_CREATED[1] if new else _CREATED[0],
        existing_comment=_CREATED[0] if new else _CREATED[1],
    )


def _started_at(nullable: bool) -> None:
    sqlite = _sqlite()
    if sqlite:
        op.execute('PRAGMA legacy_alter_table=ON')
    for table, (old_text, new_text) in (('episode', _EPISODE_STARTED), ('step', _STEP_STARTED)):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(
                'started_at',
                existing_type=_TIME,
                nullable=nullable,
                comment=new_text if nullable else old_text,
                existing_comment=old_text if nullable else new_text,
            )
    if sqlite:
        op.execute('PRAGMA legacy_alter_table=OFF')


_OBSERVATION_KEY = (
    "Object-store key of the whole observation (UTF-8 text) when `observation` holds it "
    "cut (an imported step past the inline cap); NULL otherwise."
)


_KIND = (
    "What the object is: `trajectory` (an episode's trajectory.json), `stdout` / `stderr` "
    "(a step's raw output, kept when the row's text is truncated or not clean UTF-8), or "
    "`ctrf` (a Harbor verifier's CTRF test report). Gate docs, datasets and checkpoints "
    "live in the store without artifact rows.",
    "What the object is: `trajectory` (an episode's trajectory.json), `stdout` / `stderr` "
    "(a step's raw output, kept when the row's text is truncated or not clean UTF-8), "
    "`ctrf` (a Harbor verifier's CTRF test report), or `observation` (an imported "
    "step's observation, whole, when the row's text is cut at the inline cap). Gate "
    "docs, datasets and checkpoints live in the store without artifact rows.",
)


def _artifact_kind(new: bool) -> None:
    if _sqlite():
        return
    op.alter_column(
        'artifact',
        'kind',
        existing_type=sa.String(),
        existing_nullable=False,
        comment=_KIND[1] if new else _KIND[0],
        existing_comment=_KIND[0] if new else _KIND[1],
    )


def upgrade() -> None:
    _comments(new=True)
    _artifact_kind(new=True)
    _started_at(nullable=True)
    # Plain ALTER TABLE (SQLite >= 3.35 adds and drops columns in place).
    op.add_column(
        'step',
        sa.Column('observation_key', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment=_OBSERVATION_KEY),
    )


def downgrade() -> None:
    for table in ('episode', 'step'):
        missing = op.get_bind().execute(
            sa.text(f'SELECT COUNT(*) FROM {table} WHERE started_at IS NULL')
        ).scalar_one()
        if missing:
            raise RuntimeError(
                f"{missing} {table} row(s) have no started_at (imported without times); "
                "delete those imports before downgrading below 0013"
            )
    op.drop_column('step', 'observation_key')
    _started_at(nullable=False)
    _artifact_kind(new=False)
    _comments(new=False)
