"""The run's own hyperparameters, read for diagnosis and compared with the framework's defaults.

A diagnosis explains a finding by what the run was configured to do: a clip range ten times
below the usual one, a negative entropy coefficient, sixty epochs per rollout. This module
finds those settings under each framework's own key names (in the run's stored
hyperparameters, or in the series a framework logs them as, e.g. SB3's ``train/clip_range``)
and knows each framework's defaults, with the file and version they were read from.

Settings are *knobs* with a canonical name:

=====================  ==========================================================
``learning_rate``      optimiser learning rate of the policy
``clip_range``         PPO ratio clip epsilon
``ent_coef``           entropy-bonus coefficient (negative = entropy is penalised)
``n_epochs``           passes over each rollout (SB3 n_epochs, CleanRL update_epochs,
                       verl ppo_epochs, TRL num_iterations)
``kl_coef``            KL penalty coefficient (TRL beta, verl kl_loss_coef / kl_coef)
``group_size``         responses per prompt (TRL num_generations, verl rollout.n)
``max_response_length`` longest response the rollout may generate
``target_kl``          KL at which SB3 / CleanRL stop the epochs early
``batch_size``         samples per gradient step (SB3 batch_size, verl
                       actor.ppo_mini_batch_size)
``vf_coef``            weight of the value loss in a loss shared with the policy
                       (SB3 and CleanRL; verl and TRL train no critic in that loss)
``gamma``              discount factor (SB3 and CleanRL)
``gae_lambda``         GAE lambda (SB3 and CleanRL)
``n_steps``            rollout length per environment before each update (SB3
                       n_steps, CleanRL num_steps)
=====================  ==========================================================

``gamma`` and ``gae_lambda`` are compared by the horizon they set, ``1 / (1 - x)`` steps: 0.5
against 0.99 is a horizon of 2 steps against 100 (50x shorter), where their plain ratio (2x)
would hide it; 0.999 against 0.99 is 10x longer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from registry.analysis.diagnosis.types import Curve

KNOBS = ("learning_rate", "clip_range", "ent_coef", "n_epochs", "kl_coef", "group_size",
         "max_response_length", "temperature", "target_kl", "batch_size", "vf_coef", "gamma", "gae_lambda",
         "n_steps")
#: Knobs compared by the horizon they set, 1 / (1 - x) steps, not by their value.
HORIZON_KNOBS = frozenset({"gamma", "gae_lambda"})
#: Knobs whose cause keys read high/low (rates, epochs, horizons); the others read large/small.
HIGH_LOW_KNOBS = frozenset({"learning_rate", "n_epochs", "gamma", "gae_lambda", "temperature"})

#: Each framework's key(s) for each knob, in its own configuration (flattened, dotted).
FRAMEWORK_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    # stable_baselines3/ppo/ppo.py, PPO.__init__ arguments (stable-baselines3 2.9.2).
    "stable-baselines3": {"learning_rate": ("learning_rate",), "clip_range": ("clip_range",),
                          "ent_coef": ("ent_coef",), "n_epochs": ("n_epochs",), "target_kl": ("target_kl",),
                          "batch_size": ("batch_size",), "vf_coef": ("vf_coef",), "gamma": ("gamma",),
                          "gae_lambda": ("gae_lambda",), "n_steps": ("n_steps",)},
    # cleanrl/ppo.py Args fields (vwxyzjn/cleanrl fe8d8a03, tyro; the argparse flags of 020cf0e5 had the same names).
    "cleanrl": {"learning_rate": ("learning_rate", "learning-rate"), "clip_range": ("clip_coef", "clip-coef"),
                "ent_coef": ("ent_coef", "ent-coef"), "n_epochs": ("update_epochs", "update-epochs"),
                "target_kl": ("target_kl", "target-kl"), "vf_coef": ("vf_coef", "vf-coef"), "gamma": ("gamma",),
                "gae_lambda": ("gae_lambda", "gae-lambda"), "n_steps": ("num_steps", "num-steps")},
    # trl/trainer/grpo_config.py, GRPOConfig fields (huggingface/trl, commit 006d32c9; the same in trl 1.16.0).
    "trl": {"learning_rate": ("learning_rate",), "clip_range": ("epsilon",), "kl_coef": ("beta",),
            "n_epochs": ("num_iterations",), "group_size": ("num_generations",),
            "max_response_length": ("max_completion_length",), "temperature": ("temperature",)},
    # verl/trainer/config/ppo_trainer.yaml (volcengine/verl, commit 008db456).
    "verl": {"learning_rate": ("actor_rollout_ref.actor.optim.lr",),
             "clip_range": ("actor_rollout_ref.actor.clip_ratio",),
             "ent_coef": ("actor_rollout_ref.actor.entropy_coeff",),
             "n_epochs": ("actor_rollout_ref.actor.ppo_epochs",),
             "kl_coef": ("actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef"),
             "group_size": ("actor_rollout_ref.rollout.n",),
             "max_response_length": ("data.max_response_length",),
             "batch_size": ("actor_rollout_ref.actor.ppo_mini_batch_size",)},
}

#: Each framework's default per knob, and where it was read.
FRAMEWORK_DEFAULTS: dict[str, dict[str, float]] = {
    "stable-baselines3": {"learning_rate": 3e-4, "clip_range": 0.2, "ent_coef": 0.0, "n_epochs": 10, "batch_size": 64,
                          "vf_coef": 0.5, "gamma": 0.99, "gae_lambda": 0.95, "n_steps": 2048},
    "cleanrl": {"learning_rate": 2.5e-4, "clip_range": 0.2, "ent_coef": 0.01, "n_epochs": 4, "vf_coef": 0.5,
                "gamma": 0.99, "gae_lambda": 0.95, "n_steps": 128},
    # max_completion_length was 256 at 006d32c9; 512 in the release the project installs and tests with.
    "trl": {"clip_range": 0.2, "kl_coef": 0.0, "n_epochs": 1, "group_size": 8, "max_response_length": 512,
            "temperature": 1.0},
    # rollout.n defaults to 1 ("> 1 for grpo"): no group size to compare a GRPO run with.
    "verl": {"learning_rate": 1e-6, "clip_range": 0.2, "ent_coef": 0.0, "n_epochs": 1, "kl_coef": 0.001,
             "max_response_length": 512, "batch_size": 256},
}
DEFAULT_SOURCES: dict[str, str] = {
    "stable-baselines3": "stable_baselines3/ppo/ppo.py PPO.__init__ (stable-baselines3 2.9.2)",
    "cleanrl": "cleanrl/ppo.py Args defaults (vwxyzjn/cleanrl fe8d8a03; the same in 020cf0e5)",
    "trl": "trl/trainer/grpo_config.py GRPOConfig (trl 1.16.0; the same but max_completion_length at 006d32c9)",
    "verl": "verl/trainer/config/ppo_trainer.yaml (volcengine/verl 008db456)",
}
FRAMEWORK_LABELS = {"stable-baselines3": "SB3", "cleanrl": "CleanRL", "trl": "TRL", "verl": "verl"}

#: Key names any framework may use, tried when the run's framework is unknown (last dotted part).
#: Ambiguous names (``epsilon`` is also Adam's, ``beta`` also Adam's betas) are read only
#: under a known framework.
GENERIC_KEYS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("learning_rate", "lr"),
    "clip_range": ("clip_range", "clip_coef", "cliprange", "clip_ratio", "clip_param"),
    "ent_coef": ("ent_coef", "entropy_coef", "entropy_coeff"),
    "n_epochs": ("n_epochs", "update_epochs", "ppo_epochs", "num_iterations", "num_ppo_epochs"),
    "kl_coef": ("kl_coef", "kl_loss_coef", "init_kl_coef"),
    "group_size": ("num_generations", "n_samples_per_prompt"),
    "max_response_length": ("max_completion_length", "max_response_length", "generate_max_len"),
    "target_kl": ("target_kl",),
    "vf_coef": ("vf_coef",),
    "gae_lambda": ("gae_lambda",),
    # Ambiguous across frameworks (a rollout, a minibatch, a per-device size; a learning-rate scheduler's
    # gamma): only under a known framework.
    "batch_size": (),
    "gamma": (),
    "n_steps": (),
    "temperature": (),
}

#: Slack on log(factor) when a ratio is compared with a factor: the float error of a ratio of two
#: settings written in decimal.
FACTOR_TOLERANCE = 1e-9

#: Canonical series a framework logs a knob as (a schedule's current value).
KNOB_SERIES = {"learning_rate": "learning_rate", "clip_range": "clip_range", "ent_coef": "entropy_coef",
               "kl_coef": "kl_coef"}


@dataclass(frozen=True)
class Setting:
    """One knob of one run: its value, where it was found, and the reference it is judged by."""

    knob: str
    value: float
    source: str                      # "hyperparameter 'clip_range'" or "logged series 'clip_range'"
    default: float | None = None
    default_source: str | None = None
    framework: str | None = None
    healthy: float | None = None     # median of the task's healthy runs, when known
    healthy_n: int = 0
    key: str | None = None           # the run's own key for it ("num_iterations", "actor...clip_ratio")

    @property
    def name(self) -> str:
        """The name the run's framework uses (its key's last part), else the knob."""
        return self.key.rsplit(".", 1)[-1] if self.key else self.knob

    def ratio(self) -> float | None:
        """value / reference (healthy runs' median first, else the framework default); None if either is 0.
        For a horizon knob, the ratio of the horizons they set (None when either is unbounded)."""
        ref = self.reference
        if self.knob in HORIZON_KNOBS:
            h, hr = horizon(self.value), (None if ref is None else horizon(ref))
            return None if h is None or hr is None else h / hr
        if ref is None or ref == 0 or self.value == 0:
            return None
        return self.value / ref

    def off(self, factor: float) -> bool:
        """Is the setting far from its reference: ``factor`` times above or below it, of the opposite sign,
        or zero where the reference is not (or the reverse)?"""
        ref = self.reference
        if ref is None:
            return False
        if self.knob == "kl_coef" and ref == 0 and self.value > 0:
            # A reference of no penalty (TRL 1.16.0's GRPOConfig.beta = 0.0, the reference model then not even
            # loaded) gives no scale by which a penalty is large: turning it on is a choice of regime, not a
            # setting far off.
            return False
        if self.knob not in HORIZON_KNOBS and (ref == 0 or self.value == 0):
            return self.value != ref
        r = self.ratio()
        return r is not None and (r < 0 or self.far(factor) is not None)

    @property
    def above_reference(self) -> bool:
        """Is the setting above its reference (by its horizon, for a horizon knob; by value where there is
        no ratio, as against a reference of zero)?"""
        r = self.ratio()
        return r > 1 if r is not None else self.value > (self.reference or 0)

    @property
    def cause_key(self) -> str:
        """The cause key the setting stands for when it is off its reference (``clip_range_small``,
        ``ent_coef_negative``, ``gamma_low``): the keys the cause rules use."""
        if self.knob == "ent_coef":
            return "ent_coef_negative" if self.value < 0 else "ent_coef_large"
        up = self.above_reference
        if self.knob in HIGH_LOW_KNOBS:
            return f"{self.knob}_{'high' if up else 'low'}"
        return f"{self.knob}_{'large' if up else 'small'}"

    def far(self, factor: float) -> float | None:
        """The ratio to the reference when it is at least ``factor`` above or below it, else None.

        "At least": a setting written as that multiple is far (1e-4 against 3e-4 is 3x below,
        though its float ratio is 0.33333333333333337, a hair above 1/3).
        """
        r = self.ratio()
        if r is None or r <= 0:
            return None
        return r if abs(math.log(r)) >= math.log(factor) - FACTOR_TOLERANCE else None

    @property
    def reference(self) -> float | None:
        return self.healthy if self.healthy is not None else self.default

    def describe(self) -> str:
        """``clip_range = 0.02, 10x below the SB3 default 0.2``; ``gamma = 0.5 (a horizon of 2 steps), a
        horizon 50x shorter than the SB3 default 0.99's (100 steps)``."""
        compare = _compare_horizon if self.knob in HORIZON_KNOBS else _compare
        text = f"{self.name} = {_fmt(self.value)}"
        if self.knob in HORIZON_KNOBS:
            text += f" ({_horizon_words(self.value)})"
        parts = []
        if self.default is not None:
            parts.append(compare(self.value, self.default, f"the {FRAMEWORK_LABELS.get(self.framework or '', self.framework or '')} default"))
        if self.healthy is not None and (self.default is None or not math.isclose(self.healthy, self.default)):
            parts.append(compare(self.value, self.healthy, f"the median of {self.healthy_n} healthy run(s) of this task"))
        return text + (f", {'; '.join(parts)}" if parts else "")

    def to_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "key": self.key, "value": self.value, "source": self.source, "default": self.default,
                "default_source": self.default_source, "framework": self.framework, "healthy": self.healthy,
                "healthy_n": self.healthy_n, "text": self.describe()}


