"""verl: a logger with the interface of verl's tracking backends (``log(data, step)``, ``finish()``).

verl's ``Tracking`` (verl/utils/tracking.py) builds its backends from ``trainer.logger`` and has
no plugin hook, so the adapter is registered by adding three lines to a fork or launcher::

    # verl/utils/tracking.py, in Tracking.__init__ (and "rlregistry" added to supported_backend):
    if "rlregistry" in default_backend:
        from registry.integrations.verl import RegistryLogger
        self.logger["rlregistry"] = RegistryLogger(project_name, experiment_name, config)
    # in Tracking.__del__:
    if "rlregistry" in self.logger:
        self.logger["rlregistry"].finish()

then train with ``trainer.logger=['console','rlregistry']``. Keys arrive exactly as verl logs them
(``actor/ppo_kl``, ``critic/score/mean``, ``val-core/.../mean@4``), at verl's global step; the
config (the resolved trainer config verl passes to ``Tracking``) becomes the hyperparameters, and
``algorithm.adv_estimator`` the algorithm (``gae`` is PPO). Without a fork, ``rlreg follow`` on
the console log or the ``file`` backend's JSONL does the same from outside.
"""
from __future__ import annotations

from typing import Any, Mapping

from registry.integrations.stream import StreamingRun

# AdvantageEstimator values (verl/trainer/ppo/core_algos.py at b178a3c); others keep no algorithm.
_ALGORITHMS = {"gae": "PPO", "grpo": "GRPO", "grpo_vectorized": "GRPO", "grpo_passk": "GRPO", "rloo": "RLOO",
               "rloo_vectorized": "RLOO", "reinforce_plus_plus": "REINFORCE++",
               "reinforce_plus_plus_baseline": "REINFORCE++", "remax": "REMAX", "opo": "OPO", "gpg": "GPG"}


class RegistryLogger:
    """``log(data, step)`` / ``finish()``, as verl's backends; never raises into training."""

    def __init__(self, project_name: str, experiment_name: str, config: Mapping[str, Any] | None = None,
                 **run_options: Any):
        config = dict(config or {})
        estimator = (config.get("algorithm") or {}).get("adv_estimator") if isinstance(
            config.get("algorithm"), Mapping) else None
        self.run = StreamingRun(experiment_name, project=project_name, framework="verl",
                                algorithm=_ALGORITHMS.get(str(estimator).lower(), None) if estimator else None,
                                params=config, **run_options)
        self.run.finish_at_exit("crashed")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log(step, data)

    def finish(self) -> None:
        self.run.finish("finished")
