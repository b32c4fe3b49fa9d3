"""Alembic: empty -> head -> base -> head on both databases, with data present."""
from __future__ import annotations

from sqlalchemy import inspect

from registry import Registry
from registry.migrate import current_revision, downgrade, head_revision, upgrade


def test_upgrade_downgrade_walk_with_data(db_url: str):
    reg = Registry(db_url)
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
    again = Registry(db_url)
    assert again.list_runs()[1] == 0
    assert len(again.definitions_by_name()) > 20
    again.close()
