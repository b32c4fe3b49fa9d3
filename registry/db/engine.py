"""Engine and session creation for SQLite (embedded default) and PostgreSQL (team server)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from config import database_url
from registry.db.dialect import READ_ONLY_OPTION, configure_sqlite

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker


def default_database_url() -> str:
    """``RLREG_DATABASE_URL`` if set, else a SQLite file in the current directory (see ``config.py``)."""
    return database_url()


def normalize_url(url: str) -> str:
    """Accept bare paths and ``postgresql://`` URLs; pin PostgreSQL to the psycopg 3 driver."""
    if "://" not in url:
        return f"sqlite:///{Path(url).resolve()}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def redact_url(url: str) -> str:
    """A database URL as it may be shown and stored: without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def make_engine(url: str) -> Engine:
    """An engine tuned for its backend: WAL and a busy timeout so several writers can share a SQLite file."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 60})
        configure_sqlite(engine)
        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine, read_only: bool = False) -> sessionmaker[Session]:
    from sqlalchemy.orm import sessionmaker  # here: a Core-only reader never loads the ORM

    bind = engine.execution_options(**{READ_ONLY_OPTION: True}) if read_only else engine
    return sessionmaker(bind, expire_on_commit=False)
