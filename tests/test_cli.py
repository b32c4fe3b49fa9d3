"""The rlreg command line end to end, on a real SQLite file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from registry.cli.main import cli

DATA = Path(__file__).parent / "data"


@pytest.fixture
def rlreg(sqlite_url: str):
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, ["--db", sqlite_url, *args], catch_exceptions=False)
        assert result.exit_code == code, result.output + (result.stderr if result.stderr_bytes else "")
        return result.output

    return run


def test_register_list_show_outcome(rlreg, sb3_runs: Path):
    out = rlreg("register", str(sb3_runs / "cartpole_healthy_s0"), "--project", "cartpole", "--algorithm", "PPO",
                "--tag", "healthy", "--param", "seed=0")
    assert "registered run cartpole_healthy_s0" in out and "framework stable-baselines3" in out
    runs = json.loads(rlreg("runs", "--json", "--where", "learning_rate>1e-4 and algorithm=PPO"))
    assert runs["total"] == 1
    run_id = runs["runs"][0]["id"]
    rlreg("outcome", run_id, "--verdict", "success", "--score", "final_return=500", "--checkpoint",
          "100352=ckpt/final.zip", "--notes", "solved")
    detail = json.loads(rlreg("show", run_id, "--json"))
    assert detail["verdict"] == "success" and detail["scores"] == {"final_return": 500.0}
    assert detail["checkpoints"] == [{"step": 100352, "uri": "ckpt/final.zip", "note": None}]
    assert {s["key"] for s in detail["series"]} >= {"train/approx_kl", "rollout/ep_rew_mean"}
    text = rlreg("show", run_id)
    assert "train/approx_kl" in text and "kl_estimator=k3" in text


def test_register_again_names_the_run_and_exits_two(rlreg, sb3_runs: Path):
    rlreg("register", str(sb3_runs / "cartpole_healthy_s0"))
    out = rlreg("register", str(sb3_runs / "cartpole_healthy_s0"), code=2)
    assert "already registered as run 'cartpole_healthy_s0'" in out and "--replace" in out
    out = rlreg("register", str(sb3_runs / "cartpole_healthy_s0"), "--replace")
    assert "replaced run" in out


def test_bad_input_exits_non_zero_with_position(rlreg, tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("step,reward\n1,0.5\n0,0.4\n")
    out = rlreg("register", str(bad), code=1)
    assert "bad.csv, line 3" in out and "decreasing step 0" in out
    assert json.loads(rlreg("runs", "--json"))["total"] == 0


def test_bad_filter_exits_non_zero(rlreg):
    out = rlreg("runs", "--where", "lr >> 3", code=1)
    assert "bad filter" in out and "column" in out


def test_dictionary_export_import_show(rlreg, tmp_path: Path):
    listing = json.loads(rlreg("dictionary", "list", "--json"))
    assert {d["layer"] for d in listing} == {"objective", "constraint", "diagnostic"}
    exported = tmp_path / "dictionary.yaml"
    rlreg("dictionary", "export", "-o", str(exported))
    text = exported.read_text()
    assert "format: rlregistry-dictionary" in text
    out = rlreg("dictionary", "import", str(exported))
    assert "created 0" in out and "updated 0" in out
    name = listing[0]["name"]
    shown = json.loads(rlreg("dictionary", "show", name, "--json"))
    assert shown["name"] == name and shown["history"][0]["version"] == 1


def test_dictionary_show_suggests_what_a_name_may_have_meant(rlreg):
    out = rlreg("dictionary", "show", "kl", code=1)
    assert "no metric definition named 'kl'; did you mean kl_ref_mean (trl's 'kl')" in out
    assert "entropy" in rlreg("dictionary", "show", "entropi", code=1)
    assert "history" not in rlreg("dictionary", "--help").split("Commands:")[0]  # no command of that name
