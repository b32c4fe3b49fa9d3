"""Every difference between SQLite (the embedded default) and PostgreSQL (the team server) in one place.

The rest of the package asks these functions instead of testing ``dialect.name`` itself:
how a connection is set up, how long a quick write may wait for a lock, how a long list of
ids is matched, and how serial sequences follow imported ids.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from sqlalchemy import BigInteger, ColumnElement, Connection, Engine, any_, bindparam, event, text

if TYPE_CHECKING:  # the ORM and the PostgreSQL dialect load only where used: `rlreg runs` reads with Core
    from sqlalchemy.orm import Session

# Execution option: a transaction that only reads (SQLite: deferred BEGIN, no write lock).
READ_ONLY_OPTION = "rlregistry_read_only"
# SQLite's limit on bound parameters is 999 in old builds: an IN list stays under it.
SQLITE_IN_CHUNK = 900
SQLITE_BUSY_MS = 60000


def engine_of(bind: Session | Connection | Engine) -> Engine:
    """The engine behind a session, a connection or an engine."""
    if isinstance(bind, Engine):
        return bind
    if not isinstance(bind, Connection):  # a Session
        bind = bind.get_bind()
    return bind if isinstance(bind, Engine) else bind.engine


def is_sqlite(bind: Session | Connection | Engine) -> bool:
    return engine_of(bind).dialect.name == "sqlite"


def is_postgresql(bind: Session | Connection | Engine) -> bool:
    return engine_of(bind).dialect.name == "postgresql"


def configure_sqlite(engine: Engine) -> None:
    """WAL, a busy timeout and immediate write transactions, so several writers can share one file."""
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001 - DBAPI hook
        # pysqlite's own transaction handling defers BEGIN and breaks SAVEPOINTs;
        # let SQLAlchemy emit BEGIN itself (documented recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        # Writers take the lock up front (IMMEDIATE), so concurrent writers wait on the busy
        # timeout instead of failing with "database is locked" at commit; readers begin a
        # deferred transaction, which WAL lets run beside a writer.
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@contextlib.contextmanager
def quick_lock_wait(conn: Connection, milliseconds: int) -> Iterator[None]:
    """Let the next write on ``conn`` wait at most ``milliseconds`` for another writer's lock.

    SQLite: a deferred BEGIN and a short busy timeout, restored afterwards; PostgreSQL: a
    ``lock_timeout`` local to the transaction.
    """
    if is_sqlite(conn):
        conn.execution_options(**{READ_ONLY_OPTION: True})
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(milliseconds)}")
        try:
            yield
        finally:
            conn.rollback()
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            conn.rollback()
    else:
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(milliseconds)}ms'")
        yield


def id_chunks(bind: Session | Connection | Engine, column: Any, ids: Sequence[int]) -> Iterator[ColumnElement]:
    """Conditions matching ``column`` against ``ids``: PostgreSQL takes them as one array (one bind,
    one plan for any count); SQLite's IN lists stay under its bound-parameter limit."""
    ids = [int(i) for i in ids]
    if is_postgresql(bind):
        from sqlalchemy.dialects.postgresql import ARRAY

        yield column == any_(bindparam("ids", ids, type_=ARRAY(BigInteger)))
        return
    for start in range(0, len(ids), SQLITE_IN_CHUNK):
        yield column.in_(ids[start:start + SQLITE_IN_CHUNK])


def reset_sequences(session: Session, tables: Iterable[Any]) -> None:
    """After rows were inserted with their ids (an import), move PostgreSQL's serial sequences past
    them; SQLite's rowids need nothing."""
    if not is_postgresql(session):
        return
    for table in tables:
        for column in table.primary_key.columns:
            if column.autoincrement is True or (column.autoincrement == "auto" and column.type.python_type is int
                                                and len(table.primary_key.columns) == 1):
                session.execute(text(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                    f"COALESCE((SELECT MAX({column.name}) FROM {table.name}), 0) + 1, false)"
                ))
