"""The SB3 RegistryCallback and output format on a real short PPO training on CartPole, checked
against the progress.csv SB3's own CSV output format writes in the same run."""
from __future__ import annotations

import csv

import numpy as np
import pytest

pytest.importorskip("torch")
sb3 = pytest.importorskip("stable_baselines3")
pytest.importorskip("gymnasium")

from stable_baselines3.common.logger import Logger, configure, make_output_format  # noqa: E402

from registry import open_registry  # noqa: E402
from registry.integrations.sb3 import RegistryCallback, RegistryOutputFormat  # noqa: E402


def progress_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_ppo_cartpole_run_has_hyperparameters_and_every_dump_at_num_timesteps(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    model = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=2, learning_rate=3e-4,
                    clip_range=0.2, ent_coef=0.01, seed=0, device="cpu")
    model.set_logger(configure(str(tmp_path / "sb3"), ["csv"]))
    callback = RegistryCallback(project="cartpole", tags=["smoke"], db=db)
    model.learn(total_timesteps=2048, callback=callback)

    rows = progress_rows(tmp_path / "sb3" / "progress.csv")
    assert len(rows) == 8
    with open_registry(db) as reg:
        detail = reg.run_detail(callback.run.id)
        assert detail["status"] == "finished" and detail["algorithm"] == "PPO"
        assert detail["framework"] == "stable-baselines3" and detail["task"] == "CartPole-v1"
        p = detail["params"]
        assert p["learning_rate"] == pytest.approx(3e-4) and p["clip_range"] == pytest.approx(0.2)
        assert (p["n_steps"], p["batch_size"], p["n_epochs"], p["ent_coef"]) == (256, 64, 2, 0.01)
        assert p["policy"] == "ActorCriticPolicy" and p["versions.stable_baselines3"] == sb3.__version__
        series = {s["key"]: s for s in detail["series"]}
        assert series["train/approx_kl"]["definition"] is not None
        for key in ("rollout/ep_rew_mean", "train/approx_kl", "train/entropy_loss", "time/fps"):
            want = [(int(r["time/total_timesteps"]), float(r[key])) for r in rows if r.get(key)]
            got = reg.read_series(callback.run.id, key)
            assert list(got.steps) == [s for s, _ in want], key
            assert np.allclose(got.values, [v for _, v in want], rtol=1e-6), key
        assert all(s % 256 == 0 for s in reg.read_series(callback.run.id, "rollout/ep_rew_mean").steps)


def test_output_format_alone_and_excluded_keys(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    fmt = RegistryOutputFormat("by-hand", db=db, algorithm="A2C")
    logger = Logger(None, [make_output_format("csv", str(tmp_path)), fmt])
    model = sb3.A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0, device="cpu")
    model.set_logger(logger)
    logger.record("custom/hidden", 1.0, exclude="registry")
    model.learn(total_timesteps=400, log_interval=10)
    logger.close()
    rows = progress_rows(tmp_path / "progress.csv")
    with open_registry(db) as reg:
        detail = reg.run_detail(fmt.run.id)
        assert detail["status"] == "finished" and detail["framework"] == "stable-baselines3"
        keys = {s["key"] for s in detail["series"]}
        assert any(r.get("custom/hidden") for r in rows), "SB3 dumped it to the CSV"
        assert "custom/hidden" not in keys and "train/value_loss" in keys
        got = reg.read_series(fmt.run.id, "train/value_loss")
        assert list(got.steps) == [int(r["time/total_timesteps"]) for r in rows if r.get("train/value_loss")]
