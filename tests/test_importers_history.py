"""History importers (MLflow database and mlruns/, trackio, W&B run dirs and exports) reading stores
that the real clients wrote in the test, through ``rlreg register``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from registry import open_registry
from registry.cli.main import cli

REPO = Path(__file__).resolve().parents[1]


def run_script(script: str, cwd: Path, **env: str) -> None:
    """The tracker's client in a child process (their global state and atexit hooks stay out of pytest)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]


def register(db: str, *args: str):
    result = CliRunner().invoke(cli, ["--db", db, "register", *args])
    return result


def runs_by_name(db: str) -> dict[str, dict]:
    with open_registry(db) as reg:
        return {r["name"]: reg.run_detail(r["id"]) for r in reg.list_runs(limit=1000)[0]}


def series(db: str, run_id: str, key: str):
    with open_registry(db) as reg:
        return reg.read_series(run_id, key)


MLFLOW_SCRIPT = """
    import math, sys
    import mlflow
    mlflow.set_tracking_uri(sys.argv[1] if len(sys.argv) > 1 else {uri!r})
    mlflow.set_experiment("math-grpo")
    with mlflow.start_run(run_name="verl-grpo") as run:
        # what verl's Tracking does: config flattened with '/', '@' in keys rewritten to '_at_'
        mlflow.log_params({{"actor_rollout_ref/actor/optim/lr": 1e-6, "trainer/project_name": "math",
                           "algorithm/adv_estimator": "grpo"}})
        for step in range(1, 21):
            mlflow.log_metrics({{"actor/ppo_kl": 0.001 * step, "critic/score/mean": step / 20,
                                "val-core/gsm8k/acc/mean_at_4": 0.5 + step / 100,
                                "actor/grad_norm": math.nan if step == 5 else (math.inf if step == 6 else 1.0)}},
                               step=step)
    with mlflow.start_run(run_name="plain-ppo"):
        mlflow.log_param("learning_rate", "3e-4")
        mlflow.set_tag("team", "rl")
        for step in range(0, 100, 10):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.log_metric("loss", 0.5, step=90)   # a second point at the last step
    crashed = mlflow.start_run(run_name="oom")
    mlflow.log_metric("loss", 1.0, step=1)
    mlflow.end_run(status="FAILED")
"""


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory):
    pytest.importorskip("mlflow")
    where = tmp_path_factory.mktemp("mlflow")
    run_script(MLFLOW_SCRIPT.format(uri=f"sqlite:///{where / 'mlflow.db'}"), where)
    return where / "mlflow.db"


def check_mlflow_runs(db: str) -> None:
    runs = runs_by_name(db)
    assert set(runs) == {"verl-grpo", "plain-ppo", "oom"}
    verl = runs["verl-grpo"]
    assert verl["project"] == "math-grpo" and verl["framework"] == "verl" and verl["status"] == "finished"
    assert verl["params"]["actor_rollout_ref.actor.optim.lr"] == 1e-6
    keys = {s["key"] for s in verl["series"]}
    assert "val-core/gsm8k/acc/mean@4" in keys and "val-core/gsm8k/acc/mean_at_4" not in keys
    kl = series(db, verl["id"], "actor/ppo_kl")
    assert list(kl.steps) == list(range(1, 21)) and np.allclose(kl.values, [0.001 * s for s in range(1, 21)])
    grad = series(db, verl["id"], "actor/grad_norm")
    assert math.isnan(grad.values[4]) and grad.values[5] == math.inf and grad.values[6] == 1.0
    plain = runs["plain-ppo"]
    assert plain["params"]["learning_rate"] == 3e-4 and plain["tags"] == ["team=rl"]
    loss = series(db, plain["id"], "loss")
    assert list(loss.steps) == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 90]
    assert runs["oom"]["status"] == "crashed"


def test_mlflow_database_one_run_per_mlflow_run_and_a_second_import_adds_nothing(mlflow_db, tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    first = register(db, str(mlflow_db))
    assert first.exit_code == 0, first.output
    assert "3 registered, 0 skipped" in first.output
    check_mlflow_runs(db)
    second = register(db, "--format", "mlflow", str(mlflow_db), "--json")
    assert second.exit_code == 0, second.output
    answer = json.loads(second.output)
    assert answer["registered"] == [] and len(answer["skipped"]) == 3
    assert len(runs_by_name(db)) == 3


def test_mlflow_file_store(tmp_path):
    pytest.importorskip("mlflow")
    run_script(MLFLOW_SCRIPT.format(uri=(tmp_path / "mlruns").as_uri()), tmp_path, MLFLOW_ALLOW_FILE_STORE="true")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, str(tmp_path / "mlruns"))
    assert result.exit_code == 0, result.output
    check_mlflow_runs(db)


def test_truncated_mlflow_database_names_the_file(mlflow_db, tmp_path):
    cut = tmp_path / "mlflow.db"
    data = mlflow_db.read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, "--format", "mlflow", str(cut))
    assert result.exit_code == 1
    assert str(cut) in result.output and ("truncated" in result.output or "malformed" in result.output)


TRACKIO_SCRIPT = """
    import math, trackio
    trackio.init(project="cartpole", name="ppo-s0", config={"learning_rate": 3e-4, "clip": {"range": 0.2}})
    for step in range(30):
        trackio.log({"rollout/ep_rew_mean": 10.0 + step, "train/approx_kl": math.nan if step == 3 else 0.01,
                     "note": "text"}, step=step * 100)
    trackio.finish()
    trackio.init(project="cartpole", name="ppo-s1", config={"learning_rate": 1e-3})
    for step in range(5):
        trackio.log({"rollout/ep_rew_mean": 9.0}, step=step)
    trackio.finish()
"""


