"""grpo rollouts: each GRPO rollout's group, policy version, advantage and fate

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-04 15:33:21.270766

`grpo_rollout`: one row per episode that was a rollout of agentic GRPO (the episode
itself is an ordinary episode of the training run's collection run): its group in the
generation batch, the policy version (optimiser step) that sampled it, the reward and
advantage the loss used, the group's fate (`trained`, `infrastructure`,
`zero_variance`) and its sampled / observation token counts. Comments are stored by
PostgreSQL only.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = '0015'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('grpo_rollout',
    sa.Column('episode_id', sa.Uuid(), nullable=False, comment='The episode the rollout is.'),
    sa.Column('training_run_id', sa.Uuid(), nullable=True, comment='Training run whose trainer asked for the rollout; NULL when none was registered.'),
    sa.Column('policy_version', sa.Integer(), nullable=False, comment='Optimiser steps the sampling policy had taken (0: the starting weights).'),
    sa.Column('group_index', sa.Integer(), nullable=False, comment="Position of the rollout's group in its generation batch (0-based)."),
    sa.Column('task_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment='Task every rollout of the group worked on.'),
    sa.Column('group_fate', sqlmodel.sql.sqltypes.AutoString(), nullable=False, comment='`trained`, or why the group was dropped before the optimiser step: `infrastructure` (a rollout ended env_error, storage_error or endpoint_error) or `zero_variance` (every rollout got the same reward).'),
    sa.Column('reward', sa.Float(), nullable=True, comment="The reward GRPO used: the episode's total_reward; NULL for an infrastructure outcome."),
    sa.Column('advantage', sa.Float(), nullable=True, comment='Group-normalised advantage the loss used; NULL when the group was dropped.'),
    sa.Column('sampled_tokens', sa.Integer(), nullable=True, comment='Completion tokens the model sampled (in the loss when the group is trained); NULL when the episode recorded no token ids.'),
    sa.Column('observation_tokens', sa.Integer(), nullable=True, comment='Tokens the environment wrote between turns (never in the loss); NULL when the episode recorded no token ids.'),
    sa.ForeignKeyConstraint(['episode_id'], ['episode.id'], name=op.f('fk_grpo_rollout_episode_id_episode'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['training_run_id'], ['training_run.id'], name=op.f('fk_grpo_rollout_training_run_id_training_run'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('episode_id', name=op.f('pk_grpo_rollout'))
    )
    with op.batch_alter_table('grpo_rollout', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_grpo_rollout_group_fate'), ['group_fate'], unique=False)
        batch_op.create_index(batch_op.f('ix_grpo_rollout_policy_version'), ['policy_version'], unique=False)
        batch_op.create_index(batch_op.f('ix_grpo_rollout_training_run_id'), ['training_run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('grpo_rollout', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_grpo_rollout_training_run_id'))
        batch_op.drop_index(batch_op.f('ix_grpo_rollout_policy_version'))
        batch_op.drop_index(batch_op.f('ix_grpo_rollout_group_fate'))

    op.drop_table('grpo_rollout')
