"""Database: the engine, the ORM models, Alembic migrations and the SQLite/PostgreSQL differences.

Imports only :mod:`registry.core`. Everything above reaches tables through :mod:`registry.store`,
except the analysis layer's own tables, which it reads and writes through these models.
"""
