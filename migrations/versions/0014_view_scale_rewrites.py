"""view scale rewrites: episode_summary's joins, step indexes for the cookbook, artifact.kind

Revision ID: 0014
Revises: 0012
Create Date: 2026-12-02 05:00:00.000000

What `bench/sql_scale.py` (100k episodes, 1M steps, 125k qc_result rows) still found over
a second after 0006, and why (read from `EXPLAIN (ANALYZE, BUFFERS)`):

- `episode_summary`'s latest verdict joined `qc_result` to each episode's latest
  `created_at` with `qr.created_at = latest.created_at`. The planner multiplies the two
  equalities' selectivities and expects ~50 rows where there are 100k, so a query that
  filters on a verdict column (`WHERE quality_score IS NOT NULL`) drove from those "50"
  rows into nested loops over `episode` and `collection_run` (cookbook 4: 1.6 s), and
  cookbook 7's cost crossed the JIT threshold (0.35 s of JIT). The join is now on
  `episode_id` with `qr.created_at >= latest.created_at` as its filter: the same rows
  (`latest.created_at` is the maximum over those very rows, so `>=` holds exactly at the
  maximum, ties included), estimated at a third of the join instead of a 2,000th.
- `episode_summary` joined `collection_run` with an inner join, which PostgreSQL always
  executes; it is now a LEFT JOIN on the primary key, the same rows (`episode.run_id` is
  a NOT NULL foreign key: every episode has its run), which the planner drops when a
  query reads no column of it (`run_key`).
- `step (episode_id) INCLUDE (policy_perturbation) WHERE policy_perturbation IS NOT NULL`:
  cookbook 7 read all 510 MB of `step` for the 7% of rows the noisy policy perturbed.
- `step (tool, duration_ms) WHERE parse_kind = 'tool_call' AND tool IS NOT NULL AND
  duration_ms IS NOT NULL AND injected_fault_kind IS NULL`: exactly the rows of cookbook 8
  (slowest tools), in the order of its ranks, so the ranking needs no sort (the query
  itself now counts calls per tool apart instead of `COUNT(*) OVER`, which buffered
  every call of a tool to disk; docs/sql-cookbook.md).

`artifact.kind`'s comment lists every kind the platform writes: `ctrf` (a Harbor
verifier's report) was missing. Only PostgreSQL stores comments; the view's column
comments are written again after the view is replaced.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from models.views import view_comments

revision: str = '0014'
down_revision: str | None = '0012'
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
"""
EPISODE_SUMMARY_0006 = _COLUMNS + """
        JOIN collection_run r ON r.id = e.run_id
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
EPISODE_SUMMARY = _COLUMNS + """
        LEFT JOIN collection_run r ON r.id = e.run_id
        LEFT JOIN (
            SELECT qr.episode_id, qr.qc_run_id, qr.verdict, qr.quality_score
            FROM qc_result qr
            JOIN (
                SELECT q2.episode_id, MAX(q2.created_at) AS created_at
                FROM qc_result q2
                GROUP BY q2.episode_id
            ) latest ON latest.episode_id = qr.episode_id AND qr.created_at >= latest.created_at
        ) lq ON lq.episode_id = e.id
"""
_KIND_0006 = (
    "What the object is: `trajectory` (an episode's trajectory.json), or `stdout` / "
    "`stderr` (a step's raw output, kept when the row's text is truncated or not clean "
    "UTF-8). Gate docs, datasets and checkpoints live in the store without artifact rows."
)
_KIND = (
    "What the object is: `trajectory` (an episode's trajectory.json), `stdout` / `stderr` "
    "(a step's raw output, kept when the row's text is truncated or not clean UTF-8), or "
    "`ctrf` (a Harbor verifier's CTRF test report). Gate docs, datasets and checkpoints "
    "live in the store without artifact rows."
)
_PERTURBED = sa.text("policy_perturbation IS NOT NULL")
_TIMED_CALLS = sa.text(
    "parse_kind = 'tool_call' AND tool IS NOT NULL AND duration_ms IS NOT NULL "
    "AND injected_fault_kind IS NULL"
)


def upgrade() -> None:
    op.create_index(
        'ix_step_perturbations',
        'step',
        ['episode_id'],
        unique=False,
        postgresql_where=_PERTURBED,
        sqlite_where=_PERTURBED,
        postgresql_include=['policy_perturbation'],
    )
    op.create_index(
        'ix_step_tool_durations',
        'step',
        ['tool', 'duration_ms'],
        unique=False,
        postgresql_where=_TIMED_CALLS,
        sqlite_where=_TIMED_CALLS,
    )
    _episode_summary(EPISODE_SUMMARY)
    if _postgres():
        _artifact_kind(_KIND, _KIND_0006)


def downgrade() -> None:
    if _postgres():
        _artifact_kind(_KIND_0006, _KIND)
    _episode_summary(EPISODE_SUMMARY_0006)
    op.drop_index('ix_step_tool_durations', table_name='step')
    op.drop_index('ix_step_perturbations', table_name='step')


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _episode_summary(sql: str) -> None:
    """Replace the view; on PostgreSQL in place (its grants stay) and with its comments."""
    if not _postgres():
        op.execute("DROP VIEW IF EXISTS episode_summary")
        op.execute(f"CREATE VIEW episode_summary AS {sql}")
        return
    op.execute(f"CREATE OR REPLACE VIEW episode_summary AS {sql}")
    for column, comment in view_comments()["episode_summary"].items():
        quoted = comment.replace("'", "''")
        op.execute(f"COMMENT ON COLUMN episode_summary.{column} IS '{quoted}'")


def _artifact_kind(comment: str, existing: str) -> None:
    op.alter_column(
        'artifact',
        'kind',
        existing_type=sa.String(),
        existing_nullable=False,
        comment=comment,
        existing_comment=existing,
    )
