"""Shared fixtures: a real SQLite file per test, and a real PostgreSQL server when one is running.

PostgreSQL comes from ``RLREG_TEST_POSTGRES_URL`` (``.ci/run`` starts a server and sets it;
the default below matches it). Without a reachable server the PostgreSQL variants skip
locally but fail under CI, where a missing server is a broken setup, not a reason to skip.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

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


_PG_URL = postgres_url()


def reset_postgres(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture
def pg_url() -> str:
    if _PG_URL is None:
        pytest.skip("no PostgreSQL server (set RLREG_TEST_POSTGRES_URL)")
    reset_postgres(_PG_URL)
    return _PG_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def registry(db_url: str):
    from registry import Registry

    reg = Registry(db_url)
    yield reg
    reg.close()


@pytest.fixture
def sb3_runs() -> Path:
    if not SB3_RUNS.is_dir():
        pytest.skip("shared SB3 runs not present")
    return SB3_RUNS
