"""Schema creation and upgrades through Alembic (``migrations/`` at the project root).

Alembic is imported only when the schema must change: opening an up-to-date registry checks
the stored revision against :data:`HEAD_REVISION` with one query, so read-only commands such
as ``rlreg runs`` do not pay for loading Alembic and its migration scripts.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"  # a link to the top-level migrations/
#: The newest migration's revision (``tests/test_migrations.py`` checks it against the scripts).
HEAD_REVISION = "0008"


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["engine"] = engine
    return cfg


def current_revision(engine: Engine) -> str | None:
    """The revision the database's schema is at (None for an empty database)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def head_revision(engine: Engine) -> str | None:
    """The newest revision among the migration scripts, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision``; one query when it is already at the head."""
    if revision == "head" and current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)
