"""Produce a small stable-baselines3 PPO run on CartPole-v1 with SB3's own logger.

Usage: python sb3_ppo_cartpole_logger.py OUT_DIR [--timesteps 20000] [--seed 0]
SB3's `configure(OUT_DIR, ["stdout", "csv", "json", "tensorboard"])` writes OUT_DIR/progress.csv,
OUT_DIR/progress.json and OUT_DIR/events.out.tfevents.*; redirect stdout to keep the console table.
The hyperparameters the model used (all SB3 defaults) go to OUT_DIR/params.json.
"""

import argparse
import json
import sys

import gymnasium
import numpy
import stable_baselines3
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure


def schedule_value(value):
    """SB3 turns constant hyperparameters into schedules; store the value at progress 1.0."""
    return value(1.0) if callable(value) else value


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--timesteps", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    model = PPO("MlpPolicy", "CartPole-v1", seed=a.seed, verbose=1, device="cpu")
    model.set_logger(configure(a.out_dir, ["stdout", "csv", "json", "tensorboard"]))
    model.learn(total_timesteps=a.timesteps)

    params = {
        "algo": "PPO",
        "policy": "MlpPolicy",
        "env_id": "CartPole-v1",
        "total_timesteps": a.timesteps,
        "seed": a.seed,
        "n_envs": model.n_envs,
        "learning_rate": schedule_value(model.learning_rate),
        "n_steps": model.n_steps,
        "batch_size": model.batch_size,
        "n_epochs": model.n_epochs,
        "gamma": model.gamma,
        "gae_lambda": model.gae_lambda,
        "clip_range": schedule_value(model.clip_range),
        "clip_range_vf": schedule_value(model.clip_range_vf),
        "normalize_advantage": model.normalize_advantage,
        "ent_coef": model.ent_coef,
        "vf_coef": model.vf_coef,
        "max_grad_norm": model.max_grad_norm,
        "target_kl": model.target_kl,
        "use_sde": model.use_sde,
        "policy_kwargs": {k: str(v) for k, v in model.policy_kwargs.items()},
        "versions": {
            "stable_baselines3": stable_baselines3.__version__,
            "gymnasium": gymnasium.__version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "python": sys.version.split()[0],
        },
    }
    with open(f"{a.out_dir}/params.json", "w") as f:
        json.dump(params, f, indent=2)


if __name__ == "__main__":
    main()
