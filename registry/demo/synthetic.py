"""Seeded generator of realistic RL training runs as canonical curves, with known anomalies.

PPO on classic-control-like tasks (episode return rising along a sigmoid learning curve,
capped like CartPole's 500, or negative like Pendulum's), GRPO on LLM-like tasks (sequence
reward = accuracy + format, group reward std, KL to the reference growing slowly, token
entropy declining gently, response length, grad norm with noise). Any one anomaly can be
injected at a known step; the labels say which and where::

    from registry.demo.synthetic import generate_run
    run = generate_run("entropy_collapse", seed=3, algorithm="grpo", n_steps=2000)
    run.curves["entropy"]          # Curve(steps, values)
    run.labels[0].kind, run.labels[0].start
    run.outcome.verdict            # success / failed / diverged / inconclusive
    run.metric_infos()             # MetricInfo per metric, the synthetic task's ranges applied

Everything is a pure function of the arguments (numpy's PCG64 seeded per run), vectorised.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from registry.analysis.diagnosis.types import Curve, MetricInfo
from registry.demo.anomalies import ANOMALY_KINDS, inject_anomaly, lognormal
from registry.analysis.diagnosis.fixtures import default_metric_infos

ALGORITHMS = ("grpo", "ppo")
KINDS = ("healthy",) + ANOMALY_KINDS
#: Algorithms an anomaly can be injected into (GRPO has no critic; PPO has no responses).
KIND_ALGORITHMS: dict[str, tuple[str, ...]] = {k: ALGORITHMS for k in KINDS}
KIND_ALGORITHMS["length_hacking"] = ("grpo",)
KIND_ALGORITHMS["value_loss_flat"] = ("ppo",)

#: Synthetic tasks: name -> (algorithm, reward metric, (low, high) of the reward).
TASKS: dict[str, tuple[str, str, tuple[float, float]]] = {
    "synthetic-cartpole": ("ppo", "episode_return_mean", (0.0, 500.0)),
    "synthetic-pendulum": ("ppo", "episode_return_mean", (-1600.0, 0.0)),
    "synthetic-acrobot": ("ppo", "episode_return_mean", (-500.0, 0.0)),
    "synthetic-math": ("grpo", "reward_sequence_mean", (0.0, 1.0)),
    "synthetic-code": ("grpo", "reward_sequence_mean", (0.0, 1.0)),
}
#: Filler metrics (dictionary names) added by ``n_extra_metrics`` for load tests.
EXTRA_METRICS = (
    "response_length_max", "response_length_min", "prompt_length_mean", "total_length_mean",
    "response_truncation_rate", "throughput_tokens_per_s_per_gpu", "timing_generation_s", "timing_step_s",
    "importance_ratio_mean", "importance_ratio_var", "value_mean", "value_max", "value_min",
    "advantage_max", "advantage_min", "kl_ref_std", "reward_sequence_max", "reward_sequence_min",
    "entropy_seq_sum", "critic_grad_norm", "logprob_mismatch_abs_mean", "tokens_seen_total",
    "reward_zero_std_fraction", "eos_token_count", "num_turns_mean",
)


@dataclass(frozen=True)
class AnomalyLabel:
    kind: str
    start: int                 # first affected step
    metrics: tuple[str, ...]   # metrics the injection touched
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "metrics": list(self.metrics), "detail": dict(self.detail)}


@dataclass(frozen=True)
class Outcome:
    verdict: str               # success / failed / diverged / inconclusive
    final_score: float         # final reward (median of the last 5% of points)
    normalized_score: float    # final score within the task's reward range (0..1)
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "final_score": self.final_score,
                "normalized_score": self.normalized_score, "reason": self.reason}


@dataclass
class SyntheticRun:
    kind: str
    seed: int
    algorithm: str
    task: str
    curves: dict[str, Curve]
    labels: list[AnomalyLabel]
    outcome: Outcome
    params: dict[str, Any]
    task_ranges: dict[str, tuple[float, float]]
    checkpoints: list[int]

    @property
    def reward_metric(self) -> str:
        return TASKS[self.task][1]

    @property
    def n_steps(self) -> int:
        return len(next(iter(self.curves.values())))

    def metric_infos(self, base: Mapping[str, MetricInfo] | None = None) -> dict[str, MetricInfo]:
        """``base`` (default: the shipped dictionary) with this task's ranges applied."""
        if base is None:
            base = default_metric_infos()
        out = dict(base)
        for name, (lo, hi) in self.task_ranges.items():
            b = out.get(name) or MetricInfo(name=name, layer="objective", higher_is_better=True)
            out[name] = MetricInfo(name, b.layer, lo, hi, b.smoothing_window, b.higher_is_better)
        return out