def _fmt(v: float) -> str:
    return f"{v:g}"


def _compare(value: float, ref: float, what: str) -> str:
    if ref == 0:
        if value == 0:
            return f"as {what} {_fmt(ref)}"
        return f"{'above' if value > 0 else 'below'} {what} {_fmt(ref)}"
    if value == 0:
        return f"zero against {what} {_fmt(ref)}"     # beta = 0: the term is switched off
    r = value / ref
    if r < 0:
        return f"of the opposite sign to {what} {_fmt(ref)}"
    if 0.8 <= r <= 1.25:
        return f"as {what} {_fmt(ref)}"
    if r > 1:
        return f"{_times(r)} {what} {_fmt(ref)}"
    return f"{_times(1 / r)} below {what} {_fmt(ref)}"


def horizon(x: float) -> float | None:
    """The number of steps a discount (or GAE lambda) ``x`` looks ahead, ``1 / (1 - x)``; None when
    unbounded (``x >= 1``) or meaningless (``x < 0``)."""
    return 1.0 / (1.0 - x) if 0 <= x < 1 else None


def _horizon_words(x: float) -> str:
    h = horizon(x)
    return "an unbounded horizon" if h is None else f"a horizon of {h:.3g} step{'s' if h != 1 else ''}"


def _compare_horizon(value: float, ref: float, what: str) -> str:
    h, hr = horizon(value), horizon(ref)
    if h is None or hr is None:
        return _compare(value, ref, what)
    r = h / hr
    if 0.8 <= r <= 1.25:
        return f"as {what} {_fmt(ref)}"
    ref_words = f"{what} {_fmt(ref)}'s ({hr:.3g} steps)"
    return f"a horizon {_times(r)} longer than {ref_words}" if r > 1 else \
        f"a horizon {_times(1 / r)} shorter than {ref_words}"


