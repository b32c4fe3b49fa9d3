"""`rlreg runs` columns: the hyperparameters that vary and the headline metrics by default, any run
field, hyperparameter, score or metric summary with --columns, on a real SQLite registry."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli.main import cli
from test_web_support import fill_registry


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cols') / 'registry.db'}"
    reg = Registry(url)
    ids = fill_registry(reg)
    yield url, reg, ids
    reg.close()


def rlreg(url: str, *args: str):
    return CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)


def test_default_columns_show_varying_hyperparameters_and_headline_metrics(filled):
    url, reg, ids = filled
    out = rlreg(url, "runs", "--json")
    data = json.loads(out.output)
    assert data["columns"][:6] == ["id", "name", "algorithm", "task", "verdict", "tags"]
    assert "learning_rate" in data["columns"]  # differs between the runs
    assert "episode_return_mean" in data["columns"] and "kl_old_mean" in data["columns"]
    by_name = {row["name"]: row for row in data["cells"]}
    sb3 = reg.run_detail(ids["sb3-s0"])
    assert by_name["sb3-cartpole-s0"]["learning_rate"] == sb3["params"]["learning_rate"]
    kl_raw = reg.read_series(ids["sb3-s0"], "train/approx_kl").values
    assert by_name["sb3-cartpole-s0"]["kl_old_mean"] == pytest.approx(float(kl_raw[-1]))
    text = rlreg(url, "runs").output
    assert "learning_rate" in text and "episode_return_mean" in text


def test_columns_option_picks_fields_params_scores_and_metric_summaries(filled):
    url, reg, ids = filled
    out = rlreg(url, "runs", "--project", "cartpole", "--json",
                "--columns", "name,gamma,score.final_return,kl_old_mean:max,entropy:min")
    data = json.loads(out.output)
    assert data["columns"] == ["name", "gamma", "score.final_return", "kl_old_mean:max", "entropy:min"]
    row = {r["name"]: r for r in data["cells"]}["sb3-cartpole-s1"]
    kl = reg.read_series(ids["sb3-s1"], "train/approx_kl").values
    ent_loss = reg.read_series(ids["sb3-s1"], "train/entropy_loss").values
    assert row["score.final_return"] == 481.0 and row["gamma"] == 0.99
    assert row["kl_old_mean:max"] == pytest.approx(float(kl.max()))
    assert row["entropy:min"] == pytest.approx(float(-ent_loss.max()))  # SB3 logs minus the entropy


def test_bad_columns_are_errors_that_say_what_was_meant(filled):
    url, _, _ = filled
    bad = CliRunner().invoke(cli, ["--db", url, "runs", "--columns", "name,learnin_rate"])
    assert bad.exit_code != 0 and "learnin_rate" in bad.output and "did you mean learning_rate" in bad.output
    bad = CliRunner().invoke(cli, ["--db", url, "runs", "--columns", "kl_old_mean:median"])
    assert bad.exit_code != 0 and "last, min, max, mean, first" in bad.output


def _run_cli_in_a_fresh_interpreter(url: str, *args: str) -> dict:
    """``rlreg ARGS`` in a new Python process, and which heavy modules it loaded."""
    import subprocess
    import sys

    code = ("import sys, json, io, contextlib\n"
            "from registry.cli.main import cli\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            f"        cli.main({['--db', url, *args]!r}, standalone_mode=False)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(json.dumps({'output': out.getvalue(), 'orm': 'sqlalchemy.orm' in sys.modules,\n"
            "                  'numpy': 'numpy' in sys.modules, 'lark': 'lark' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_listing_a_current_registry_reads_rows_through_core_alone_and_lists_what_the_store_lists(filled):
    """`rlreg runs` on a database at the current schema loads neither the ORM, NumPy nor the filter
    parser (what made it slow to start), and lists exactly what the store's list_runs lists."""
    url, reg, _ = filled
    fast = _run_cli_in_a_fresh_interpreter(url, "runs", "--json")
    assert not fast["orm"] and not fast["numpy"] and not fast["lark"]
    rows, total = reg.list_runs()
    assert json.loads(fast["output"])["runs"] == json.loads(json.dumps(rows)) and total == len(rows)
    # A filter loads the parser, still without the ORM.
    filtered = _run_cli_in_a_fresh_interpreter(url, "runs", "--where", "learning_rate>1e-4", "--json")
    assert filtered["lark"] and not filtered["orm"]
    expected = reg.list_runs(where="learning_rate>1e-4")[0]
    assert expected and json.loads(filtered["output"])["runs"] == json.loads(json.dumps(expected))


def test_listing_a_registry_that_needs_an_upgrade_opens_it_and_upgrades_it(tmp_path):
    """A database behind the current schema is not read through Core: the store opens it, which upgrades it."""
    from registry.db import migrate
    from registry.db.engine import make_engine

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine, "0007")
    engine.dispose()
    result = _run_cli_in_a_fresh_interpreter(url, "runs", "--json")
    assert result["orm"] and json.loads(result["output"])["total"] == 0
    engine = make_engine(url)
    assert migrate.current_revision(engine) == migrate.HEAD_REVISION
    engine.dispose()
    # A path where there is no database yet gets one, as before.
    fresh = tmp_path / "new.db"
    assert json.loads(_run_cli_in_a_fresh_interpreter(f"sqlite:///{fresh}", "runs", "--json")["output"])["total"] == 0
    assert fresh.is_file()


def test_the_core_listing_reads_postgresql_as_well(registry: Registry):
    """The same Core path on both backends (this runs on SQLite and on the PostgreSQL server)."""
    from pathlib import Path

    sweep = Path(__file__).resolve().parent / "data" / "real" / "sb3_sweep"
    for name in ("cartpole_default_s1", "acrobot_default_s1"):
        registry.register(sweep / name, name=name, tags=["healthy"])
    result = _run_cli_in_a_fresh_interpreter(registry.url, "runs", "--tag", "healthy", "--json")
    assert not result["orm"] and not result["numpy"]
    data = json.loads(result["output"])
    rows, total = registry.list_runs(tag="healthy")
    assert data["total"] == total == 2 and data["runs"] == json.loads(json.dumps(rows))
    assert {"episode_return_mean", "kl_old_mean"} <= set(data["columns"])
