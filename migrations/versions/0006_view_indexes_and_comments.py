"""view indexes and comments

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 22:30:00.000000

What the views need at scale (measured by `bench/sql_scale.py`, 100k episodes, 1M steps):

- `qc_result (episode_id, created_at)`: the latest verdict of an episode without a scan
  of `qc_result` per row (the primary key starts with the gate run; 56 s at 16k episodes).
- `episode_summary`'s latest verdict as a join with each episode's latest `created_at`
  (`GROUP BY episode_id`) instead of a correlated subquery: the same rows (ties at the
  latest time included, as before), but the planner estimates it right and hash-joins;
  the correlated form was estimated at 0.5% of its rows and drove nested loops.
- `step (tool, duration_ms) WHERE parse_kind = 'tool_call' AND tool IS NOT NULL`,
  including on PostgreSQL the columns the failed-call rule reads: the tool-call views and
  cookbook queries read this narrow index instead of every step's text.
- `dataset_episode (episode_id)`: `training_lineage` by episode.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

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
    op.execute("DROP VIEW IF EXISTS episode_summary")
    op.execute(f"CREATE VIEW episode_summary AS {EPISODE_SUMMARY}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS episode_summary")
    op.execute(f"CREATE VIEW episode_summary AS {EPISODE_SUMMARY_0003}")
    op.drop_index('ix_step_tool_calls', table_name='step')
    op.drop_index('ix_dataset_episode_episode_id', table_name='dataset_episode')
    op.drop_index('ix_qc_result_episode_created', table_name='qc_result')
