"""imports, lineage and honest columns

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 16:19:29.523280

Columns for what imported (ATIF) trajectories carry: step reasoning, cached tokens and
cost, episode cost and agent identity. Episode token totals become NULL when no step
reported tokens (scripted policies), instead of a 0 that reads like a report; existing
rows are corrected. Comments that said something the code does not do are fixed
(`created_at` of episodes, artifacts, policies and tasks; `policy.kind`).

Views: `quality_by_template` (verdicts and quality per template per gate run) is new;
`training_lineage` follows every dataset an episode is in, its training runs and every
checkpoint descended from them (children of children included), and keeps datasets
nobody trained on; `episode_summary` gains `cost_usd` and `agent_name`. SQLite rebuilds
`episode` to relax its token columns, so every view is dropped first and created again.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import models.columns  # custom column types (UTCDateTime)
from sqlalchemy.dialects import postgresql

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIME = models.columns.UTCDateTime(timezone=True)
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')

# --- views (portable SQL: the same text runs on SQLite and PostgreSQL) ------------------

_TOOL_FAILED = (
    "s.timed_out OR s.error_type IS NOT NULL OR s.signal IS NOT NULL "
    "OR (s.exit_code IS NOT NULL AND s.exit_code <> 0)"
)
_LATEST_QC = """
        LEFT JOIN (
            SELECT qr.episode_id, qr.qc_run_id, qr.verdict, qr.quality_score
            FROM qc_result qr
            WHERE qr.created_at = (
                SELECT MAX(q2.created_at) FROM qc_result q2 WHERE q2.episode_id = qr.episode_id
            )
        ) lq ON lq.episode_id = e.id
"""
EPISODE_SUMMARY_0001 = f"""
        SELECT e.id AS episode_id, r.run_key, e.run_id, e.suite, e.template, e.task_id,
               e.rollout_index, e.policy_id, e.status, e.failure_category, e.claimed_success,
               e.verifier_score, e.final_reward, e.total_reward, e.n_steps, e.n_parse_errors,
               e.n_tool_errors, e.n_injected_faults, e.duration_ms, e.prompt_tokens,
               e.completion_tokens, e.started_at, e.ended_at,
               lq.qc_run_id, lq.verdict AS qc_verdict, lq.quality_score
        FROM episode e
        JOIN collection_run r ON r.id = e.run_id
{_LATEST_QC}"""
EPISODE_SUMMARY = f"""
        SELECT e.id AS episode_id, r.run_key, e.run_id, e.suite, e.template, e.task_id,
               e.rollout_index, e.policy_id, e.status, e.failure_category, e.claimed_success,
               e.verifier_score, e.final_reward, e.total_reward, e.n_steps, e.n_parse_errors,
               e.n_tool_errors, e.n_injected_faults, e.duration_ms, e.prompt_tokens,
               e.completion_tokens, e.started_at, e.ended_at,
               lq.qc_run_id, lq.verdict AS qc_verdict, lq.quality_score,
               e.cost_usd, e.agent_name
        FROM episode e
        JOIN collection_run r ON r.id = e.run_id
{_LATEST_QC}"""
TOOL_FAILURE_RATES = f"""
        SELECT e.suite, s.tool, COALESCE(s.injected_fault_kind, 'none') AS fault_kind,
               COUNT(*) AS calls,
               SUM(CASE WHEN {_TOOL_FAILED} THEN 1 ELSE 0 END) AS failures,
               CAST(SUM(CASE WHEN {_TOOL_FAILED} THEN 1 ELSE 0 END) AS FLOAT) / COUNT(*)
                   AS failure_rate
        FROM step s
        JOIN episode e ON e.id = s.episode_id
        WHERE s.parse_kind = 'tool_call' AND s.tool IS NOT NULL
        GROUP BY e.suite, s.tool, COALESCE(s.injected_fault_kind, 'none')
    """
QUALITY_BY_SUITE = """
        SELECT e.suite, q.qc_run_id, COUNT(*) AS episodes,
               SUM(CASE WHEN q.verdict = 'keep' THEN 1 ELSE 0 END) AS keep,
               SUM(CASE WHEN q.verdict = 'downweight' THEN 1 ELSE 0 END) AS downweight,
               SUM(CASE WHEN q.verdict = 'discard' THEN 1 ELSE 0 END) AS discard,
               AVG(q.quality_score) AS mean_quality,
               MIN(q.quality_score) AS min_quality,
               MAX(q.quality_score) AS max_quality
        FROM qc_result q
        JOIN episode e ON e.id = q.episode_id
        GROUP BY e.suite, q.qc_run_id
    """
QUALITY_BY_TEMPLATE = """
        SELECT q.qc_run_id, g.run_id, e.suite, e.template, COUNT(*) AS episodes,
               SUM(CASE WHEN q.verdict = 'keep' THEN 1 ELSE 0 END) AS keep,
               SUM(CASE WHEN q.verdict = 'downweight' THEN 1 ELSE 0 END) AS downweight,
               SUM(CASE WHEN q.verdict = 'discard' THEN 1 ELSE 0 END) AS discard,
               AVG(q.quality_score) AS mean_quality,
               MIN(q.quality_score) AS min_quality,
               MAX(q.quality_score) AS max_quality
        FROM qc_result q
        JOIN qc_run g ON g.id = q.qc_run_id
        JOIN episode e ON e.id = q.episode_id
        GROUP BY q.qc_run_id, g.run_id, e.suite, e.template
    """
REPRODUCIBILITY_BY_SUITE = """
    SELECT e.suite, COUNT(*) AS replays,
           SUM(CASE WHEN r.identical_steps = r.steps THEN 1 ELSE 0 END) AS identical_episodes,
           CAST(SUM(CASE WHEN r.identical_steps = r.steps THEN 1 ELSE 0 END) AS FLOAT) / COUNT(*)
               AS reproducibility_rate,
           CAST(SUM(r.identical_steps) AS FLOAT) / NULLIF(SUM(r.steps), 0) AS step_reproducibility
    FROM replay_result r
    JOIN episode e ON e.id = r.episode_id
    GROUP BY e.suite
