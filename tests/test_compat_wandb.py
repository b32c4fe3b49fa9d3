"""registry.compat.wandb driven the way CleanRL- and OpenRLHF-style scripts drive wandb."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import registry.compat.wandb as wandb
from registry import open_registry

REPO = Path(__file__).resolve().parents[1]


def test_openrlhf_style_step_metric_config_and_summary(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    args = argparse.Namespace(actor_learning_rate=5e-7, init_kl_coef=0.01, kl_estimator="k3")
    run = wandb.init(project="rlhf", name="ppo-7b", config=args, group="sweep", db=db)
    wandb.config.update({"micro_batch": 4})
    wandb.define_metric("train/global_step")
    wandb.define_metric("train/*", step_metric="train/global_step", step_sync=True)
    wandb.define_metric("eval/*", step_metric="eval/epoch", goal="maximize")
    wandb.define_metric("train/kl", kl_estimator="k3")
    for global_step in range(1, 6):
        wandb.log({"train/global_step": global_step, "train/policy_loss": 0.1 * global_step,
                   "train/kl": np.float32(0.01 * global_step), "train/reward": {"mean": global_step}})
    wandb.log({"eval/epoch": 1, "eval/reward": 0.7})
    run.summary["best_reward"] = 0.9
    run.summary.update({"note": "text"})
    wandb.finish()
    assert wandb.run is None

    with open_registry(db) as reg:
        detail = reg.run_detail(run.id)
        assert detail["name"] == "ppo-7b" and detail["project"] == "rlhf" and detail["tags"] == ["group:sweep"]
        assert detail["status"] == "finished" and detail["scores"] == {"best_reward": 0.9}
        p = detail["params"]
        assert p["actor_learning_rate"] == 5e-7 and p["micro_batch"] == 4
        assert p["wandb.define_metric.train/*.step_metric"] == "train/global_step"
        assert p["wandb.define_metric.eval/*.goal"] == "maximize"
        loss = reg.read_series(run.id, "train/policy_loss")
        assert list(loss.steps) == [1, 2, 3, 4, 5]   # the global step, not W&B's own counter
        assert np.allclose(loss.values, [0.1 * s for s in range(1, 6)])
        assert list(reg.read_series(run.id, "train/reward/mean").steps) == [1, 2, 3, 4, 5]
        assert list(reg.read_series(run.id, "eval/reward").steps) == [1]
        series = {s["key"]: s for s in detail["series"]}
        assert series["train/kl"]["overrides"] == {"kl_estimator": "k3"}


def test_cleanrl_style_explicit_and_implicit_steps(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    run = wandb.init(project="cartpole", config={"learning_rate": 2.5e-4}, db=db, sync_tensorboard=True,
                     save_code=True, entity="team")
    wandb.log({"charts/episodic_return": 10.0}, step=128)
    wandb.log({"charts/episodic_return": 12.0}, step=128)   # another episode ended at the same step
    wandb.log({"losses/value_loss": 3.0, "charts/image": wandb.Image(None)}, step=256)
    wandb.log({"losses/value_loss": 9.0}, step=100)          # W&B drops a step that goes back
    wandb.log({"charts/sps": 500})                           # no step: the run's counter (still 256)
    wandb.log({"charts/sps": 510})                           # and it was advanced by the commit
    wandb.finish()
    with open_registry(db) as reg:
        ret = reg.read_series(run.id, "charts/episodic_return")
        assert list(ret.steps) == [128, 128] and list(ret.values) == [10.0, 12.0]
        assert list(reg.read_series(run.id, "losses/value_loss").values) == [3.0]
        assert list(reg.read_series(run.id, "charts/sps").steps) == [256, 257]
        assert "charts/image" not in {s["key"] for s in reg.run_detail(run.id)["series"]}


def test_disabled_mode_records_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    run = wandb.init(project="x", mode="disabled", db=db)
    wandb.log({"loss": 1.0})
    wandb.finish()
    assert run.id is None
    with open_registry(db) as reg:
        assert reg.list_runs()[1] == 0


def test_script_ending_without_finish_is_finished_and_an_uncaught_error_crashed(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    script = textwrap.dedent(f"""
        import sys
        import registry.compat.wandb as wandb
        wandb.init(project="p", name=sys.argv[1], db={db!r})
        for step in range(3):
            wandb.log({{"loss": 1.0 / (step + 1)}}, step=step)
        if sys.argv[1] == "fails":
            raise ValueError("diverged")
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ok = subprocess.run([sys.executable, "-c", script, "ends"], env=env, capture_output=True, text=True)
    bad = subprocess.run([sys.executable, "-c", script, "fails"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode == 1 and "diverged" in bad.stderr
    with open_registry(db) as reg:
        runs = {r["name"]: r for r in reg.list_runs()[0]}
        assert runs["ends"]["status"] == "finished" and runs["fails"]["status"] == "crashed"
        assert list(reg.read_series(runs["fails"]["id"], "loss").steps) == [0, 1, 2]


def test_define_metric_refuses_unknown_semantics(tmp_path):
    run = wandb.init(project="x", mode="disabled")
    with pytest.raises(TypeError, match="kl_estimatr"):
        run.define_metric("kl", kl_estimatr="k1")
