"""Shared fixtures: a real SQLite file per test, and a real PostgreSQL server when one is running.

PostgreSQL comes from ``RLREG_TEST_POSTGRES_URL`` (``.ci/run`` starts a server and sets it;
the default below matches it). Without a reachable server the PostgreSQL variants skip
locally but fail under CI, where a missing server is a broken setup, not a reason to skip.
"""
from __future__ import annotations

from registry import open_registry

import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SB3_RUNS = SHARED / "data" / "sb3_ppo"
DEFAULT_PG_URL = "postgresql+psycopg://rlreg:rlreg@127.0.0.1:5432/rlreg_test"


def postgres_url() -> str | None:
    url = os.environ.get("RLREG_TEST_POSTGRES_URL", DEFAULT_PG_URL)
    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
        return url
    except Exception as exc:  # noqa: BLE001 - any connection failure means "no server"
        if os.environ.get("CI"):
            raise RuntimeError(f"CI needs a PostgreSQL server at {url}: {exc}") from exc
        return None


_PG_SERVER_URL = postgres_url()


@pytest.fixture(scope="session")
def _pg_database() -> str | None:
    """A database of this test session's own, so parallel sessions on one server never collide."""
    if _PG_SERVER_URL is None:
        yield None
        return
    server = make_url(_PG_SERVER_URL)
    name = f"rlreg_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(_PG_SERVER_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield server.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def reset_postgres(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'registry.db.engine'}"


@pytest.fixture
def pg_url(_pg_database: str | None) -> str:
    if _pg_database is None:
        pytest.skip("no PostgreSQL server (set RLREG_TEST_POSTGRES_URL)")
    reset_postgres(_pg_database)
    return _pg_database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db.engine'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def registry(db_url: str):

    reg = open_registry(db_url)
    yield reg
    reg.close()


@pytest.fixture
def sb3_runs() -> Path:
    if not SB3_RUNS.is_dir():
        pytest.skip("shared SB3 runs not present")
    return SB3_RUNS


@pytest.fixture(scope="session")
def openapi():
    """The API's OpenAPI document, itself validated, ready to check requests and responses."""
    import yaml
    from openapi_core import OpenAPI
    from openapi_spec_validator import validate

    spec = yaml.safe_load((REPO / "registry" / "web" / "openapi.yaml").read_text())
    validate(spec)
    return OpenAPI.from_dict(spec)
