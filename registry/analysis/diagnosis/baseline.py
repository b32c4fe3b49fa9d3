"""Health baselines: what a metric looks like early, mid and late in training in healthy runs.

Phase rule (documented, and recorded in every profile as ``rule``):

* **early** = a run's first ``min(early_points, ceil(early_frac * n))`` logged points (at
  least 3), where n is the run's number of logged steps. With the defaults that is the
  first 150 points of a long run (the "first 100-200 steps" of an LLM run logged every
  step) and the first ~15% of a short one (8 of SB3's 48-49 rollouts).
* **mid** = the points between ``mid_frac[0]`` and ``mid_frac[1]`` of the run (35%-65%).
* **late** = the points from ``late_frac`` of the run to its end (the last 15%): where the
  healthy runs ended. A run compared there has trained as far as they did; a run still
  training is not compared there yet.

Each healthy run's phase boundaries are turned into steps, and the profile keeps the
median boundary over runs, so a run being checked (possibly still training) is compared
phase by phase on the step axis. The band per metric and phase is the ``quantiles``
(5%-95%) of all healthy runs' finite values in that phase, pooled.

Everything is pure: :func:`build_baseline` reads curves and returns a profile;
``to_dict``/``from_dict`` give a JSON form the store keeps in a table and a user may edit
(``warning`` texts in particular).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from registry.analysis.diagnosis.episodes import with_windowed_episode_means
from registry.analysis.diagnosis.signal import noise_sigma
from registry.analysis.diagnosis.types import Curve

PROFILE_FORMAT = "rlregistry-baseline"
PROFILE_VERSION = 1
#: The phases a profile learns a band for, in training order (profiles stored before the late
#: phase existed read back without it).
PHASES = ("early", "mid", "late")

#: Quantities (the definition's ``quantity``) that are settings, schedules, counters or
#: throughput, not health: a baseline never learns a band for them.
NON_HEALTH_QUANTITIES = frozenset({"coefficient", "learning_rate", "throughput", "time", "count"})
#: The same by name, for metrics whose definition is not at hand.
NON_HEALTH_NAMES = frozenset({"clip_range", "kl_coef", "entropy_coef", "learning_rate", "critic_learning_rate",
                              "throughput_steps_per_s", "throughput_tokens_per_s_per_gpu",
                              "throughput_episodes_per_s", "timing_generation_s", "timing_step_s",
                              "tokens_seen_total", "episodes_seen_total", "update_epochs_total"})
#: Fewer healthy runs than this make a weak baseline: it is labelled so everywhere and its
#: deviations are information, not problems.
MIN_HEALTHY_RUNS = 3


def is_health_metric(name: str, info: Any = None) -> bool:
    """Whether a metric describes the run's health (not a setting, schedule, counter or throughput)."""
    quantity = getattr(info, "quantity", None) if info is not None else None
    if quantity is not None:
        return quantity not in NON_HEALTH_QUANTITIES
    return name not in NON_HEALTH_NAMES and not name.startswith(("throughput_", "timing_"))


def baseline_strength(profile: "BaselineProfile") -> str:
    """``baseline of n=4 healthy runs`` or ``weak baseline (n=1)``."""
    if profile.n_runs < MIN_HEALTHY_RUNS:
        return f"weak baseline (n={profile.n_runs})"
    return f"baseline of n={profile.n_runs} healthy runs"


#: Text per metric family used to write each metric's warning signal; the first matching
#: key wins, so specific families (response vs episode length) come before general ones.
_HINTS = (
    ("response_length", "responses are longer than in healthy runs (verbosity / hacking?)",
     "responses are shorter than in healthy runs"),
    ("episode_length", "episodes last longer than in healthy runs", "episodes end sooner than in healthy runs"),
    ("kl", "the policy moves further per update than in healthy runs (update too large?)",
     "the policy barely moves compared with healthy runs (update too small?)"),
    ("clip", "more samples are clipped than in healthy runs (update too large)",
     "fewer samples are clipped than in healthy runs (update too conservative)"),
    ("entropy", "the policy explores more than healthy runs did",
     "the policy is more deterministic than healthy runs were (collapse?)"),
    ("reward", "the reward is higher than in healthy runs",
     "the reward is lower than in healthy runs at this stage (learning slower)"),
    ("return", "the return is higher than in healthy runs",
     "the return is lower than in healthy runs at this stage (learning slower)"),
    ("length", "the length is larger than in healthy runs", "the length is smaller than in healthy runs"),
    ("grad_norm", "gradients are larger than in healthy runs (instability?)",
     "gradients are smaller than in healthy runs"),
    ("value_loss", "the critic fits worse than in healthy runs", "the value loss is lower than in healthy runs"),
    ("std", "the spread is larger than in healthy runs",
     "the spread is smaller than in healthy runs (less learning signal)"),
    ("loss", "the loss is higher than in healthy runs", "the loss is lower than in healthy runs"),
)


