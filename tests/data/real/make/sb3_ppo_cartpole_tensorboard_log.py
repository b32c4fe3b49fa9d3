"""Produce stable-baselines3 PPO runs on CartPole-v1 logged with `tensorboard_log=DIR`.

SB3 then writes one sub-directory per run, DIR/PPO_1, DIR/PPO_2, ... (its default layout for
several runs in one TensorBoard directory).

Usage: python sb3_ppo_cartpole_tensorboard_log.py DIR [--timesteps 10000] [--seeds 0 1]
"""

import argparse

from stable_baselines3 import PPO


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("tb_dir")
    p.add_argument("--timesteps", type=int, default=10000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    a = p.parse_args()
    for seed in a.seeds:
        model = PPO("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", tensorboard_log=a.tb_dir)
        model.learn(total_timesteps=a.timesteps)


if __name__ == "__main__":
    main()
