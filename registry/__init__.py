"""rlregistry: an experiment registry with a metric dictionary for RL training runs.

The Python API starts at :func:`open_registry`::

    from registry import open_registry
    reg = open_registry("sqlite:///runs.db")
    with reg.create_run("ppo-seed0", project="cartpole", algorithm="PPO", framework="stable-baselines3") as run:
        for step in range(...):
            run.log(step, {"rollout/ep_rew_mean": ..., "train/approx_kl": ...})
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from registry.errors import RegistryError

if TYPE_CHECKING:
    from registry.series import SeriesData
    from registry.store import Registry, RegistrationResult, RunHandle, open_registry

__all__ = ["Registry", "RegistrationResult", "RegistryError", "RunHandle", "SeriesData", "open_registry"]

# Imported on first use: the store pulls in SQLAlchemy and Alembic (~0.5 s), which `rlreg --help`
# and every other command that never opens a registry should not pay for.
_LAZY = {"SeriesData": "registry.series", "Registry": "registry.store", "RegistrationResult": "registry.store",
         "RunHandle": "registry.store", "open_registry": "registry.store"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'registry' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