def test_trackio_database(tmp_path):
    pytest.importorskip("trackio")
    run_script(TRACKIO_SCRIPT, tmp_path, TRACKIO_DIR=str(tmp_path / "trackio"))
    store = tmp_path / "trackio" / "cartpole.db"
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, str(store))
    assert result.exit_code == 0, result.output
    runs = runs_by_name(db)
    assert set(runs) == {"ppo-s0", "ppo-s1"}
    s0 = runs["ppo-s0"]
    assert s0["project"] == "cartpole" and s0["params"] == {"clip.range": 0.2, "learning_rate": 3e-4}
    ret = series(db, s0["id"], "rollout/ep_rew_mean")
    assert list(ret.steps) == [s * 100 for s in range(30)] and list(ret.values) == [10.0 + s for s in range(30)]
    kl = series(db, s0["id"], "train/approx_kl")
    assert int(np.isnan(kl.values).sum()) == 1
    assert "note" not in {s["key"] for s in s0["series"]}
    again = register(db, str(store))
    assert again.exit_code == 0 and "0 registered, 2 skipped" in again.output


WANDB_SCRIPT = """
    import wandb
    run = wandb.init(project="rlhf", name="grpo-w", config={"lr": 3e-4, "optim": {"beta": 0.9}}, tags=["x"])
    for i in range(12):
        # the Hugging Face WandbCallback's shape: train/global_step in every entry
        wandb.log({"train/loss": 1.0 / (i + 1), "train/reward": i / 10, "train/global_step": i * 4})
    wandb.log({"eval/reward": 0.3})        # no train/global_step: reported, not put on _step
    run.summary["best_reward"] = 1.1
    wandb.finish()
"""


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory):
    pytest.importorskip("wandb")
    where = tmp_path_factory.mktemp("wandb")
    run_script(WANDB_SCRIPT, where, WANDB_MODE="offline", WANDB_DIR=str(where), WANDB_SILENT="true")
    return where / "wandb"


def test_wandb_offline_run_directory(wandb_dir, tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    (run_dir,) = wandb_dir.glob("offline-run-*")
    result = register(db, str(run_dir))
    assert result.exit_code == 0, result.output
    assert "1 of 13 history rows have no 'train/global_step'" in result.output
    (run,) = runs_by_name(db).values()
    assert run["name"] == "grpo-w" and run["project"] == "rlhf" and run["tags"] == ["x"]
    assert run["params"] == {"lr": 3e-4, "optim.beta": 0.9} and run["scores"] == {"best_reward": 1.1}
    loss = series(db, run["id"], "train/loss")
    assert list(loss.steps) == [i * 4 for i in range(12)]
    assert np.allclose(loss.values, [1.0 / (i + 1) for i in range(12)])
    again = register(db, str(wandb_dir))       # the wandb/ folder: the same run, already present
    assert again.exit_code == 0 and "0 registered, 1 skipped" in again.output


def test_wandb_history_parquet_and_csv_prefer_the_trainer_step(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"_step": list(range(6)), "train/global_step": [0, 8, 16, 24, 32, None],
                      "train/loss": [1.0, 0.8, 0.6, float("nan"), 0.4, None], "_runtime": [1.0] * 6,
                      "eval/loss": [None] * 5 + [0.7]})
    pq.write_table(table, tmp_path / "history.parquet")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, str(tmp_path / "history.parquet"))
    assert result.exit_code == 0, result.output
    (run,) = runs_by_name(db).values()
    loss = series(db, run["id"], "train/loss")
    assert list(loss.steps) == [0, 8, 16, 24, 32] and math.isnan(loss.values[3])
    assert {s["key"] for s in run["series"]} == {"train/loss"}

    (tmp_path / "export.csv").write_text("_step,global_step,reward\n0,100,1.5\n1,200,2.5\n")
    result = register(db, "--format", "wandb", str(tmp_path / "export.csv"))
    assert result.exit_code == 0, result.output
    csv_run = runs_by_name(db)["export"]
    assert csv_run["source"]["format"] == "wandb"
    assert list(series(db, csv_run["id"], "reward").steps) == [100, 200]


def test_truncated_parquet_names_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"_step": list(range(1000)), "loss": [float(i) for i in range(1000)]}),
                   tmp_path / "h.parquet")
    data = (tmp_path / "h.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2] + b"PAR1")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, "--format", "wandb", str(tmp_path / "cut.parquet"))
    assert result.exit_code == 1 and "cut.parquet" in result.output and "truncated" in result.output
    with open_registry(db) as reg:
        assert reg.list_runs()[1] == 0


def test_recursive_tree_registers_everything_once(mlflow_db, wandb_dir, tmp_path):
    tree = tmp_path / "runs"
    (tree / "team-a").mkdir(parents=True)
    (tree / "team-a" / "mlflow.db").write_bytes(mlflow_db.read_bytes())
    (tree / "team-a" / "notes.txt").write_text("not a run\n")
    import shutil

    shutil.copytree(wandb_dir, tree / "team-b" / "wandb")
    (tree / "team-c").mkdir()
    (tree / "team-c" / "progress.csv").write_text("step,loss\n1,0.5\n2,0.4\n")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    result = register(db, "--recursive", str(tree))
    assert result.exit_code == 0, result.output
    assert "5 registered, 0 skipped as already present, 0 failed" in result.output
    again = register(db, "-r", str(tree))
    assert "0 registered, 5 skipped as already present, 0 failed" in again.output
    (tree / "team-d").mkdir()
    (tree / "team-d" / "broken.csv").write_text("step,loss\n1,0.5\n1,x,y\n")
    third = register(db, "-r", str(tree))
    assert third.exit_code == 1 and "1 failed" in third.output and "broken.csv" in third.output
