"""episode links: ATIF sessions, sub-agents, continuations, copied context, the tree view

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 04:50:00.000000

`atif_document`: the ATIF identity of an imported episode (`session_id`, `trajectory_id`,
the file it came from, the document that embeds it). `episode_link`: every reference an
imported document makes, a sub-agent (`subagent_trajectory_ref`, embedded
`subagent_trajectories`) or a continuation (`continued_trajectory_ref`), with the episode it
names once that document is imported (`child_episode_id` NULL until then).
`step.is_copied_context`: ATIF v1.5's mark on steps copied from an earlier trajectory.
`episode_tree`: the trees the links make, tokens and cost per node and rolled up.
Comments are stored by PostgreSQL only.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

from models.views import view_comments

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql')
_COPIED = (
    "True for an imported ATIF step marked `is_copied_context` (v1.5): copied from an "
    "earlier trajectory for context; never a training target, and not counted in "
    "`episode_tree`'s tokens and cost (the earlier trajectory paid for it)."
)

# Roots: imported documents no other episode links to. `CASE WHEN 1 = 0 …` is a NULL of
# the uuid type on PostgreSQL (a recursive CTE's columns must type alike in both terms).
EPISODE_TREE = """
        WITH RECURSIVE tree (root_episode_id, episode_id, parent_episode_id, link_kind,
                             depth, path) AS (
            SELECT d.episode_id, d.episode_id, CASE WHEN 1 = 0 THEN d.episode_id END,
                   CAST('root' AS TEXT), 0, CAST('root' AS TEXT)
            FROM atif_document d
            WHERE NOT EXISTS (
                SELECT 1 FROM episode_link l
                WHERE l.child_episode_id = d.episode_id AND l.parent_episode_id <> d.episode_id
            )
            UNION ALL
            SELECT t.root_episode_id, l.child_episode_id, l.parent_episode_id,
                   CAST(l.kind AS TEXT), t.depth + 1,
                   CAST(t.path || '/' || l.kind || '.' || CAST(l.ordinal AS TEXT) AS TEXT)
            FROM tree t
            JOIN episode_link l ON l.parent_episode_id = t.episode_id
            WHERE l.child_episode_id IS NOT NULL AND t.depth < 64
        ),
        node AS (
            SELECT s.episode_id,
                   COUNT(*) AS n_steps,
                   SUM(CASE WHEN s.is_copied_context THEN 1 ELSE 0 END) AS copied_steps,
                   SUM(CASE WHEN s.is_copied_context THEN NULL ELSE s.prompt_tokens END)
                       AS prompt_tokens,
                   SUM(CASE WHEN s.is_copied_context THEN NULL ELSE s.completion_tokens END)
                       AS completion_tokens,
                   SUM(CASE WHEN s.is_copied_context THEN NULL ELSE s.cost_usd END) AS cost_usd
            FROM step s
            WHERE s.episode_id IN (SELECT episode_id FROM tree)
            GROUP BY s.episode_id
        ),
        subtree AS (
            SELECT a.root_episode_id, a.path,
                   SUM(n.prompt_tokens) AS prompt_tokens,
                   SUM(n.completion_tokens) AS completion_tokens,
                   SUM(n.cost_usd) AS cost_usd
            FROM tree a
            JOIN tree b ON b.root_episode_id = a.root_episode_id
                       AND (b.path = a.path OR b.path LIKE a.path || '/%')
            LEFT JOIN node n ON n.episode_id = b.episode_id
            GROUP BY a.root_episode_id, a.path
        )
        SELECT t.root_episode_id, t.episode_id, t.parent_episode_id, t.link_kind, t.depth,
               t.path, d.session_id, rd.session_id AS root_session_id, e.agent_name,
               COALESCE(n.n_steps, 0) AS n_steps, COALESCE(n.copied_steps, 0) AS copied_steps,
               n.prompt_tokens, n.completion_tokens, n.cost_usd,
               st.prompt_tokens AS subtree_prompt_tokens,
               st.completion_tokens AS subtree_completion_tokens,
               st.cost_usd AS subtree_cost_usd
        FROM tree t
        JOIN episode e ON e.id = t.episode_id
        LEFT JOIN atif_document d ON d.episode_id = t.episode_id
        LEFT JOIN atif_document rd ON rd.episode_id = t.root_episode_id
        LEFT JOIN node n ON n.episode_id = t.episode_id
        JOIN subtree st ON st.root_episode_id = t.root_episode_id AND st.path = t.path