# ---------------------------------------------------------------------------------------
def _rng(kind: str, seed: int, algorithm: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(kind.encode()), zlib.crc32(algorithm.encode())])


def _learning_curve(u: np.ndarray, mid: float, width: float) -> np.ndarray:
    s = 1.0 / (1.0 + np.exp(-(u - mid) / width))
    s0, s1 = 1.0 / (1.0 + np.exp(mid / width)), 1.0 / (1.0 + np.exp(-(1 - mid) / width))
    return (s - s0) / (s1 - s0)


def _grpo(rng: np.random.Generator, u: np.ndarray, p: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    n = u.size
    a0, a1 = rng.uniform(0.05, 0.3), rng.uniform(0.55, 0.85)
    f0, f1 = rng.uniform(0.3, 0.7), rng.uniform(0.9, 0.99)
    sr = rng.uniform(0.012, 0.03)
    acc_true = a0 + (a1 - a0) * p
    acc = np.clip(acc_true + rng.normal(0, sr, n), 0, 1)
    fmt = np.clip(f1 - (f1 - f0) * np.exp(-u / rng.uniform(0.03, 0.1)) + rng.normal(0, 0.01, n), 0, 1)
    c: dict[str, np.ndarray] = {}
    c["reward_accuracy_mean"] = acc
    c["reward_format_mean"] = fmt
    c["reward_sequence_mean"] = 0.8 * acc + 0.2 * fmt
    group_std = np.sqrt(acc_true * (1 - acc_true)) * rng.uniform(0.7, 0.9)
    c["reward_std"] = np.clip(group_std + rng.normal(0, 0.01, n), 0, None)
    c["advantage_std"] = np.clip(rng.uniform(0.75, 0.9) - 0.1 * p + rng.normal(0, 0.01, n), 0, None)
    c["advantage_mean"] = rng.normal(0, 0.005, n)
    k_end = rng.uniform(0.005, 0.03)
    kl = k_end * (1 - np.exp(-u / rng.uniform(0.2, 0.5))) / (1 - np.exp(-1 / 0.35)) + 1e-5
    c["kl_ref_mean"] = kl * lognormal(rng, n, 0.15)
    c["kl_ref_max"] = c["kl_ref_mean"] * rng.uniform(4, 8) * lognormal(rng, n, 0.2)
    c["kl_old_mean"] = rng.uniform(0.001, 0.004) * lognormal(rng, n, 0.25)
    c["clip_fraction"] = np.clip(rng.uniform(0.07, 0.15) * (1 - 0.2 * u) * lognormal(rng, n, 0.2), 0, 1)
    e0 = rng.uniform(0.6, 2.0)
    c["entropy"] = e0 * (1 - rng.uniform(0.2, 0.5) * u ** rng.uniform(0.7, 1.5)) * (1 + rng.normal(0, 0.02, n))
    c["policy_loss"] = rng.uniform(-0.01, 0.01) + rng.normal(0, rng.uniform(0.005, 0.02), n)
    L0 = rng.uniform(150, 800)
    c["response_length_mean"] = L0 * (1 + rng.uniform(-0.1, 0.3) * p) * (1 + rng.normal(0, 0.03, n))
    c["grad_norm"] = rng.uniform(0.2, 2.0) * (1 - 0.3 * u) * lognormal(rng, n, rng.uniform(0.1, 0.25))
    lr0 = rng.uniform(1e-7, 5e-6)
    warm = np.clip(u / 0.03, 0, 1)
    c["learning_rate"] = lr0 * warm * (1.0 if rng.random() < 0.5 else 0.55 + 0.45 * np.cos(np.pi * u))
    c["total_loss"] = c["policy_loss"] + 0.01 * c["kl_ref_mean"]
    return c, {"lr": lr0, "acc_start": a0, "acc_end": a1, "entropy_start": e0, "length_start": L0}


def _ppo(rng: np.random.Generator, u: np.ndarray, p: np.ndarray, task: str
         ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    n = u.size
    lo, hi = TASKS[task][2]
    c: dict[str, np.ndarray] = {}
    if task == "synthetic-cartpole":
        r0 = rng.uniform(18, 30)
        pp = np.clip(p * rng.uniform(1.02, 1.08), 0, 1)
        ret = r0 + (hi - r0) * pp + rng.normal(0, 3, n) * (1 - pp)
        ret = np.where(pp >= 1, hi, np.clip(ret, 8, hi))
        spread = (ret - r0 + 12) * (hi - ret) / 250.0 * rng.uniform(0.8, 1.2)
        std = np.clip(spread + rng.normal(0, 1, n) * (ret < hi), 0, None)
        std = np.where(ret >= hi, 0.0, std)
        length = ret.copy()
        v0 = rng.uniform(30, 80)
    else:
        r0 = rng.uniform(0.85, 0.95) * lo if task == "synthetic-pendulum" else rng.uniform(0.95, 1.0) * lo
        r1 = rng.uniform(0.08, 0.18) * lo
        noise = 0.02 * abs(lo)
        ret = r0 + (r1 - r0) * p + rng.normal(0, noise, n) * (1 - 0.5 * p)
        std = np.clip(abs(lo) * (0.18 - 0.1 * p) + rng.normal(0, 0.01 * abs(lo), n), 0, None)
        length = np.full(n, 200.0) if task == "synthetic-pendulum" else np.clip(-ret + rng.normal(0, 3, n), 60, 500)
        v0 = rng.uniform(0.5, 1.5) * (abs(lo) ** 2) / 300.0
    c["episode_return_mean"] = ret
    c["episode_return_std"] = std
    c["episode_length_mean"] = length
    c["kl_old_mean"] = rng.uniform(0.004, 0.015) * lognormal(rng, n, 0.25)
    c["clip_fraction"] = np.clip(rng.uniform(0.06, 0.15) * (1 - 0.3 * u) * lognormal(rng, n, 0.2), 0, 1)
    e0 = rng.uniform(0.6, 1.5)
    c["entropy"] = e0 * (1 - rng.uniform(0.2, 0.6) * u ** rng.uniform(0.7, 1.3)) * (1 + rng.normal(0, 0.01, n))
    c["policy_loss"] = -rng.uniform(0.005, 0.02) * (1 - 0.7 * u) + rng.normal(0, 0.003, n)
    floor, tau = rng.uniform(0.02, 0.15), rng.uniform(0.05, 0.2)
    c["value_loss"] = v0 * (floor + (1 - floor) * np.exp(-u / tau)) * lognormal(rng, n, 0.3)
    ev_end = rng.uniform(0.7, 0.95)
    c["explained_variance"] = np.clip(ev_end * (1 - np.exp(-u / tau)) + rng.normal(0, 0.05, n), -1, 1)
    adv_scale = rng.uniform(0.5, 5.0)
    c["advantage_std"] = adv_scale * (1 + rng.normal(0, 0.05, n))
    c["advantage_mean"] = rng.normal(0, 0.03 * adv_scale, n)
    c["grad_norm"] = rng.uniform(0.2, 1.0) * lognormal(rng, n, rng.uniform(0.1, 0.2))
    lr0 = rng.choice([3e-4, 1e-4, 1e-3])
    c["learning_rate"] = np.full(n, lr0) * (1.0 if rng.random() < 0.6 else (1 - 0.9 * u))
    c["total_loss"] = c["policy_loss"] + 0.5 * c["value_loss"]
    return c, {"lr": float(lr0), "return_start": float(r0), "value_loss_start": float(v0), "entropy_start": e0}


def generate_run(kind: str = "healthy", seed: int = 0, algorithm: str | None = None, n_steps: int | None = None,
                 step_stride: int | None = None, task: str | None = None, anomaly_at: float | None = None,
                 n_extra_metrics: int = 0) -> SyntheticRun:
    """One synthetic run.

    ``kind``: "healthy" or one of :data:`ANOMALY_KINDS`. ``algorithm`` "grpo" or "ppo"
    (default: drawn among those the kind supports). ``n_steps``: logged points (default
    log-uniform in 200..20000). ``step_stride``: step units per logged point (default drawn:
    1-10 for GRPO optimizer steps, 1/128/2048 for PPO environment steps). ``anomaly_at``:
    fraction of the run where the anomaly starts (default uniform in 0.25..0.6).
    ``n_extra_metrics`` adds noise-only filler metrics (for load tests).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    rng0 = _rng(kind, seed, algorithm or "")
    if algorithm is None:
        algorithm = str(rng0.choice(KIND_ALGORITHMS[kind]))
    if algorithm not in KIND_ALGORITHMS[kind]:
        raise ValueError(f"{kind} cannot be injected into {algorithm} (supported: {', '.join(KIND_ALGORITHMS[kind])})")
    rng = _rng(kind, seed, algorithm)
    if task is None:
        task = str(rng.choice([t for t, v in TASKS.items() if v[0] == algorithm]))
    if TASKS[task][0] != algorithm:
        raise ValueError(f"task {task} is a {TASKS[task][0]} task, not {algorithm}")
    if n_steps is None:
        n_steps = int(round(np.exp(rng.uniform(np.log(200), np.log(20000)))))
    n = int(n_steps)
    if n < 20:
        raise ValueError("n_steps must be at least 20")
    if step_stride is None:
        step_stride = int(rng.choice([1, 1, 2, 5, 10] if algorithm == "grpo" else [1, 128, 2048]))
    steps = (np.arange(n, dtype=np.int64) + 1) * int(step_stride)
    u = np.linspace(0.0, 1.0, n)
    mid, width = rng.uniform(0.2, 0.45), rng.uniform(0.04, 0.1)
    p = _learning_curve(u, mid, width)
    if kind == "stagnant":
        p = p * rng.uniform(0.0, 0.06)
    reward, rrange = TASKS[task][1], TASKS[task][2]
    if algorithm == "grpo":
        c, params = _grpo(rng, u, p)
    else:
        c, params = _ppo(rng, u, p, task)
    task_ranges = {reward: rrange}
    if algorithm == "grpo":
        task_ranges.update({"reward_accuracy_mean": (0.0, 1.0), "reward_format_mean": (0.0, 1.0)})
    else:
        task_ranges["episode_length_mean"] = (0.0, 500.0)
    base = default_metric_infos()
    ranges = {k: (v.healthy_low, v.healthy_high) for k, v in base.items()}
    labels: list[AnomalyLabel] = []
    if kind != "healthy":
        frac = rng.uniform(0.25, 0.6) if anomaly_at is None else float(anomaly_at)
        if kind == "value_loss_flat" and anomaly_at is None:
            frac = rng.uniform(0.0, 0.05)
        if kind == "stagnant":
            frac = 0.0
        t = int(min(n - 10, max(0, round(frac * (n - 1)))))
        t, touched, detail = inject_anomaly(kind, rng, c, t, algorithm, reward, rrange, ranges)
        labels.append(AnomalyLabel(kind, int(steps[t]), touched or (reward,), detail))
    for i, name in enumerate(EXTRA_METRICS[: max(0, n_extra_metrics)]):
        c[name] = rng.uniform(0.5, 5) * (1 + 0.1 * u) * lognormal(rng, n, 0.1)
    for i in range(len(EXTRA_METRICS), n_extra_metrics):
        c[f"extra_metric_{i}"] = rng.uniform(0.5, 5) * lognormal(rng, n, 0.1)
    curves = {k: Curve(steps, v) for k, v in c.items()}
    params.update({"mid": float(mid), "width": float(width), "n_steps": n, "step_stride": int(step_stride)})
    outcome = run_outcome(curves, reward, rrange)
    checkpoints = [int(steps[int(i)]) for i in np.linspace(0, n - 1, 11)[1:].round()]
    return SyntheticRun(kind, int(seed), algorithm, task, curves, labels, outcome, params, task_ranges, checkpoints)


def run_outcome(curves: Mapping[str, Curve], reward_metric: str, reward_range: tuple[float, float],
                kl_metrics: tuple[str, ...] = ("kl_old_mean", "kl_ref_mean")) -> Outcome:
    """Final verdict read off the curves (not from the injected kind).

    * diverged: non-finite values in the last 10% of any curve, or a KL whose late median
      is over 10x its early median while the reward lost at least 30% of its range from peak;
    * success: final reward at >= 70% of the task range;
    * failed: final reward below 30% of the range, or 30% of the range below its peak;
    * inconclusive otherwise.
    """
    lo, hi = reward_range
    width = max(hi - lo, 1e-12)
    for name, cv in curves.items():
        v = cv.values
        if v.size and not np.isfinite(v[int(0.9 * v.size):]).all():
            r = curves.get(reward_metric)
            fin = r.values[np.isfinite(r.values)] if r is not None else np.zeros(0)
            score = float(np.median(fin[-max(3, fin.size // 20):])) if fin.size else float("nan")
            return Outcome("diverged", score, (score - lo) / width, f"{name} is non-finite at the end")
    r = curves[reward_metric].values
    r = r[np.isfinite(r)]
    k = max(3, r.size // 20)
    final = float(np.median(r[-k:]))
    norm = (final - lo) / width
    peak = float(np.quantile(r, 0.95))
    lost = (peak - final) / width
    for m in kl_metrics:
        cv = curves.get(m)
        if cv is None:
            continue
        kv = cv.values[np.isfinite(cv.values)]
        if kv.size >= 10:
            e, late = float(np.median(kv[: kv.size // 10])), float(np.median(kv[-kv.size // 10:]))
            if late > 10 * max(e, 1e-12) and lost >= 0.3:
                return Outcome("diverged", final, norm,
                               f"{m} grew {late / max(e, 1e-12):.0f}x and the reward collapsed")
    if norm >= 0.7:
        return Outcome("success", final, norm, f"final reward {final:.4g} at {norm:.0%} of the task range")
    if lost >= 0.3:
        return Outcome("failed", final, norm, f"reward fell {lost:.0%} of the range below its peak")
    if norm < 0.3:
        return Outcome("failed", final, norm, f"final reward {final:.4g} at only {norm:.0%} of the task range")
    return Outcome("inconclusive", final, norm, f"final reward {final:.4g} at {norm:.0%} of the task range")


def generate_suite(per_kind: int = 20, seed: int = 0, kinds: tuple[str, ...] = KINDS,
                   n_healthy: int | None = None) -> list[SyntheticRun]:
    """``per_kind`` runs of each kind (``n_healthy`` healthy ones), seeds seed..seed+k-1."""
    out = []
    for kind in kinds:
        k = n_healthy if (kind == "healthy" and n_healthy is not None) else per_kind
        out.extend(generate_run(kind, seed + i) for i in range(k))
    return out
