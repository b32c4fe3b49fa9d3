"""Engine and session creation for SQLite (embedded default) and PostgreSQL (team server)."""
from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_SQLITE_FILE = "rlregistry.db"
READ_ONLY_OPTION = "rlregistry_read_only"


def default_database_url() -> str:
    """``RLREG_DATABASE_URL`` if set, else a SQLite file in the current directory."""
    return os.environ.get("RLREG_DATABASE_URL") or f"sqlite:///{Path.cwd() / DEFAULT_SQLITE_FILE}"


def normalize_url(url: str) -> str:
    """Accept bare paths and ``postgresql://`` URLs; pin PostgreSQL to the psycopg 3 driver."""
    if "://" not in url:
        return f"sqlite:///{Path(url).resolve()}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> Engine:
    """An engine tuned for its backend: WAL and a busy timeout so several writers can share a SQLite file."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 60})
        _configure_sqlite(engine)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001 - DBAPI hook
        # pysqlite's own transaction handling defers BEGIN and breaks SAVEPOINTs;
        # let SQLAlchemy emit BEGIN itself (documented recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        # Writers take the lock up front (IMMEDIATE), so concurrent writers wait on the busy
        # timeout instead of failing with "database is locked" at commit; readers begin a
        # deferred transaction, which WAL lets run beside a writer.
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def make_session_factory(engine: Engine, read_only: bool = False) -> sessionmaker[Session]:
    bind = engine.execution_options(**{READ_ONLY_OPTION: True}) if read_only else engine
    return sessionmaker(bind, expire_on_commit=False)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"
