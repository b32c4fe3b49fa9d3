"""Alembic: empty -> head -> base -> head on both databases, with data present."""
from __future__ import annotations

from sqlalchemy import inspect

from registry import open_registry
from registry.db.migrate import HEAD_REVISION, current_revision, downgrade, head_revision, upgrade


def test_the_head_revision_opening_checks_against_is_the_scripts_head(tmp_path):
    """Opening a registry compares the stored revision with HEAD_REVISION instead of loading Alembic:
    it must name the newest script, or an old schema would be taken as current."""
    from registry.db.engine import make_engine

    assert HEAD_REVISION == head_revision(make_engine(f"sqlite:///{tmp_path / 'h.db'}"))


def test_upgrade_downgrade_walk_with_data(db_url: str):
    reg = open_registry(db_url)
    reg.register_arrays("kept", {"train/approx_kl": ([1, 2], [0.1, 0.2])}, framework="stable-baselines3")
    assert current_revision(reg.engine) == head_revision(reg.engine)
    downgrade(reg.engine, "base")
    assert current_revision(reg.engine) is None
    assert "runs" not in inspect(reg.engine).get_table_names()
    upgrade(reg.engine)
    tables = set(inspect(reg.engine).get_table_names())
    assert {"runs", "series", "series_chunks", "metric_definitions", "definition_versions"} <= tables
    reg.close()
    # Re-opening seeds the dictionary into the fresh schema again.
    again = open_registry(db_url)
    assert again.list_runs()[1] == 0
    assert len(again.definitions_by_name()) > 20
    again.close()


def test_every_migration_steps_up_and_down_with_data(db_url: str):
    """One revision at a time: data written at the first revision survives every upgrade,
    and data at head survives every downgrade until its own table goes."""
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from registry.db.engine import make_engine
    from registry.db.migrate import alembic_config

    engine = make_engine(db_url)
    revisions = [s.revision
                 for s in reversed(list(ScriptDirectory.from_config(alembic_config(engine)).walk_revisions()))]
    assert revisions[0] == "0001" and len(revisions) >= 4
    upgrade(engine, revisions[0])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, name, project, status, data_version, created_at, updated_at) "
                          "VALUES ('r0', 'from-0001', 'p', 'finished', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    for rev in revisions[1:]:
        upgrade(engine, rev)
        assert current_revision(engine) == rev
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM runs WHERE id = 'r0'")).scalar() == "from-0001"
    reg = open_registry(db_url)
    reg.register_arrays("at-head", {"train/approx_kl": ([1, 2], [0.1, 0.2])}, framework="stable-baselines3")
    reg.close()
    for rev in reversed(revisions[:-1]):
        downgrade(engine, rev)
        assert current_revision(engine) == rev
        with engine.connect() as conn:
            names = set(conn.execute(text("SELECT name FROM runs")).scalars())
            assert names == {"from-0001", "at-head"}
            assert conn.execute(text("SELECT count(*) FROM series_chunks")).scalar() == 1
    downgrade(engine, "base")
    assert current_revision(engine) is None
    engine.dispose()
