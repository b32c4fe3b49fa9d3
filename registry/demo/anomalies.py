"""The anomalies the synthetic runs carry: each kind changes the healthy curves from a known step."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

ANOMALY_KINDS = (
    "kl_blowup", "entropy_collapse", "reward_std_zero", "length_hacking", "value_loss_flat",
    "grad_norm_spikes", "reward_zero", "nan", "clip_high", "clip_low", "policy_loss_growing",
    "advantage_mean_drift", "stagnant",
)


def lognormal(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    return np.exp(rng.normal(0.0, sigma, n) - 0.5 * sigma * sigma)


def ramp(n: int, t: int, power: float = 1.0) -> np.ndarray:
    """0 before index t, rising to 1 at the last index."""
    r = np.zeros(n)
    if t < n - 1:
        r[t:] = (np.arange(n - t) / (n - 1 - t)) ** power
    return r


def inject_anomaly(kind: str, rng: np.random.Generator, c: dict[str, np.ndarray], t: int, algorithm: str,
            reward: str, rrange: tuple[float, float], ranges: Mapping[str, tuple[float | None, float | None]]
            ) -> tuple[int, tuple[str, ...], dict[str, Any]]:
    """Modify curves ``c`` in place from index t on; return (start index, metrics, detail)."""
    n = next(iter(c.values())).size
    lo, hi = rrange
    touched: list[str] = []
    detail: dict[str, Any] = {}

    def below_ceiling(t: int) -> int:
        """The last index up to ``t`` where the reward was still below 60% of its range: a stall that
        shows has to happen before the task is solved (at its top a stalled reward is a solved task's)."""
        below = np.flatnonzero(c[reward][: t + 1] < lo + 0.6 * (hi - lo))
        return int(below[-1]) if below.size else t

    def freeze_reward(level: float | None = None, rel_noise: float = 1.0) -> None:
        y = c[reward]
        lvl = float(np.median(y[max(0, t - 5):t + 1])) if level is None else level
        noise = np.std(np.diff(y[: max(t, 3)])) / np.sqrt(2) * rel_noise
        y[t:] = lvl + rng.normal(0, noise, n - t)
        if algorithm == "ppo":
            std = c["episode_return_std"]
            std[t:] = max(float(np.median(std[max(0, t - 5):t + 1])), 0.02 * (hi - lo)) * lognormal(rng, n - t, 0.05)
        if algorithm == "grpo":
            acc = c["reward_accuracy_mean"]
            acc[t:] = np.clip((y[t:] - 0.2 * c["reward_format_mean"][t:]) / 0.8, 0, 1)
        touched.append(reward)

    if kind == "kl_blowup":
        variant = "spike" if rng.random() < 0.5 else "ramp"
        detail["variant"] = variant
        R = 1 if variant == "spike" else max(2, int(rng.uniform(0.05, 0.12) * n))
        shape = np.clip(ramp(n, t) * (n - 1 - t) / R, 0, 1) if variant == "ramp" else (np.arange(n) >= t).astype(float)
        for m in ("kl_old_mean", "kl_ref_mean", "kl_ref_max"):
            if m in c:
                high = ranges.get(m, (None, None))[1] or float(np.quantile(c[m], 0.99))
                level = float(np.median(c[m][max(0, t - 10):t + 1]))
                target = max(rng.uniform(8, 30) * level, rng.uniform(2, 6) * high)
                c[m] = c[m] * np.exp(np.log(target / max(level, 1e-12)) * shape)
                touched.append(m)
        cf = c["clip_fraction"]
        cf[t:] = np.clip(cf[t:] + (rng.uniform(0.35, 0.6) - cf[t:]) * np.clip(shape[t:] * 1.5, 0, 1), 0, 1)
        d = t + max(1, int(rng.uniform(0.01, 0.04) * n))
        if d < n - 2:
            e = c["entropy"]
            e[d:] *= rng.uniform(0.03, 0.3)
            y = c[reward]
            lvl = float(np.median(y[max(0, t - 5):t + 1]))
            y[d:] = lvl - (lvl - lo) * rng.uniform(0.5, 0.9) + rng.normal(0, 0.01 * (hi - lo), n - d)
            if algorithm == "grpo":
                c["reward_accuracy_mean"][d:] = np.clip((y[d:] - 0.2 * c["reward_format_mean"][d:]) / 0.8, 0, 1)
            touched += ["entropy", reward]
        c["grad_norm"][t:] *= rng.uniform(2, 5)
        touched += ["clip_fraction", "grad_norm"]
    elif kind == "entropy_collapse":
        # A control policy that commits once its task is solved is no failure: the collapse comes before.
        t = below_ceiling(t) if algorithm == "ppo" else t
        cl = max(1, int(rng.uniform(0.003, 0.015) * n))
        f = rng.uniform(0.05, 0.25)
        shape = np.clip(ramp(n, t) * (n - 1 - t) / cl, 0, 1)
        c["entropy"] *= np.exp(np.log(f) * shape)
        freeze_reward()
        std_m = "reward_std" if algorithm == "grpo" else "episode_return_std"
        c[std_m][t:] *= 0.6
        touched += ["entropy", std_m]
        detail["factor"] = f
    elif kind == "reward_std_zero":
        t = below_ceiling(t)
        level = float(np.median(c[reward][max(0, t - 5):t + 1]))
        freeze_reward(level, rel_noise=1.0)
        std_m = "reward_std" if algorithm == "grpo" else "episode_return_std"
        c[std_m][t:] = np.abs(rng.normal(0, 1e-4 * (hi - lo), n - t)) * (rng.random() < 0.5)
        if algorithm == "grpo":
            c["advantage_std"][t:] = 0.0
            c["advantage_mean"][t:] = 0.0
            touched += ["advantage_std", "advantage_mean"]
        touched.append(std_m)
    elif kind == "length_hacking":
        g = rng.uniform(1.2, 3.0)
        c["response_length_mean"] *= 1 + g * ramp(n, t, rng.uniform(0.8, 1.4))
        acc_t = float(np.median(c["reward_accuracy_mean"][max(0, t - 5):t + 1]))
        drift = rng.uniform(0.0, 0.1) * ramp(n, t)
        c["reward_accuracy_mean"][t:] = np.clip(acc_t - drift[t:] + rng.normal(0, 0.015, n - t), 0, 1)
        fmt = np.maximum(c["reward_format_mean"][t:], 0.97)
        c["reward_format_mean"][t:] = np.clip(fmt + rng.normal(0, 0.005, n - t), 0, 1)
        c[reward] = 0.8 * c["reward_accuracy_mean"] + 0.2 * c["reward_format_mean"]
        touched += ["response_length_mean", "reward_accuracy_mean", "reward_format_mean", reward]
        detail["growth"] = g
    elif kind == "value_loss_flat":
        # A critic that stops learning leaves the advantages noise and the return stalls below its ceiling
        # (a flat value loss beside a return at the task's top is a solved task's, not a failing critic's).
        t = below_ceiling(t)
        freeze_reward()
        v = c["value_loss"]
        lvl = float(v[0:max(1, t + 1)].mean()) * rng.uniform(0.85, 1.15)
        v[t:] = lvl * lognormal(rng, n - t, 0.3)
        c["explained_variance"][t:] = np.clip(rng.uniform(-0.1, 0.15) + rng.normal(0, 0.05, n - t), -1, 1)
        c["total_loss"] = c["policy_loss"] + 0.5 * v
        touched += ["value_loss", "explained_variance"]
    elif kind == "grad_norm_spikes":
        rate = rng.uniform(0.02, 0.06)
        hit = np.zeros(n, bool)
        hit[t:] = rng.random(n - t) < rate
        hit[t] = True
        g = c["grad_norm"]
        g[hit] *= rng.uniform(5, 50, int(hit.sum()))
        t = int(np.flatnonzero(hit)[0])
        touched.append("grad_norm")
        detail["rate"] = rate
    elif kind == "reward_zero":
        # On a task whose reward ceiling is 0 (Pendulum-like) a reward of 0 would read as
        # "solved": there the broken reward is a constant near the floor instead.
        variant = "zero" if rng.random() < 0.6 and hi > 0 else "constant"
        detail["variant"] = variant
        names = [reward] + ([m for m in ("reward_accuracy_mean", "reward_format_mean") if m in c])
        if variant == "zero":
            for m in names:
                c[m][t:] = 0.0
        else:
            level = float(np.median(c[reward][max(0, t - 5):t + 1]))
            const = level * rng.uniform(0.1, 0.6) if level > 0 else lo + rng.uniform(0.05, 0.3) * (hi - lo)
            c[reward][t:] = const
            for m in names[1:]:
                c[m][t:] = 0.0
        std_m = "reward_std" if algorithm == "grpo" else "episode_return_std"
        c[std_m][t:] = 0.0
        if algorithm == "grpo":
            c["advantage_std"][t:] = 0.0
            c["advantage_mean"][t:] = 0.0
        touched += names + [std_m]
    elif kind == "nan":
        variant = "divergence" if rng.random() < 0.5 else "sporadic"
        detail["variant"] = variant
        cands = [m for m in ("grad_norm", "policy_loss", "total_loss", "kl_old_mean", "entropy", "value_loss",
                             "kl_ref_mean", "advantage_mean") if m in c]
        if variant == "divergence":
            for m in cands:
                c[m][t:] = np.nan
                c[m][t] = np.inf if rng.random() < 0.3 else np.nan
            touched += cands
        else:
            k = int(rng.integers(3, 10))
            idx = np.sort(rng.choice(np.arange(t, n), size=min(k, n - t), replace=False))
            idx[0] = t
            for i in idx:
                m = cands[int(rng.integers(len(cands)))]
                c[m][i] = np.nan if rng.random() < 0.7 else np.inf
                touched.append(m)
    elif kind == "clip_high":
        cf = c["clip_fraction"]
        cf[t:] = np.clip(rng.uniform(0.35, 0.55) * lognormal(rng, n - t, 0.1), 0, 1)
        c["kl_old_mean"][t:] *= rng.uniform(2, 3)
        touched += ["clip_fraction", "kl_old_mean"]
    elif kind == "clip_low":
        # Updates too small hold back a run that still has something to learn: start where the reward was
        # below its ceiling (after it, a clip fraction near zero is a converged policy's, not a stall's).
        below = np.flatnonzero(c[reward][: t + 1] < lo + 0.6 * (hi - lo))
        t = int(below[-1]) if below.size else t
        c["clip_fraction"][t:] = np.clip(rng.uniform(0, 0.008) * lognormal(rng, n - t, 0.3), 0, 1)
        c["kl_old_mean"][t:] *= rng.uniform(1e-4, 1e-3)
        c["learning_rate"][t:] *= 1e-3
        e = c["entropy"]
        e[t:] = float(np.median(e[max(0, t - 5):t + 1])) * (1 + rng.normal(0, 0.005, n - t))
        freeze_reward()
        touched += ["clip_fraction", "kl_old_mean", "learning_rate", "entropy"]
    elif kind == "policy_loss_growing":
        pl = c["policy_loss"]
        scale = float(np.median(np.abs(pl[: max(t, 3)])) + np.std(pl[: max(t, 3)]))
        g = rng.uniform(10, 40)
        sign = 1.0 if rng.random() < 0.7 else -1.0
        delta = sign * g * scale * ramp(n, t, rng.uniform(1.0, 2.0))
        pl += delta
        c["total_loss"] = c["total_loss"] + delta
        touched.append("policy_loss")
        detail["growth"] = g
    elif kind == "advantage_mean_drift":
        lvl = float(np.median(c["advantage_std"]))
        d = rng.uniform(0.4, 1.2) * (1 if rng.random() < 0.5 else -1)
        c["advantage_mean"] += d * lvl * ramp(n, t)
        touched.append("advantage_mean")
        detail["drift"] = d
    elif kind == "stagnant":
        pass  # handled at generation (the learning curve barely rises)
    else:
        raise ValueError(f"unknown anomaly kind {kind!r}; expected one of {', '.join(ANOMALY_KINDS)}")
    return t, tuple(dict.fromkeys(touched)), detail
