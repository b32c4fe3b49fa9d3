"""run history: one row per change to a run

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00

``run_events`` (``registry.db.models.RunEvent``): who changed which of a run's fields (verdict,
scores, tags, notes, checkpoints, status), when, from what to what; registrations through the
web UI and deletions are recorded too. No foreign key to ``runs``: a deletion's record stays.
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_events',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('run_id', sa.String(length=32), nullable=False),
        sa.Column('run_name', sa.String(length=200), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('author', sa.String(length=100), nullable=True),
        sa.Column('action', sa.String(length=30), nullable=False),
        sa.Column('changes', sa.JSON(), nullable=False),
        sa.Column('note', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('run_events', schema=None) as batch_op:
        batch_op.create_index('ix_run_events_run_at', ['run_id', 'at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('run_events', schema=None) as batch_op:
        batch_op.drop_index('ix_run_events_run_at')
    op.drop_table('run_events')
