"""token scopes and server-side web sessions

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 15:00:00

``api_tokens.scope`` (read, write or admin): tokens made before scopes existed could do
everything, so they become ``admin``; new tokens are ``write`` unless asked otherwise.
``user_sessions`` holds one row per web login (the SHA-256 of the random id in its cookie), so
logout, a password change or disabling a user ends sessions in every server process.
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scope', sa.String(length=10), nullable=False, server_default='admin'))
    op.create_table('user_sessions',
    sa.Column('id_hash', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id_hash')
    )
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.create_index('ix_user_sessions_user', ['user_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.drop_index('ix_user_sessions_user')
    op.drop_table('user_sessions')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('scope')
