"""run findings: each run's stored diagnosis summary

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 10:00:00

One row per run (``registry.db.models.RunFindings``), written after a registration or a
finish and recomputed lazily when its stamps (data version, dictionary, task baseline,
engine version) no longer match.
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_findings',
        sa.Column('run_id', sa.String(length=32), nullable=False),
        sa.Column('data_version', sa.Integer(), nullable=False),
        sa.Column('dictionary_stamp', sa.String(length=64), nullable=False),
        sa.Column('baseline_stamp', sa.String(length=64), nullable=False),
        sa.Column('engine_version', sa.Integer(), nullable=False),
        sa.Column('worst_severity', sa.String(length=20), nullable=True),
        sa.Column('n_info', sa.Integer(), nullable=False),
        sa.Column('n_warning', sa.Integer(), nullable=False),
        sa.Column('n_critical', sa.Integer(), nullable=False),
        sa.Column('last_step', sa.BigInteger(), nullable=True),
        sa.Column('summary', sa.JSON(), nullable=False),
        sa.Column('diagnosis', sa.JSON(), nullable=False),
        sa.Column('computed_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('run_id'),
    )


def downgrade() -> None:
    op.drop_table('run_findings')