def _hint(metric: str, above: bool) -> str:
    for key, hi, lo in _HINTS:
        if key in metric:
            return hi if above else lo
    return "outside the range seen in healthy runs"


@dataclass
class PhaseBand:
    low: float
    high: float
    median: float
    n_points: int
    #: The healthy runs' point-to-point logging noise in this phase (median over runs): the
    #: floor of the band's width when a deviation is measured in band widths.
    noise: float = 0.0
    #: The mean of the phase's points (None: a band stored before it was kept). A batch mean over a
    #: few completions takes values on a grid (eighths, sixteenths), where a median jumps a whole
    #: grid step; their mean is the level.
    mean: float | None = None
    #: The lowest and highest of the healthy runs' own means in this phase (None: stored before they
    #: were kept): how far apart healthy runs sit, for a metric read as a mean (``ranges.MEAN_READ``).
    run_mean_low: float | None = None
    run_mean_high: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "median": self.median, "n_points": self.n_points,
                "noise": self.noise, "mean": self.mean, "run_mean_low": self.run_mean_low,
                "run_mean_high": self.run_mean_high}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PhaseBand":
        def opt(key: str) -> float | None:
            return float(d[key]) if d.get(key) is not None else None
        return cls(float(d["low"]), float(d["high"]), float(d["median"]), int(d.get("n_points", 0)),
                   float(d.get("noise") or 0.0), opt("mean"), opt("run_mean_low"), opt("run_mean_high"))


@dataclass
class MetricBaseline:
    metric: str
    early: PhaseBand | None
    mid: PhaseBand | None
    n_runs: int
    warning: str = ""
    late: PhaseBand | None = None

    def band(self, phase: str) -> PhaseBand | None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}; got {phase!r}")
        return getattr(self, phase)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, **{p: b.to_dict() if (b := self.band(p)) else None for p in PHASES},
                "n_runs": self.n_runs, "warning": self.warning}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MetricBaseline":
        bands = {p: PhaseBand.from_dict(d[p]) if d.get(p) else None for p in PHASES}
        return cls(str(d["metric"]), bands["early"], bands["mid"], int(d.get("n_runs", 0)),
                   str(d.get("warning") or ""), bands["late"])