def _times(r: float) -> str:
    return f"{r:.0f}x" if r >= 10 else f"{r:.2g}x"


@dataclass
class RunSettings:
    """The knobs found for one run (possibly none)."""

    framework: str | None
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, knob: str) -> Setting | None:
        return self.settings.get(knob)

    def value(self, knob: str) -> float | None:
        s = self.settings.get(knob)
        return None if s is None else s.value

    def off_reference(self, factor: float) -> list[Setting]:
        """The settings read from the run that are far from their reference (:meth:`Setting.off`)."""
        return [s for s in self.settings.values() if s.off(factor)]

    def at_framework_defaults(self, required: Sequence[str], factor: float) -> list[Setting] | None:
        """Every setting read from the run, when ``required`` are among them and none is ``factor`` or
        more off its framework's default (the healthy runs' median is not asked: the question is
        whether the run is the framework's own reference configuration); None otherwise, and when a
        setting read has no framework default to compare with."""
        if any(k not in self.settings for k in required):
            return None
        out = list(self.settings.values())
        if any(s.default is None or replace(s, healthy=None, healthy_n=0).off(factor) for s in out):
            return None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"framework": self.framework, "settings": {k: s.to_dict() for k, s in sorted(self.settings.items())}}


def normalise_framework(name: str | None) -> str | None:
    if not name:
        return None
    n = str(name).strip().lower().replace("_", "-")
    if n in ("sb3", "stable-baselines", "stable-baselines3"):
        return "stable-baselines3"
    return n if n in FRAMEWORK_KEYS else None


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _find(params: Mapping[str, Any], keys: Sequence[str], suffix: bool) -> tuple[str, float] | None:
    for k in keys:
        if k in params and _number(params[k]) is not None:
            return k, float(_number(params[k]))  # type: ignore[arg-type]
    if suffix:
        by_last: dict[str, str] = {}
        for full in sorted(params):
            by_last.setdefault(full.rsplit(".", 1)[-1], full)
        for k in keys:
            full = by_last.get(k)
            if full is not None and _number(params[full]) is not None:
                return full, float(_number(params[full]))  # type: ignore[arg-type]
    return None


