"""view indexes and comments

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 22:30:00.000000

What the views need at scale (measured by `bench/sql_scale.py`, 100k episodes, 1M steps):

- `qc_result (episode_id, created_at)`: the latest verdict of an episode without a scan
  of `qc_result` per row (the primary key starts with the gate run; 56 s at 16k episodes).
- `episode_summary`'s latest verdict as a join with each episode's latest `created_at`
  (`GROUP BY episode_id`) instead of a correlated `created_at = (SELECT MAX …)`: the same
  rows (ties at the latest time included, as before), with no subplan per row. (A `NOT
  EXISTS` anti-join estimated better on `count(*)` but ran for over 20 minutes on
  `SELECT *` at 100k episodes under load.)
- `step (tool, duration_ms) WHERE parse_kind = 'tool_call' AND tool IS NOT NULL`,
  including on PostgreSQL the columns the failed-call rule reads: the tool-call views and
  cookbook queries read this narrow index instead of every step's text.
- `dataset_episode (episode_id)`: `training_lineage` by episode.

`training_lineage` names, on every row, the training run that made the row's checkpoint
(generation n: the fine-tune's own run, not the generation-0 run on the snapshot). Every
view column carries a comment on PostgreSQL (`models/views.py`: the docstring of the
table column it passes through, or its own line), and `artifact.kind`'s comment lists
the kinds the table holds.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from models.views import view_comments

revision: str = '0006'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = """
        SELECT e.id AS episode_id, r.run_key, e.run_id, e.suite, e.template, e.task_id,
               e.rollout_index, e.policy_id, e.status, e.failure_category, e.claimed_success,
               e.verifier_score, e.final_reward, e.total_reward, e.n_steps, e.n_parse_errors,
               e.n_tool_errors, e.n_injected_faults, e.duration_ms, e.prompt_tokens,
               e.completion_tokens, e.started_at, e.ended_at,
               lq.qc_run_id, lq.verdict AS qc_verdict, lq.quality_score,
               e.cost_usd, e.agent_name
        FROM episode e
        JOIN collection_run r ON r.id = e.run_id
"""
EPISODE_SUMMARY_0003 = _COLUMNS + """
        LEFT JOIN (
            SELECT qr.episode_id, qr.qc_run_id, qr.verdict, qr.quality_score
            FROM qc_result qr
            WHERE qr.created_at = (
                SELECT MAX(q2.created_at) FROM qc_result q2 WHERE q2.episode_id = qr.episode_id
            )
        ) lq ON lq.episode_id = e.id
"""
EPISODE_SUMMARY = _COLUMNS + """
        LEFT JOIN (
            SELECT qr.episode_id, qr.qc_run_id, qr.verdict, qr.quality_score
            FROM qc_result qr
            JOIN (
                SELECT q2.episode_id, MAX(q2.created_at) AS created_at
                FROM qc_result q2
                GROUP BY q2.episode_id
            ) latest ON latest.episode_id = qr.episode_id AND latest.created_at = qr.created_at
        ) lq ON lq.episode_id = e.id
"""
_LINEAGE_HEAD = """
        WITH RECURSIVE descendants (root_id, checkpoint_id, generations) AS (
            SELECT c.id, c.id, 0 FROM checkpoint c WHERE c.training_run_id IS NOT NULL
            UNION ALL
            SELECT dc.root_id, child.id, dc.generations + 1
            FROM descendants dc
            JOIN checkpoint child ON child.parent_checkpoint_id = dc.checkpoint_id
            WHERE dc.generations < 100
        )
"""
_LINEAGE_FROM = """
        FROM dataset_episode de
        JOIN dataset d ON d.id = de.dataset_id
        JOIN episode e ON e.id = de.episode_id
        LEFT JOIN training_run t ON t.dataset_id = d.id
        LEFT JOIN checkpoint c0 ON c0.training_run_id = t.id
        LEFT JOIN descendants dc ON dc.root_id = c0.id
        LEFT JOIN checkpoint c ON c.id = dc.checkpoint_id
