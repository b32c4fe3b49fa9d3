"""binding provenance: where each series' binding and semantic fields came from

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 15:00:00

``series.provenance`` records how a key was bound (the run's framework alias, a guess from
another framework, a canonical name, the user's choice) and, per semantic field, its origin
(alias default, the run's config, a logger prefix, a user override). ``series.labels`` keeps the
parts of the key a templated alias captured. ``runs.binding_info`` records how the run's framework
and algorithm were known and the warnings its config raised. Rows registered before this
revision get empty objects: their provenance is unknown, not "alias".
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy): on SQLite a batch rebuild of ``series`` would drop the
    # old table and cascade-delete every chunk. SQLite >= 3.35 drops columns in place.
    op.add_column('series', sa.Column('provenance', sa.JSON(), nullable=False, server_default='{}'))
    op.add_column('series', sa.Column('labels', sa.JSON(), nullable=False, server_default='{}'))
    op.add_column('runs', sa.Column('binding_info', sa.JSON(), nullable=False, server_default='{}'))


def downgrade() -> None:
    op.drop_column('runs', 'binding_info')
    op.drop_column('series', 'labels')
    op.drop_column('series', 'provenance')
