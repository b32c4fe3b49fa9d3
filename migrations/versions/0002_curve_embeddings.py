"""curve embeddings for similar-run search

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 15:00:00

On PostgreSQL where pgvector is usable by the migrating role (already created in the
database, or installable and the role may create it: pgvector is not a trusted extension,
so that takes a superuser), also creates the extension and one ``vector(32)`` column per
stored level with an HNSW index (m=16, ef_construction=64). Otherwise the table is the same
as on SQLite and similarity search runs its candidate stage in NumPy; an application role
that is not a superuser must not fail here just because the server has pgvector installed.
The DDL is frozen here; a database that gains pgvector later gets the columns from
``registry.analysis.similarity.index.ensure_vector_columns`` (called by ``rebuild_embeddings``).
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

VECTOR_COLUMNS = ("v010", "v025", "v050", "v100")

# frozen copy of registry.analysis.similarity.index.VECTOR_USABLE_SQL as of this revision
VECTOR_USABLE_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')
    OR EXISTS (SELECT 1 FROM pg_available_extension_versions v
               WHERE v.name = 'vector'
                 AND ((SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
                      OR (v.trusted AND has_database_privilege(current_database(), 'CREATE'))))
"""


def upgrade() -> None:
    op.create_table(
        'curve_embeddings',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('run_id', sa.String(length=32), nullable=False),
        sa.Column('version', sa.String(length=100), nullable=False),
        sa.Column('metric', sa.String(length=100), nullable=False),
        sa.Column('series_id', sa.Integer(), nullable=True),
        sa.Column('semantics', sa.JSON(), nullable=False),
        sa.Column('semantics_key', sa.String(length=200), nullable=False),
        sa.Column('point_count', sa.Integer(), nullable=False),
        sa.Column('complete', sa.Boolean(), nullable=False),
        sa.Column('first_step', sa.BigInteger(), nullable=False),
        sa.Column('last_step', sa.BigInteger(), nullable=False),
        sa.Column('flat', sa.Boolean(), nullable=False),
        sa.Column('mean', sa.Float(), nullable=False),
        sa.Column('std', sa.Float(), nullable=False),
        sa.Column('final', sa.Float(), nullable=False),
        sa.Column('max', sa.Float(), nullable=False),
        sa.Column('argmax', sa.Float(), nullable=False),
        sa.Column('level_stats', sa.LargeBinary(), nullable=False),
        sa.Column('paa', sa.LargeBinary(), nullable=False),
        sa.Column('grid', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['series_id'], ['series.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('run_id', 'metric', 'version', name='uq_curve_embeddings_run_metric_version'),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table('curve_embeddings', schema=None) as batch_op:
        batch_op.create_index('ix_curve_embeddings_version_id', ['version', 'id'], unique=False)
        batch_op.create_index('ix_curve_embeddings_version_metric', ['version', 'metric', 'semantics_key'],
                              unique=False)

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        if bind.execute(sa.text(VECTOR_USABLE_SQL)).scalar():
            op.execute("CREATE EXTENSION IF NOT EXISTS vector")
            for col in VECTOR_COLUMNS:
                op.execute(f"ALTER TABLE curve_embeddings ADD COLUMN {col} vector(32)")
                op.execute(f"CREATE INDEX ix_curve_embeddings_{col}_hnsw ON curve_embeddings "
                           f"USING hnsw ({col} vector_l2_ops) WITH (m = 16, ef_construction = 64)")


def downgrade() -> None:
    with op.batch_alter_table('curve_embeddings', schema=None) as batch_op:
        batch_op.drop_index('ix_curve_embeddings_version_metric')
        batch_op.drop_index('ix_curve_embeddings_version_id')
    op.drop_table('curve_embeddings')
