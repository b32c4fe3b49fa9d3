"""stable-baselines3: a ``BaseCallback`` and a ``KVWriter`` output format that stream a run.

    from registry.integrations.sb3 import RegistryCallback
    model.learn(total_timesteps=100_000, callback=RegistryCallback(project="cartpole"))

The callback creates the run when training starts, with the model's hyperparameters
(``learning_rate``, ``clip_range``, ``ent_coef``, ``n_steps``, ``batch_size``, ``n_epochs``, ...;
a schedule is recorded as its value at the start of training, ``progress_remaining = 1``), the
algorithm (the model's class: PPO, A2C, SAC, ...), the task (the environment's id) and the
library versions. It then adds :class:`RegistryOutputFormat` to the model's logger, so every
``logger.dump(step=num_timesteps)`` SB3 makes lands in the run at ``num_timesteps`` under SB3's
own keys (``rollout/ep_rew_mean``, ``train/approx_kl``, ...: the keys the dictionary's SB3
aliases name). Training's end marks the run finished; a process that stops before, crashed.

The output format alone, for a logger configured by hand::

    from stable_baselines3.common.logger import Logger, make_output_format
    from registry.integrations.sb3 import RegistryOutputFormat
    model.set_logger(Logger(None, [make_output_format("stdout", ""), RegistryOutputFormat("ppo-run")]))

A key excluded for ``"registry"`` (``logger.record(key, value, exclude="registry")``) is skipped.
"""
from __future__ import annotations

from typing import Any, Sequence

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter

from registry.integrations.stream import StreamingRun

FRAMEWORK = "stable-baselines3"
EXCLUDE_NAME = "registry"

# Constructor arguments of SB3's algorithms that are hyperparameters (common/on_policy_algorithm.py,
# ppo/ppo.py, a2c/a2c.py, common/off_policy_algorithm.py, sac/sac.py, td3/td3.py, dqn/dqn.py).
HYPERPARAMETERS = (
    "learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range", "clip_range_vf",
    "normalize_advantage", "ent_coef", "vf_coef", "max_grad_norm", "target_kl", "use_sde", "sde_sample_freq",
    "rms_prop_eps", "use_rms_prop", "buffer_size", "learning_starts", "tau", "train_freq", "gradient_steps",
    "target_update_interval", "target_policy_noise", "target_noise_clip", "policy_delay",
    "exploration_fraction", "exploration_initial_eps", "exploration_final_eps", "n_envs", "seed", "device",
)


def model_params(model: Any) -> dict[str, Any]:
    """The model's hyperparameters; schedules (callables of progress_remaining) at their start value."""
    params: dict[str, Any] = {}
    for name in HYPERPARAMETERS:
        if not hasattr(model, name):
            continue
        value = getattr(model, name)
        if callable(value):
            try:
                value = value(1.0)
            except Exception:  # noqa: BLE001 - a schedule with another signature: record its text
                value = repr(value)
        if hasattr(value, "frequency") and hasattr(value, "unit"):  # TrainFreq(frequency, unit)
            value = f"{value.frequency} {getattr(value.unit, 'value', value.unit)}"
        params[name] = value
    policy = getattr(model, "policy", None)
    if policy is not None:
        params["policy"] = type(policy).__name__
    if getattr(model, "policy_kwargs", None):
        params["policy_kwargs"] = {k: v for k, v in model.policy_kwargs.items()}
    return params


def env_id(model: Any) -> str | None:
    env = model.get_env() if hasattr(model, "get_env") else None
    if env is None:
        return None
    try:
        spec = env.get_attr("spec")[0]
    except Exception:  # noqa: BLE001 - an env without a spec
        return None
    return getattr(spec, "id", None)


def versions() -> dict[str, str]:
    import stable_baselines3

    out = {"stable_baselines3": stable_baselines3.__version__}
    for module in ("gymnasium", "torch"):
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            pass
    return out


class RegistryOutputFormat(KVWriter):
    """An SB3 logger output format: every dump becomes one ``log`` at its step (``num_timesteps``)."""

    def __init__(self, name: str | None = None, *, run: StreamingRun | None = None, **run_options: Any):
        if run is None:
            run_options.setdefault("framework", FRAMEWORK)
            run = StreamingRun(name or "sb3-run", **run_options)
            run.finish_at_exit("crashed")
        self.run = run

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        self.run.log(step, {key: value for key, value in key_values.items()
                            if EXCLUDE_NAME not in (key_excluded.get(key) or ())})

    def close(self) -> None:
        self.run.finish("finished")


class RegistryCallback(BaseCallback):
    """Creates the run at training start and streams every logger dump into it."""

    def __init__(self, name: str | None = None, *, project: str = "default", tags: Sequence[str] | None = None,
                 task: str | None = None, params: dict[str, Any] | None = None, verbose: int = 0,
                 **run_options: Any):
        super().__init__(verbose)
        self.name = name
        self.project = project
        self.tags = list(tags or [])
        self.task = task
        self.extra_params = dict(params or {})
        self.run_options = run_options
        self.run: StreamingRun | None = None
        self._format: RegistryOutputFormat | None = None

    def _on_training_start(self) -> None:
        algorithm = type(self.model).__name__
        task = self.task or env_id(self.model)
        params = {**model_params(self.model), "versions": versions(), **self.extra_params}
        name = self.name or f"{algorithm.lower()}-{task or 'env'}"
        self.run = StreamingRun(name, project=self.project, algorithm=algorithm, framework=FRAMEWORK, task=task,
                                params=params, tags=self.tags, **self.run_options)
        self.run.finish_at_exit("crashed")
        self._format = RegistryOutputFormat(run=self.run)
        self.model.logger.output_formats.append(self._format)

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if self._format is not None and self._format in self.model.logger.output_formats:
            self.model.logger.output_formats.remove(self._format)
        if self.run is not None:
            self.run.finish("finished")
