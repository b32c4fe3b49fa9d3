"""rlregistry: an experiment registry with a metric dictionary for RL training runs.

The Python API starts at :func:`open_registry`::

    from registry import open_registry
    reg = open_registry("sqlite:///runs.db")
    with reg.create_run("ppo-seed0", project="cartpole", algorithm="PPO", framework="stable-baselines3") as run:
        for step in range(...):
            run.log(step, {"rollout/ep_rew_mean": ..., "train/approx_kl": ...})
"""
from .errors import RegistryError
from .series import SeriesData
from .store import Registry, RegistrationResult, RunHandle, open_registry

__all__ = ["Registry", "RegistrationResult", "RegistryError", "RunHandle", "SeriesData", "open_registry"]
