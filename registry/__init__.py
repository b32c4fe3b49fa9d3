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

from registry.core.errors import RegistryError

if TYPE_CHECKING:
    from registry.core.series import SeriesData
    from registry.store.facade import Registry, RegistrationResult
    from registry.store.run_handle import RunHandle

__all__ = ["Registry", "RegistrationResult", "RegistryError", "RunHandle", "SeriesData", "open_registry"]

# Imported on first use: the store pulls in SQLAlchemy and Alembic (~0.5 s), which `rlreg --help`
# and every other command that never opens a registry should not pay for.
_LAZY = {"SeriesData": "registry.core.series", "Registry": "registry.store.facade",
         "RegistrationResult": "registry.store.facade", "RunHandle": "registry.store.run_handle"}


def open_registry(url: str | None = None, **options: Any) -> Registry:
    """Open (and create or upgrade) a registry, with the analysis layer following its writes.

    ``url`` is ``sqlite:///path`` or ``postgresql+psycopg://...`` (default: ``RLREG_DATABASE_URL``
    or ``./rlregistry.db``); ``options`` go to :class:`~registry.store.facade.Registry`. The
    similar-run index is kept current inside each write and every registered or finished run is
    diagnosed after its commit. A bare ``open_registry(url)`` stores and reads the same data without
    either.
    """
    # Imported here, not at the top: `rlreg --help` must not pay for SQLAlchemy and NumPy.
    from registry.analysis.subscriptions import subscribe
    from registry.store.facade import Registry

    registry = Registry(url, **options)
    subscribe(registry.hooks)
    return registry


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'registry' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
