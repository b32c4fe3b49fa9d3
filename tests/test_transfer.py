"""rlreg export / import: a whole registry moves between SQLite and PostgreSQL bit for bit."""
from __future__ import annotations

import gzip
import json
import math
import struct
from pathlib import Path

import pytest

from registry import Registry, open_registry
from registry.dictionary.definitions import update_definition
from registry.core.errors import InputError, RegistryError
from registry.analysis.baselines import build_task_baseline
from registry.store.transfer import _decode, export_registry, import_registry


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
            if "manifest" in item:
                continue
            row = {k: _decode(v) for k, v in item["r"].items()}
            tables.setdefault(item["t"], []).append(json.dumps(canon(row), sort_keys=True))
    return {t: sorted(rows) for t, rows in tables.items()}


def test_round_trip_sqlite_postgres_sqlite(sqlite_url: str, pg_url: str, sb3_runs: Path, tmp_path: Path):
    source = open_registry(sqlite_url)
    _fill(source, sb3_runs)
    first = tmp_path / "first.jsonl.gz"
    counts = export_registry(source, first)
    assert counts["runs"] == 3 and counts["series_chunks"] > 0 and counts["health_baselines"] == 1

    middle = open_registry(pg_url)
    import_registry(middle, first)
    second = tmp_path / "second.jsonl.gz"
    export_registry(middle, second)
    back = open_registry(f"sqlite:///{tmp_path / 'back.db'}")
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
    reg = open_registry(sqlite_url)
    reg.register_arrays("r", {"x": ([1], [1.0])})
    path = tmp_path / "e.jsonl.gz"
    export_registry(reg, path)
    with pytest.raises(RegistryError, match="already holds runs"):
        import_registry(reg, path)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    other = open_registry(f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(InputError, match="bad.jsonl.gz"):
        import_registry(other, bad)
    assert other.list_runs()[1] == 0


def test_cli_export_then_import(sqlite_url: str, tmp_path: Path):
    from click.testing import CliRunner

    from registry.cli.main import cli

    open_registry(sqlite_url).register_arrays("r", {"x": ([1, 2], [1.0, math.nan])})
    runner = CliRunner()
    out = runner.invoke(cli, ["--db", sqlite_url, "export", str(tmp_path / "e.gz")])
    assert out.exit_code == 0 and "1 runs" in out.output
    target = f"sqlite:///{tmp_path / 't.db'}"
    out = runner.invoke(cli, ["--db", target, "import", str(tmp_path / "e.gz")])
    assert out.exit_code == 0, out.output
    assert math.isnan(open_registry(target).read_series("r", "x").values[1])
    again = runner.invoke(cli, ["--db", target, "import", str(tmp_path / "e.gz")])
    assert again.exit_code == 1 and "already holds runs" in again.output


# --- the manifest, overwriting, credentials --------------------------------------------------------


def _lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.readlines()


def _write(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    return path


def _exported(tmp_path: Path) -> tuple[Registry, Path]:
    from registry.store.auth import create_token, create_user

    reg = open_registry(f"sqlite:///{tmp_path / 'src.db'}")
    for i in range(3):
        reg.register_arrays(f"run{i}", {"loss": ([1, 2, 3], [1.0, 0.5, 0.25]), "kl": ([1, 2], [0.1, 0.2])},
                            tags=["a", f"t{i}"], params={"lr": 10.0 ** -i})
    create_user(reg, "alice", "alice-password")
    create_token(reg, "alice", "ci", scope="read")
    path = tmp_path / "full.jsonl.gz"
    export_registry(reg, path)
    return reg, path


def _assert_untouched(target: Registry) -> None:
    assert target.list_runs()[1] == 0
    assert len(target.definitions_by_name()) > 20  # the seeded dictionary is still there


@pytest.mark.parametrize("cut", ["manifest", "half", "table"])
def test_a_truncated_export_is_refused_naming_what_is_missing(tmp_path: Path, cut: str):
    src, path = _exported(tmp_path)
    lines = _lines(path)
    assert json.loads(lines[-1]).keys() == {"manifest"}
    tables = [json.loads(line)["t"] for line in lines[1:-1]]
    if cut == "manifest":
        kept = lines[:-1]  # every row, only the manifest lost: still refused
    elif cut == "half":
        kept = lines[: len(lines) // 2]
    else:  # the whole series table's rows gone, manifest kept
        kept = [line for line in lines if '"t": "series"' not in line]
        assert "series" in tables
    broken = _write(tmp_path / f"cut-{cut}.jsonl.gz", kept)
    target = open_registry(f"sqlite:///{tmp_path / f'target-{cut}.db'}")
    with pytest.raises(InputError) as info:
        import_registry(target, broken)
    message = str(info.value)
    assert broken.name in message and "nothing was imported" in message
    if cut == "table":
        assert "series: 0 rows, the manifest says 6" in message
    else:
        assert "without its manifest" in message and f"ends at line {len(kept)}" in message
    _assert_untouched(target)
    # A gzip stream cut mid-block is refused as well.
    raw = path.read_bytes()
    torn = tmp_path / "torn.jsonl.gz"
    torn.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(InputError, match="cut short|without its manifest"):
        import_registry(target, torn)
    _assert_untouched(target)
    src.close()
    target.close()


def test_an_altered_export_is_refused(tmp_path: Path):
    src, path = _exported(tmp_path)
    lines = _lines(path)
    index = next(i for i, line in enumerate(lines) if '"t": "runs"' in line)
    lines[index] = lines[index].replace('"run1"', '"runX"').replace('"run0"', '"runX"').replace('"run2"', '"runX"')
    altered = _write(tmp_path / "altered.jsonl.gz", lines)
    target = open_registry(f"sqlite:///{tmp_path / 'target.db'}")
    with pytest.raises(InputError, match="runs: the rows differ from the exported ones"):
        import_registry(target, altered)
    _assert_untouched(target)
    extra = _write(tmp_path / "extra.jsonl.gz", [*_lines(path), _lines(path)[1]])
    with pytest.raises(InputError, match="after the manifest"):
        import_registry(target, extra)
    _assert_untouched(target)
    assert import_registry(target, path)["runs"] == 3
    src.close()
    target.close()


def test_cli_export_refuses_to_overwrite_without_force_and_can_leave_credentials_out(tmp_path: Path):
    from click.testing import CliRunner

    from registry.store.auth import list_tokens
    from registry.cli.main import cli

    src, _ = _exported(tmp_path)
    db = ["--db", str(src.engine.url)]
    runner = CliRunner()
    target = tmp_path / "e.jsonl.gz"
    target.write_bytes(b"precious")
    refused = runner.invoke(cli, [*db, "export", str(target)])
    assert refused.exit_code == 1 and "exists already" in refused.output and "--force" in refused.output
    assert target.read_bytes() == b"precious"
    full = runner.invoke(cli, [*db, "export", str(target), "--force"])
    assert full.exit_code == 0 and "password hashes" in full.output
    assert any('"t": "users"' in line for line in _lines(target))
    bare = tmp_path / "bare.jsonl.gz"
    out = runner.invoke(cli, [*db, "export", str(bare), "--without-credentials"])
    assert out.exit_code == 0 and "without users and API tokens" in out.output
    text = "".join(_lines(bare))
    assert '"t": "users"' not in text and '"t": "api_tokens"' not in text and "password_hash" not in text
    missing_dir = runner.invoke(cli, [*db, "export", str(tmp_path / "no" / "such" / "e.gz")])
    assert missing_dir.exit_code == 1 and "does not exist" in missing_dir.output
    assert "Traceback" not in missing_dir.output
    assert not list(tmp_path.glob(".*.part"))
    # Without credentials the target keeps its own users and gets the runs.
    dest_url = f"sqlite:///{tmp_path / 'dest.db'}"
    from registry.store.auth import create_token, create_user

    dest = open_registry(dest_url)
    create_user(dest, "admin", "admin-password")
    create_token(dest, "admin", "ops", scope="admin")
    assert runner.invoke(cli, ["--db", dest_url, "import", str(bare)]).exit_code == 0
    assert dest.list_runs()[1] == 3 and [t["user"] for t in list_tokens(dest)] == ["admin"]
    # With credentials the export's users come along (hashes only; the token secret never left).
    full_dest = open_registry(f"sqlite:///{tmp_path / 'full-dest.db'}")
    import_registry(full_dest, target)
    assert [(t["user"], t["scope"]) for t in list_tokens(full_dest)] == [("alice", "read")]
    for reg in (src, dest, full_dest):
        reg.close()
