"""embedding row counts kept by triggers (SQLite)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 13:00:00

The similarity cache checks on every query whether ``curve_embeddings`` changed, by its
``(max(id), count)`` per embedding version. On SQLite ``count(*)`` walks the whole version
index (3.4 ms at 10k runs, ~50 ms at 100k, half of a query's time there), so on SQLite a
table ``embedding_row_counts`` holds the count per version, kept exact by row triggers on
insert, delete and version change, which covers every path that removes rows (foreign-key
cascades from a deleted run or series included). Not on PostgreSQL: there concurrent
registrations would queue on the one counter row per version, and the server counts with an
index-only scan. The table is not mapped (``registry.analysis.similarity.index`` reads it with SQL), so
an export neither carries nor overwrites it.
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

TRIGGERS = {
    "curve_embeddings_count_insert": """
        CREATE TRIGGER curve_embeddings_count_insert AFTER INSERT ON curve_embeddings BEGIN
            INSERT INTO embedding_row_counts (version, n_rows) VALUES (NEW.version, 1)
                ON CONFLICT (version) DO UPDATE SET n_rows = n_rows + 1;
        END""",
    "curve_embeddings_count_delete": """
        CREATE TRIGGER curve_embeddings_count_delete AFTER DELETE ON curve_embeddings BEGIN
            UPDATE embedding_row_counts SET n_rows = n_rows - 1 WHERE version = OLD.version;
        END""",
    "curve_embeddings_count_version": """
        CREATE TRIGGER curve_embeddings_count_version AFTER UPDATE OF version ON curve_embeddings
        WHEN NEW.version IS NOT OLD.version BEGIN
            UPDATE embedding_row_counts SET n_rows = n_rows - 1 WHERE version = OLD.version;
            INSERT INTO embedding_row_counts (version, n_rows) VALUES (NEW.version, 1)
                ON CONFLICT (version) DO UPDATE SET n_rows = n_rows + 1;
        END""",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.create_table(
        'embedding_row_counts',
        sa.Column('version', sa.String(length=100), nullable=False),
        sa.Column('n_rows', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('version'),
    )
    op.execute("INSERT INTO embedding_row_counts (version, n_rows) "
               "SELECT version, count(*) FROM curve_embeddings GROUP BY version")
    for sql in TRIGGERS.values():
        op.execute(sql)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table('embedding_row_counts')
