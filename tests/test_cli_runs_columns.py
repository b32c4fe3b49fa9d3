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