@dataclass
class BaselineProfile:
    """Per-metric healthy bands for one task, learned from runs marked healthy."""

    task: str
    metrics: dict[str, MetricBaseline]
    early_end_step: int
    mid_start_step: int
    mid_end_step: int
    n_runs: int
    rule: dict[str, Any] = field(default_factory=dict)
    #: knob -> the healthy runs' values of that hyper-parameter (see registry.analysis.diagnosis.hyperparams).
    hyperparams: dict[str, list[float]] = field(default_factory=dict)
    #: First step of the late phase (None: a profile stored before the late phase existed).
    late_start_step: int | None = None

    @property
    def weak(self) -> bool:
        return self.n_runs < MIN_HEALTHY_RUNS

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "task": self.task, "n_runs": self.n_runs,
                "early_end_step": self.early_end_step, "mid_start_step": self.mid_start_step,
                "mid_end_step": self.mid_end_step, "late_start_step": self.late_start_step, "rule": dict(self.rule),
                "metrics": {k: v.to_dict() for k, v in sorted(self.metrics.items())},
                "hyperparams": {k: list(v) for k, v in sorted(self.hyperparams.items())},
                "strength": baseline_strength(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BaselineProfile":
        if d.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
            raise ValueError(f"not a baseline profile (format {d.get('format')!r})")
        return cls(task=str(d["task"]), metrics={k: MetricBaseline.from_dict(v) for k, v in d["metrics"].items()},
                   early_end_step=int(d["early_end_step"]), mid_start_step=int(d["mid_start_step"]),
                   mid_end_step=int(d["mid_end_step"]), n_runs=int(d.get("n_runs", 0)), rule=dict(d.get("rule") or {}),
                   hyperparams={k: [float(x) for x in v] for k, v in (d.get("hyperparams") or {}).items()},
                   late_start_step=int(d["late_start_step"]) if d.get("late_start_step") is not None else None)

    def phase_bounds(self, phase: str) -> tuple[int, int] | None:
        """The phase's (first, last) step; None for a late phase the profile does not have."""
        if phase == "early":
            return -2**62, self.early_end_step
        if phase == "mid":
            return self.mid_start_step, self.mid_end_step
        return None if self.late_start_step is None else (self.late_start_step, 2**62)


def _run_steps(run: Mapping[str, Curve]) -> np.ndarray:
    arrs = [np.asarray(c.steps) for c in run.values() if len(c)]
    return np.unique(np.concatenate(arrs)) if arrs else np.zeros(0, np.int64)


def build_baseline(task: str, runs: Sequence[Mapping[str, Curve]], *, early_points: int = 150,
                   early_frac: float = 0.15, mid_frac: tuple[float, float] = (0.35, 0.65), late_frac: float = 0.85,
                   quantiles: tuple[float, float] = (0.05, 0.95), infos: Mapping[str, Any] | None = None,
                   hyperparams: Mapping[str, Sequence[float]] | None = None) -> BaselineProfile:
    """Learn per canonical *health* metric the early, mid and late bands from healthy ``runs``.

    ``infos`` (name -> MetricInfo) tells settings, schedules, counters and throughput apart
    from health metrics (by the definition's quantity; by name without it): those get no band.
    ``hyperparams`` (knob -> the runs' values) is kept in the profile for cause ranking.
    Fewer than :data:`MIN_HEALTHY_RUNS` runs give a weak baseline (``profile.weak``).
    A run that logs its return once per episode only gets the windowed mean the diagnosis judges
    by (:mod:`.episodes`), so its band exists for the runs diagnosed against it.
    """
    runs = [with_windowed_episode_means(run)[0] for run in runs]
    bounds = []
    for run in runs:
        steps = _run_steps(run)
        n = steps.size
        if n < 3:
            continue
        e = int(min(n, max(3, min(early_points, int(np.ceil(early_frac * n))))))
        m0 = int(min(n - 1, max(e, int(np.floor(mid_frac[0] * n)))))
        m1 = int(min(n - 1, max(m0, int(np.ceil(mid_frac[1] * n)) - 1)))
        l0 = int(min(n - 1, max(m1 + 1, int(np.floor(late_frac * n)))))
        bounds.append((int(steps[e - 1]), int(steps[m0]), int(steps[m1]), int(steps[l0])))
    if not bounds:
        raise ValueError("build_baseline needs at least one run with 3 or more logged steps")
    b = np.median(np.asarray(bounds, dtype=np.float64), axis=0)
    early_end, mid_start, mid_end, late_start = int(b[0]), int(b[1]), int(b[2]), int(b[3])
    names = sorted({k for run in runs for k in run if is_health_metric(k, (infos or {}).get(k))})
    metrics: dict[str, MetricBaseline] = {}
    for name in names:
        bands: dict[str, PhaseBand | None] = {}
        used = 0
        for phase, (lo, hi) in (("early", (-2**62, early_end)), ("mid", (mid_start, mid_end)),
                                ("late", (late_start, 2**62))):
            chunks = []
            noises = []
            for run in runs:
                c = run.get(name)
                if c is None or not len(c):
                    continue
                sel = (c.steps >= lo) & (c.steps <= hi) & np.isfinite(c.values)
                if sel.any():
                    chunks.append(c.values[sel])
                    if sel.sum() >= 3:
                        noises.append(noise_sigma(c.values[sel]))
            if not chunks:
                bands[phase] = None
                continue
            used = max(used, len(chunks))
            v = np.concatenate(chunks)
            ql, qh = np.quantile(v, quantiles)
            run_means = [float(np.mean(c)) for c in chunks]
            bands[phase] = PhaseBand(float(ql), float(qh), float(np.median(v)), int(v.size),
                                     float(np.median(noises)) if noises else 0.0, float(np.mean(v)),
                                     min(run_means), max(run_means))
        if all(bands.get(p) is None for p in PHASES):
            continue
        warning = (f"{name} outside the band of {used} healthy {task} run(s): "
                   f"above means {_hint(name, True)}; below means {_hint(name, False)}")
        metrics[name] = MetricBaseline(name, bands.get("early"), bands.get("mid"), used, warning, bands.get("late"))
    rule = {"early_points": early_points, "early_frac": early_frac, "mid_frac": list(mid_frac),
            "late_frac": late_frac, "quantiles": list(quantiles),
            "text": f"early = first min({early_points}, {early_frac:.0%} of points) logged points; "
                    f"mid = {mid_frac[0]:.0%}-{mid_frac[1]:.0%} of the run; late = from {late_frac:.0%} of the run "
                    f"to its end; band = pooled {quantiles[0]:.0%}-{quantiles[1]:.0%} quantiles of healthy runs"}
    return BaselineProfile(task=task, metrics=metrics, early_end_step=early_end, mid_start_step=mid_start,
                           mid_end_step=mid_end, n_runs=len(bounds), rule=rule,
                           hyperparams={k: [float(x) for x in v] for k, v in (hyperparams or {}).items()},
                           late_start_step=late_start)
