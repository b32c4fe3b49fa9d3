"""rlreg export / import: a whole registry moves between SQLite and PostgreSQL bit for bit."""
from __future__ import annotations

import gzip
import json
import math
import struct
from pathlib import Path

import pytest

from registry import Registry
from registry.dictionary import update_definition
from registry.errors import InputError, RegistryError
from registry.health import build_task_baseline
from registry.transfer import _decode, export_registry, import_registry


def _fill(reg: Registry, sb3_runs: Path) -> None:
    for name in ("cartpole_healthy_s0", "cartpole_lr_too_high_5e-2"):
        reg.register(sb3_runs / name, project="cartpole", tags=["sb3"])
    reg.set_outcome("cartpole_healthy_s0", verdict="success", scores={"final": 495.2}, notes="ok <b>",
                    checkpoints=[(100352, "ckpt/final")])
    weird = [0.1, math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
    reg.register_arrays("weird", {"loss": (list(range(len(weird))), weird)}, params={"lr": 1e-6, "nested": {"x": True}})
    with reg.transaction() as s:
        update_definition(s, "kl_old_mean", {"smoothing_window": 7}, author="alice", note="finer")
    build_task_baseline(reg, "CartPole-v1", ["cartpole_healthy_s0"], allow_weak=True)


def _canonical_rows(path: Path) -> dict[str, list[str]]:
    """Every row as a canonical string: floats by their bits, datetimes in UTC."""
    def canon(v):
        if isinstance(v, float):
            return "f" + struct.pack("<d", v).hex()
        if isinstance(v, dict):
            return {k: canon(x) for k, x in sorted(v.items())}
        if isinstance(v, list):
            return [canon(x) for x in v]
        if isinstance(v, bytes):
            return "b" + v.hex()
        if hasattr(v, "isoformat"):
            return "t" + v.isoformat()
        return v

    tables: dict[str, list[str]] = {}
    with gzip.open(path, "rt") as f:
        next(f)
        for line in f:
            item = json.loads(line)
            row = {k: _decode(v) for k, v in item["r"].items()}
            tables.setdefault(item["t"], []).append(json.dumps(canon(row), sort_keys=True))
    return {t: sorted(rows) for t, rows in tables.items()}


def test_round_trip_sqlite_postgres_sqlite(sqlite_url: str, pg_url: str, sb3_runs: Path, tmp_path: Path):
    source = Registry(sqlite_url)
    _fill(source, sb3_runs)
    first = tmp_path / "first.jsonl.gz"
    counts = export_registry(source, first)
    assert counts["runs"] == 3 and counts["series_chunks"] > 0 and counts["health_baselines"] == 1

    middle = Registry(pg_url)
    import_registry(middle, first)
    second = tmp_path / "second.jsonl.gz"
    export_registry(middle, second)
    back = Registry(f"sqlite:///{tmp_path / 'back.db'}")
    import_registry(back, second)
    third = tmp_path / "third.jsonl.gz"
    export_registry(back, third)

    rows = _canonical_rows(first)
    assert rows == _canonical_rows(second) == _canonical_rows(third)
    # And the data is usable, not just present: NaN kept, history kept, sequences moved on.
    values = middle.read_series("weird", "loss").values
    assert math.isnan(values[1]) and values[2] == math.inf and struct.pack("<d", values[4]) == struct.pack("<d", -0.0)
    with middle.transaction() as s:
        update_definition(s, "kl_old_mean", {"smoothing_window": 9}, author="bob")
    middle.register_arrays("after-import", {"loss": ([1], [1.0])})
    for reg in (source, middle, back):
        reg.close()


def test_import_refuses_a_registry_in_use(sqlite_url: str, tmp_path: Path):
    reg = Registry(sqlite_url)
    reg.register_arrays("r", {"x": ([1], [1.0])})
    path = tmp_path / "e.jsonl.gz"
    export_registry(reg, path)
    with pytest.raises(RegistryError, match="already holds runs"):
        import_registry(reg, path)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    other = Registry(f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(InputError, match="bad.jsonl.gz"):
        import_registry(other, bad)
    assert other.list_runs()[1] == 0


def test_cli_export_then_import(sqlite_url: str, tmp_path: Path):
    from click.testing import CliRunner

    from registry.cli import cli

    Registry(sqlite_url).register_arrays("r", {"x": ([1, 2], [1.0, math.nan])})
    runner = CliRunner()
    out = runner.invoke(cli, ["--db", sqlite_url, "export", str(tmp_path / "e.gz")])
    assert out.exit_code == 0 and "1 runs" in out.output
    target = f"sqlite:///{tmp_path / 't.db'}"
    out = runner.invoke(cli, ["--db", target, "import", str(tmp_path / "e.gz")])
    assert out.exit_code == 0, out.output
    assert math.isnan(Registry(target).read_series("r", "x").values[1])
    again = runner.invoke(cli, ["--db", target, "import", str(tmp_path / "e.gz")])
    assert again.exit_code == 1 and "already holds runs" in again.output