def read_settings(params: Mapping[str, Any] | None, framework: str | None = None,
                  curves: Mapping[str, Curve] | None = None,
                  healthy_params: Mapping[str, Sequence[float]] | None = None) -> RunSettings:
    """The run's knobs from its (flattened) hyperparameters, else from the series it logged them as.

    ``healthy_params``: knob -> values of the task's healthy runs (from its baseline).
    """
    fw = normalise_framework(framework)
    params = dict(params or {})
    out = RunSettings(fw)
    for knob in KNOBS:
        found = None
        if fw is not None and knob in FRAMEWORK_KEYS[fw]:
            found = _find(params, FRAMEWORK_KEYS[fw][knob], suffix=False)
        if found is None:
            found = _find(params, GENERIC_KEYS[knob], suffix=True)
        source = key = None
        if found is not None:
            source, value, key = f"hyperparameter '{found[0]}'", found[1], found[0]
        elif curves is not None and KNOB_SERIES.get(knob) in curves:
            c = curves[KNOB_SERIES[knob]]
            v = c.values[np.isfinite(c.values)] if len(c) else np.zeros(0)
            if knob == "learning_rate":
                v = v[v > 0]             # a warm-up's first steps log 0: no rate the run trains at
            if v.size:
                source, value = f"logged series '{KNOB_SERIES[knob]}'", float(np.median(v))
        if source is None:
            continue
        default = FRAMEWORK_DEFAULTS.get(fw or "", {}).get(knob)
        hv = [float(x) for x in (healthy_params or {}).get(knob, []) if _number(x) is not None]
        out.settings[knob] = Setting(knob, value, source, default, DEFAULT_SOURCES.get(fw or "") if default is not None
                                     else None, fw, float(np.median(hv)) if hv else None, len(hv), key)
    return out


def settings_for_baseline(runs_params: Sequence[Mapping[str, Any]], framework: str | None = None
                          ) -> dict[str, list[float]]:
    """knob -> the values found in each healthy run's hyperparameters (for a task baseline)."""
    out: dict[str, list[float]] = {}
    for params in runs_params:
        rs = read_settings(params, framework)
        for knob, s in rs.settings.items():
            out.setdefault(knob, []).append(s.value)
    return out