"""
TRAINING_LINEAGE_0003 = _LINEAGE_HEAD + """
        SELECT c.id AS checkpoint_id, c.created_at AS checkpoint_created_at,
               t.id AS training_run_id, t.algo, t.status AS training_status,
               d.id AS dataset_id, d.kind AS dataset_kind, d.qc_run_id,
               de.episode_id, de.role, de.weight,
               e.run_id, e.suite, e.template, e.task_id,
               dc.generations, dc.root_id AS trained_checkpoint_id
""" + _LINEAGE_FROM
# The run of each row is the one that made its checkpoint (`tc`); a row without a
# checkpoint keeps the run on the snapshot, if any.
TRAINING_LINEAGE = _LINEAGE_HEAD + """
        SELECT c.id AS checkpoint_id, c.created_at AS checkpoint_created_at,
               COALESCE(tc.id, t.id) AS training_run_id, COALESCE(tc.algo, t.algo) AS algo,
               COALESCE(tc.status, t.status) AS training_status,
               d.id AS dataset_id, d.kind AS dataset_kind, d.qc_run_id,
               de.episode_id, de.role, de.weight,
               e.run_id, e.suite, e.template, e.task_id,
               dc.generations, dc.root_id AS trained_checkpoint_id
""" + _LINEAGE_FROM + """
        LEFT JOIN training_run tc ON tc.id = c.training_run_id
"""
_KIND = (
    "trajectory, stdout, stderr, workspace, qc_docs, dataset, checkpoint, …",
    "What the object is: `trajectory` (an episode's trajectory.json), or `stdout` / "
    "`stderr` (a step's raw output, kept when the row's text is truncated or not clean "
    "UTF-8). Gate docs, datasets and checkpoints live in the store without artifact rows.",
)
VIEWS = (
    "episode_summary",
    "tool_failure_rates",
    "quality_by_suite",
    "quality_by_template",
    "training_lineage",
    "reproducibility_by_suite",
)
"""The views that exist at this revision (the ones its comments are for)."""
_TOOL_CALLS = sa.text("parse_kind = 'tool_call' AND tool IS NOT NULL")
_INCLUDED = ['episode_id', 'injected_fault_kind', 'timed_out', 'error_type', 'signal', 'exit_code']


def upgrade() -> None:
    op.create_index('ix_qc_result_episode_created', 'qc_result', ['episode_id', 'created_at'], unique=False)
    op.create_index('ix_dataset_episode_episode_id', 'dataset_episode', ['episode_id'], unique=False)
    op.create_index(
        'ix_step_tool_calls',
        'step',
        ['tool', 'duration_ms'],
        unique=False,
        postgresql_where=_TOOL_CALLS,
        sqlite_where=_TOOL_CALLS,
        postgresql_include=_INCLUDED,
    )
    _views(EPISODE_SUMMARY, TRAINING_LINEAGE)
    if _postgres():
        _artifact_kind(_KIND[1], _KIND[0])
        for view, columns in view_comments(VIEWS).items():
            for column, comment in columns.items():
                quoted = comment.replace("'", "''")
                op.execute(f"COMMENT ON COLUMN {view}.{column} IS '{quoted}'")


def downgrade() -> None:
    if _postgres():
        _artifact_kind(_KIND[0], _KIND[1])
    _views(EPISODE_SUMMARY_0003, TRAINING_LINEAGE_0003)  # a new view has no comments
    op.drop_index('ix_step_tool_calls', table_name='step')
    op.drop_index('ix_dataset_episode_episode_id', table_name='dataset_episode')
    op.drop_index('ix_qc_result_episode_created', table_name='qc_result')


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _views(episode_summary: str, training_lineage: str) -> None:
    for name, sql in (("episode_summary", episode_summary), ("training_lineage", training_lineage)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
        op.execute(f"CREATE VIEW {name} AS {sql}")


def _artifact_kind(comment: str, existing: str) -> None:
    op.alter_column(
        'artifact',
        'kind',
        existing_type=sa.String(),
        existing_nullable=False,
        comment=comment,
        existing_comment=existing,
    )