"""


def upgrade() -> None:
    op.create_table('atif_document',
    sa.Column('episode_id', sa.Uuid(), nullable=False, comment='The episode the document was imported as.'),
    sa.Column('session_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment="The document's ATIF `session_id` (the producer's run; several documents may share one, e.g. a trajectory and its continuation)."),
    sa.Column('trajectory_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment="The document's ATIF `trajectory_id` (v1.7), what sub-agent refs resolve by."),
    sa.Column('schema_version', sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment="The document's ATIF `schema_version` (`ATIF-v1.5`, …)."),
    sa.Column('source_name', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment='Name of the file it was imported from (what `trajectory_path` and `continued_trajectory_ref` resolve by); NULL when not imported from a file.'),
    sa.Column('source_dir', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment='Absolute folder of that file on the machine that imported it.'),
    sa.Column('embedded_in', sa.Uuid(), nullable=True, comment="The episode whose document embeds this one (`subagent_trajectories`, v1.7); NULL for a document of its own. An export of the run writes it inside that document only."),
    sa.ForeignKeyConstraint(['embedded_in'], ['episode.id'], name=op.f('fk_atif_document_embedded_in_episode'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['episode_id'], ['episode.id'], name=op.f('fk_atif_document_episode_id_episode'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('episode_id', name=op.f('pk_atif_document'))
    )
    op.create_index(op.f('ix_atif_document_embedded_in'), 'atif_document', ['embedded_in'], unique=False)
    op.create_index(op.f('ix_atif_document_session_id'), 'atif_document', ['session_id'], unique=False)
    op.create_index(op.f('ix_atif_document_source_name'), 'atif_document', ['source_name'], unique=False)
    op.create_index(op.f('ix_atif_document_trajectory_id'), 'atif_document', ['trajectory_id'], unique=False)
    op.create_table('episode_link',
    sa.Column('parent_episode_id', sa.Uuid(), nullable=False, comment='The episode whose document makes the reference.'),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment='`subagent` (the parent\'s step delegated to the child) or `continuation` (the child continues the parent).'),
    sa.Column('ordinal', sa.Integer(), nullable=False, comment="Position of the reference among the parent's references of this kind (0-based, document order)."),
    sa.Column('child_episode_id', sa.Uuid(), nullable=True, comment='The episode the reference names; NULL while that document is not imported (resolved when it is).'),
    sa.Column('step_id', sa.Integer(), nullable=True, comment="ATIF `step_id` of the parent's step whose observation holds a sub-agent reference; NULL for a continuation."),
    sa.Column('ref_session_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment='The `session_id` the reference names, as written.'),
    sa.Column('ref_trajectory_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment='The `trajectory_id` the reference names (v1.7), as written.'),
    sa.Column('ref_path', sqlmodel.sql.sqltypes.AutoString(), nullable=True, comment='The `trajectory_path` or `continued_trajectory_ref` the reference names, as written.'),
    sa.Column('ref_extra', _JSON, nullable=True, comment="The reference's own `extra` metadata (e.g. Harbor's summary of the sub-agent)."),
    sa.ForeignKeyConstraint(['child_episode_id'], ['episode.id'], name=op.f('fk_episode_link_child_episode_id_episode'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['parent_episode_id'], ['episode.id'], name=op.f('fk_episode_link_parent_episode_id_episode'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('parent_episode_id', 'kind', 'ordinal', name=op.f('pk_episode_link'))
    )
    op.create_index(op.f('ix_episode_link_child_episode_id'), 'episode_link', ['child_episode_id'], unique=False)
    op.create_index(op.f('ix_episode_link_ref_session_id'), 'episode_link', ['ref_session_id'], unique=False)
    op.create_index(op.f('ix_episode_link_ref_trajectory_id'), 'episode_link', ['ref_trajectory_id'], unique=False)
    # Plain ALTER TABLE (SQLite >= 3.35 adds and drops columns in place): a batch rebuild
    # of `step` would break the analyst views that read it.
    op.add_column('step', sa.Column('is_copied_context', sa.Boolean(), server_default=sa.false(), nullable=False, comment=_COPIED))
    op.execute(f"CREATE VIEW episode_tree AS {EPISODE_TREE}")
    if op.get_bind().dialect.name == "postgresql":
        for view, columns in view_comments(["episode_tree"]).items():
            for column, comment in columns.items():
                quoted = comment.replace("'", "''")
                op.execute(f"COMMENT ON COLUMN {view}.{column} IS '{quoted}'")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS episode_tree")
    op.drop_column('step', 'is_copied_context')
    op.drop_index(op.f('ix_episode_link_ref_trajectory_id'), table_name='episode_link')
    op.drop_index(op.f('ix_episode_link_ref_session_id'), table_name='episode_link')
    op.drop_index(op.f('ix_episode_link_child_episode_id'), table_name='episode_link')
    op.drop_table('episode_link')
    op.drop_index(op.f('ix_atif_document_trajectory_id'), table_name='atif_document')
    op.drop_index(op.f('ix_atif_document_source_name'), table_name='atif_document')
    op.drop_index(op.f('ix_atif_document_session_id'), table_name='atif_document')
    op.drop_index(op.f('ix_atif_document_embedded_in'), table_name='atif_document')
    op.drop_table('atif_document')