"""
TRAINING_LINEAGE_0001 = """
        SELECT c.id AS checkpoint_id, c.created_at AS checkpoint_created_at,
               t.id AS training_run_id, t.algo, t.status AS training_status,
               d.id AS dataset_id, d.kind AS dataset_kind, d.qc_run_id,
               de.episode_id, de.role, de.weight,
               e.run_id, e.suite, e.template, e.task_id
        FROM checkpoint c
        JOIN training_run t ON t.id = c.training_run_id
        JOIN dataset d ON d.id = t.dataset_id
        JOIN dataset_episode de ON de.dataset_id = d.id
        JOIN episode e ON e.id = de.episode_id
    """
# One row per (episode, role, dataset, training run, checkpoint): the checkpoint trained
# on the dataset (generations 0) and every checkpoint fine-tuned from it, at any depth
# (generations n: n fine-tunes later; `trained_checkpoint_id` is the generation-0 one).
# A dataset nobody trained on, or a training run without a checkpoint, keeps its rows
# with NULLs. The depth cap only guards against a corrupted parent cycle.
TRAINING_LINEAGE = """
        WITH RECURSIVE descendants (root_id, checkpoint_id, generations) AS (
            SELECT c.id, c.id, 0 FROM checkpoint c WHERE c.training_run_id IS NOT NULL
            UNION ALL
            SELECT dc.root_id, child.id, dc.generations + 1
            FROM descendants dc
            JOIN checkpoint child ON child.parent_checkpoint_id = dc.checkpoint_id
            WHERE dc.generations < 100
        )
        SELECT c.id AS checkpoint_id, c.created_at AS checkpoint_created_at,
               t.id AS training_run_id, t.algo, t.status AS training_status,
               d.id AS dataset_id, d.kind AS dataset_kind, d.qc_run_id,
               de.episode_id, de.role, de.weight,
               e.run_id, e.suite, e.template, e.task_id,
               dc.generations, dc.root_id AS trained_checkpoint_id
        FROM dataset_episode de
        JOIN dataset d ON d.id = de.dataset_id
        JOIN episode e ON e.id = de.episode_id
        LEFT JOIN training_run t ON t.dataset_id = d.id
        LEFT JOIN checkpoint c0 ON c0.training_run_id = t.id
        LEFT JOIN descendants dc ON dc.root_id = c0.id
        LEFT JOIN checkpoint c ON c.id = dc.checkpoint_id
    """

VIEWS_0002 = {
    "episode_summary": EPISODE_SUMMARY_0001,
    "tool_failure_rates": TOOL_FAILURE_RATES,
    "quality_by_suite": QUALITY_BY_SUITE,
    "training_lineage": TRAINING_LINEAGE_0001,
    "reproducibility_by_suite": REPRODUCIBILITY_BY_SUITE,
}
VIEWS = {
    "episode_summary": EPISODE_SUMMARY,
    "tool_failure_rates": TOOL_FAILURE_RATES,
    "quality_by_suite": QUALITY_BY_SUITE,
    "quality_by_template": QUALITY_BY_TEMPLATE,
    "training_lineage": TRAINING_LINEAGE,
    "reproducibility_by_suite": REPRODUCIBILITY_BY_SUITE,
}

_COMMENTS = {
    ("artifact", "created_at"): (
        "When the row was written (UTC).",
        "The episode's ended_at, else started_at (UTC); not when the object or row was written.",
    ),
    ("episode", "created_at"): (
        "When the row was written (UTC).",
        "When the episode's record was complete: its ended_at, else started_at (UTC); "
        "not when the row was written (an import keeps the episode's own times).",
    ),
    ("policy", "created_at"): (
        "When the row was first written (UTC).",
        "Start time of the episode whose ingest created the row (UTC); not when it was written.",
    ),
    ("task", "created_at"): (
        "When the row was first written (UTC).",
        "Start time of the episode whose ingest created the row (UTC); not when it was written.",
    ),
}
_KIND = (
    "Policy family: `scripted`, `openai` or `hf`.",
    "Policy family: `scripted`, `openai` or `hf` for policies epiflow ran; `atif` for an "
    "imported ATIF agent (id `atif:<agent>@<version>#<model>`); `imported` for imported "
    "OpenAI chat messages.",
)
_CONFIG = (
    "Non-secret configuration of the policy (rates, model name).",
    "Non-secret configuration of the policy; for an `atif` policy the agent's name, "
    "version and model.",
)
_PROMPT_TOKENS = (
    "Prompt tokens over all steps, as reported by the policy.",
    "Prompt tokens over the steps that reported them; NULL when no step did "
    "(scripted policies report none).",
)
_COMPLETION_TOKENS = (
    "Completion tokens over all steps, as reported by the policy.",
    "Completion tokens over the steps that reported them; NULL when no step did.",
)
_STEP_PROMPT_TOKENS = (
    "Prompt tokens reported by the policy.",
    "Prompt tokens reported by the policy; NULL when it reports none.",
)
_ERROR_TYPE = (
    "Typed tool failure (not_found, permission_denied, timeout, …).",
    "Typed tool failure (nonzero_exit, not_found, timeout, …; every value is listed in "
    "docs/trajectory-schema.md); NULL when the call succeeded or did not run.",
)


def _drop_views(names: Sequence[str]) -> None:
    for name in names:
        op.execute(f"DROP VIEW IF EXISTS {name}")


def _create_views(views: dict[str, str]) -> None:
    for name, sql in views.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _time_comment(table: str, column: str, *, new: bool) -> None:
    if _sqlite():  # SQLite keeps no comments; altering one would rebuild the table
        return
    old_text, new_text = _COMMENTS[(table, column)]
    with op.batch_alter_table(table, schema=None) as batch_op:
        batch_op.alter_column(
            column,
            existing_type=_TIME,
            comment=new_text if new else old_text,
            existing_comment=old_text if new else new_text,
            existing_nullable=False,
        )


def upgrade() -> None:
    # SQLite rebuilds `episode` (nullable token columns); views reading it must go first.
    _drop_views(list(VIEWS))
    # ### commands auto generated by Alembic, reviewed: batch mode for SQLite ###
    _time_comment('artifact', 'created_at', new=True)
    with op.batch_alter_table('episode', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cost_usd', sa.Float(), nullable=True, comment='Cost in USD over the steps that reported one (imported episodes); NULL when none did.'))
        batch_op.add_column(sa.Column('agent_name', sqlmodel.sql.sqltypes.AutoString(), server_default='epiflow', nullable=False, comment='Agent system that produced the episode: `epiflow` for episodes collected here, the ATIF `agent.name` of an imported one (`openhands`, `terminus-2`, …).'))
        batch_op.add_column(sa.Column('agent_version', sqlmodel.sql.sqltypes.AutoString(), server_default='1', nullable=False, comment="Version of that agent system (`1` for epiflow's loop)."))
        batch_op.alter_column('prompt_tokens', existing_type=sa.Integer(), nullable=True, comment=_PROMPT_TOKENS[1], existing_comment=_PROMPT_TOKENS[0])
        batch_op.alter_column('completion_tokens', existing_type=sa.Integer(), nullable=True, comment=_COMPLETION_TOKENS[1], existing_comment=_COMPLETION_TOKENS[0])
        batch_op.create_index(batch_op.f('ix_episode_agent_name'), ['agent_name'], unique=False)
    _time_comment('episode', 'created_at', new=True)
    if not _sqlite():
        op.alter_column('policy', 'kind', existing_type=sqlmodel.sql.sqltypes.AutoString(), comment=_KIND[1], existing_comment=_KIND[0], existing_nullable=False)
        op.alter_column('policy', 'config', existing_type=_JSON, comment=_CONFIG[1], existing_comment=_CONFIG[0], existing_nullable=False)
    _time_comment('policy', 'created_at', new=True)
    with op.batch_alter_table('step', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cached_tokens', sa.Integer(), nullable=True, comment='Cached subset of prompt_tokens, when reported.'))
        batch_op.add_column(sa.Column('cost_usd', sa.Float(), nullable=True, comment='Cost of the turn in USD, when reported.'))
        batch_op.add_column(sa.Column('reasoning_content', sa.Text(), nullable=True, comment="The model's explicit reasoning for the turn, when returned apart from its answer (ATIF reasoning_content)."))
    if not _sqlite():
        op.alter_column('step', 'prompt_tokens', existing_type=sa.Integer(), comment=_STEP_PROMPT_TOKENS[1], existing_comment=_STEP_PROMPT_TOKENS[0], existing_nullable=True)
        op.alter_column('step', 'error_type', existing_type=sqlmodel.sql.sqltypes.AutoString(), comment=_ERROR_TYPE[1], existing_comment=_ERROR_TYPE[0], existing_nullable=True)
    _time_comment('task', 'created_at', new=True)
    # ### end Alembic commands ###

    # A 0 total that no step reported is "not reported".
    for column in ("prompt_tokens", "completion_tokens"):
        op.execute(
            f"UPDATE episode SET {column} = NULL WHERE NOT EXISTS ("
            f"SELECT 1 FROM step s WHERE s.episode_id = episode.id AND s.{column} IS NOT NULL)"
        )
    _create_views(VIEWS)


def downgrade() -> None:
    _drop_views(list(VIEWS))
    for column in ("prompt_tokens", "completion_tokens"):
        op.execute(f"UPDATE episode SET {column} = 0 WHERE {column} IS NULL")
    # ### commands auto generated by Alembic, reviewed: batch mode for SQLite ###
    _time_comment('task', 'created_at', new=False)
    if not _sqlite():
        op.alter_column('step', 'error_type', existing_type=sqlmodel.sql.sqltypes.AutoString(), comment=_ERROR_TYPE[0], existing_comment=_ERROR_TYPE[1], existing_nullable=True)
        op.alter_column('step', 'prompt_tokens', existing_type=sa.Integer(), comment=_STEP_PROMPT_TOKENS[0], existing_comment=_STEP_PROMPT_TOKENS[1], existing_nullable=True)
    with op.batch_alter_table('step', schema=None) as batch_op:
        batch_op.drop_column('reasoning_content')
        batch_op.drop_column('cost_usd')
        batch_op.drop_column('cached_tokens')
    _time_comment('policy', 'created_at', new=False)
    if not _sqlite():
        op.alter_column('policy', 'config', existing_type=_JSON, comment=_CONFIG[0], existing_comment=_CONFIG[1], existing_nullable=False)
        op.alter_column('policy', 'kind', existing_type=sqlmodel.sql.sqltypes.AutoString(), comment=_KIND[0], existing_comment=_KIND[1], existing_nullable=False)
    _time_comment('episode', 'created_at', new=False)
    with op.batch_alter_table('episode', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_episode_agent_name'))
        batch_op.alter_column('completion_tokens', existing_type=sa.Integer(), nullable=False, comment=_COMPLETION_TOKENS[0], existing_comment=_COMPLETION_TOKENS[1])
        batch_op.alter_column('prompt_tokens', existing_type=sa.Integer(), nullable=False, comment=_PROMPT_TOKENS[0], existing_comment=_PROMPT_TOKENS[1])
        batch_op.drop_column('agent_version')
        batch_op.drop_column('agent_name')
        batch_op.drop_column('cost_usd')
    _time_comment('artifact', 'created_at', new=False)
    # ### end Alembic commands ###
    _create_views(VIEWS_0002)
