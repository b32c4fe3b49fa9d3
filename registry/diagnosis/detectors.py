"""The detectors. Each takes a :class:`Context` and returns a list of findings.

Every threshold is read from ``ctx.s`` (:class:`DiagnosisSettings`) or from the metric's
healthy range (``ctx.range``); windows scale with the run's length (``ctx.persist``,
``ctx.window``), so a 48-point SB3 run and a 20,000-step GRPO run are judged alike.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from registry.diagnosis.context import Context
from registry.diagnosis.extra_detectors import EXTRA_DETECTORS
from registry.diagnosis.signal import (mad_sigma, merge_close, noise_sigma, rank_corr, rolling_median, runs,
                     shift, window_ends)
from registry.diagnosis.types import Finding

TINY = 1e-12


def _top(findings: list[Finding], ctx: Context, key: str) -> list[Finding]:
    """Keep the ``max_findings_per_metric`` findings with the largest ``evidence[key]``."""
    k = ctx.s.max_findings_per_metric
    if len(findings) <= k:
        return findings
    keep = sorted(findings, key=lambda f: -abs(f.evidence.get(key, 0.0)))[:k]
    return sorted(keep, key=lambda f: f.start)


# ---------------------------------------------------------------------------------------
# NaN / Inf
# ---------------------------------------------------------------------------------------
def detect_nonfinite(ctx: Context) -> list[Finding]:
    out = []
    for name, c in ctx.curves.items():
        if not len(c):
            continue
        bad = ~np.isfinite(c.values)
        n_bad = int(bad.sum())
        if not n_bad:
            continue
        idx = np.flatnonzero(bad)
        n_nan = int(np.isnan(c.values).sum())
        first, last = int(c.steps[idx[0]]), int(c.steps[idx[-1]])
        to_end = bool(bad[-1])
        sev = "critical" if n_bad >= ctx.s.nonfinite_critical_points else "warning"
        title = (f"{n_bad} non-finite value(s) ({n_nan} NaN, {n_bad - n_nan} Inf) from step {first}"
                 + (", still non-finite at the last step" if to_end else ""))
        out.append(ctx.finding(
            "nan_inf", name, first, last, sev, title,
            evidence={"n_nonfinite": n_bad, "n_nan": n_nan, "n_inf": n_bad - n_nan,
                      "fraction": n_bad / len(c), "first_step": first, "last_step": last,
                      "persists_to_end": float(to_end)},
            causes=["numerical overflow (fp16/bf16) after too large an update",
                    "division by a zero std when normalising advantages or rewards",
                    "log of zero probability (entropy/KL on a collapsed policy)",
                    "a NaN reward or a corrupt batch from the data pipeline"],
            check=["which metric turned non-finite first (grad_norm, loss, KL?)",
                   "grad_norm and KL just before the first non-finite step",
                   "reward/advantage std at that step (a zero std divides by zero)"],
            action="stop the run; resume from an earlier checkpoint with a lower learning rate, "
                   "gradient clipping, and an epsilon in every normalisation",
            detected_at=first))
    return out


# ---------------------------------------------------------------------------------------
# Reward: becomes zero or constant; sudden drop; flat (stagnant)
# ---------------------------------------------------------------------------------------
def detect_reward_zero(ctx: Context) -> list[Finding]:
    out = []
    for name in ctx.role("reward_family"):
        sr = ctx.series(name)
        n = sr.n
        M = ctx.persist(n)
        if n < M + 2:
            continue
        y = sr.y
        scale = float(np.quantile(np.abs(y), 0.9))
        if scale <= 0:
            continue
        tol = ctx.s.zero_rel_tol * scale
        found: list[Finding] = []
        zero = np.abs(y) <= tol
        for a, b in runs(zero, M):
            if a == 0:
                continue
            pre = y[max(0, a - M):a]
            if np.median(np.abs(pre)) <= tol:
                continue
            to_end = b == n - 1
            found.append(ctx.finding(
                "reward_zero", name, sr.step(a), sr.step_end(b), "critical" if to_end else "warning",
                f"reward dropped to zero from {float(np.median(pre)):.4g} and "
                + ("stays there" if to_end else f"stayed there for {b - a + 1} points"),
                evidence={"level_before": float(np.median(pre)), "level_after": float(np.median(y[a:b + 1])),
                          "points": (b - a + 1) * sr.bin_size, "persists_to_end": float(to_end)},
                causes=(["the reward function crashed or returns a default of 0",
                         "the environment or its reward wrapper changed (episodes end at once)"]
                        if ctx.run_kind == "control" else
                        ["the reward function crashed or returns a default of 0",
                         "the data pipeline feeds empty/truncated responses or wrong labels",
                         "a reward-model server stopped answering"]),
                check=["raw reward-function outputs for a batch at this step",
                       "reward components (accuracy/format) and response samples",
                       "logs of the reward service / dataset loader around this step"],
                action="fix the reward function or data pipeline before training further",
                detected_at=sr.step(min(a + M - 1, n - 1)),
                related=["reward_std", "advantage_std"]))
        const = np.concatenate([[False], np.abs(np.diff(y)) <= ctx.s.constant_rel_tol * scale])
        for a, b in runs(const, M):
            a0 = a - 1                               # first point of the constant stretch
            level = float(y[a])
            if a0 == 0 or abs(level) <= tol or ctx.reward_saturated(name, level):
                continue
            pre = y[max(0, a0 - M):a0]
            to_end = b == n - 1
            found.append(ctx.finding(
                "reward_zero", name, sr.step(a0), sr.step_end(b), "critical" if to_end else "warning",
                f"reward became exactly constant at {level:.4g} (below its ceiling) for {b - a0 + 1} points",
                evidence={"level_before": float(np.median(pre)), "constant_level": level,
                          "points": (b - a0 + 1) * sr.bin_size, "persists_to_end": float(to_end)},
                causes=["the reward function returns a fixed default (exception swallowed, format penalty only)",
                        "the same batch is replayed (data loader stuck)",
                        "metric logging is stale (the value is not recomputed)"],
                check=["raw reward-function outputs and a few responses at this step",
                       "whether prompts/batches change between steps",
                       "reward components (accuracy/format)"],
                action="fix the reward function or data pipeline before training further",
                detected_at=sr.step(min(a0 + M - 1, n - 1))))
        out.extend(_top(found, ctx, "points"))
    return out


def detect_reward_drop(ctx: Context) -> list[Finding]:
    name = ctx.first("reward")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    M = ctx.persist(n)
    if n < M + 2:
        return []
    hib = ctx.higher_is_better(name)
    sign = 1.0 if hib else -1.0
    y = sign * sr.y
    low, high = ctx.range(name)
    floor = (low if hib else (None if high is None else -high))
    B = max(3, ctx.window(name, sr))
    before = shift(rolling_median(y, B, "trailing"), 1)
    after = rolling_median(y, M, "leading")
    if floor is not None:
        den = np.where(before > floor, before - floor, np.abs(before))
    else:
        den = np.abs(before)
    # Noise: the run's own point-to-point noise, or the local noise just before the point
    # (just after the drop window for the first points), whichever is larger.
    noise = np.full(n, noise_sigma(y))
    if n >= 6:
        dd = np.abs(np.diff(y)) * 1.4826 / np.sqrt(2.0)
        K = max(3 * M, 2 * B)
        rm, lm = rolling_median(dd, K, "trailing"), rolling_median(dd, K, "leading")
        idx = np.arange(n)
        local = np.where(idx >= 2, rm[np.clip(idx - 2, 0, n - 2)], lm[np.clip(idx + M, 0, n - 2)])
        noise = np.maximum(noise, local)
    drop = before - after
    idx = np.arange(n)
    cond = (drop >= ctx.s.drop_frac * den) & (drop >= ctx.s.drop_noise_k * noise) & (den > TINY) \
        & (idx <= n - M) & (drop > 0)
    found = []
    for a, b in merge_close(runs(cond), M):
        lo_k, hi_k = max(a, 1), min(n - 1, a + M)
        if hi_k >= lo_k:
            c = lo_k + int(np.argmax(y[lo_k - 1:hi_k] - y[lo_k:hi_k + 1]))
        else:
            c = a
        lvl_before, lvl_after = float(before[a]), float(after[a])
        thr = lvl_before - 0.5 * (lvl_before - lvl_after)
        low_mask = y[c:] < thr
        seg = runs(low_mask)
        end = c + (seg[0][1] if seg and seg[0][0] == 0 else 0)
        lost = (lvl_before - lvl_after) / max(float(den[a]), TINY)
        sev = "critical" if lost >= 0.8 or end == n - 1 and lost >= 0.5 else "warning"
        found.append(ctx.finding(
            "reward_drop", name, sr.step(c), sr.step_end(end), sev,
            f"reward fell suddenly from {sign * lvl_before:.4g} to {sign * lvl_after:.4g} "
            f"({100 * lost:.0f}% of its level above the floor) and stayed down",
            evidence={"level_before": sign * lvl_before, "level_after": sign * lvl_after,
                      "fraction_lost": lost, "noise_sigma": float(noise[a]),
                      "floor": floor if floor is not None else float("nan")},
            causes=["a destructive policy update (learning rate too high, KL blow-up)",
                    "policy collapse (entropy fell to zero)",
                    "a change in the reward function or data distribution"],
            check=["KL and clip fraction just before the drop", "entropy around the drop",
                   "reward components and sample outputs after the drop"],
            action="resume from a checkpoint before the drop with a lower learning rate or a stronger KL penalty",
            detected_at=sr.step(min(c + M - 1, n - 1)), related=["kl_old_mean", "entropy"]))
    return _top(found, ctx, "fraction_lost")


def detect_reward_flat(ctx: Context) -> list[Finding]:
    name = ctx.first("reward")
    if name is None or ctx.overlapping("reward_drop", -2**62, 2**62) or ctx.overlapping("reward_zero", -2**62, 2**62):
        return []
    sr = ctx.series(name)
    n = sr.n
    if n < 6:
        return []
    hib = ctx.higher_is_better(name)
    sign = 1.0 if hib else -1.0
    y = sign * sr.y
    low, high = ctx.range(name)
    if not hib:
        low, high = (None if high is None else -high), (None if low is None else -low)
    st = ctx.s

    def judge(p: int) -> tuple[bool, float, float, float, float]:
        e = ctx.early(p)
        early, late = float(np.median(y[:e])), float(np.median(y[p - e:p]))
        if low is not None and high is not None and high > low:
            width = high - low
            imp, level = (late - early) / width, (late - low) / width
            return imp < st.flat_min_improvement and level < st.flat_max_level, early, late, imp, level
        rel = (late - early) / max(abs(early), abs(late), TINY)
        return rel < st.flat_min_rel_improvement, early, late, rel, float("nan")

    flat, early, late, imp, level = judge(n)
    if not flat:
        return _reward_plateau(ctx, name, sr, y, sign, low, high)
    grid = np.unique(np.linspace(max(6, min(n, st.flat_min_points)), n, num=20).round().astype(int))
    ok = np.array([judge(int(p))[0] for p in grid])
    bad = np.flatnonzero(~ok)
    p_first = int(grid[bad[-1] + 1]) if bad.size else int(grid[0])
    sev = "warning" if n >= st.flat_min_points else "info"
    ranged = not np.isnan(level)
    title = (f"reward barely improves: {sign * early:.4g} -> {sign * late:.4g}"
             + (f" ({100 * imp:.1f}% of the task range, at {100 * level:.0f}% of it)" if ranged
                else f" ({100 * imp:.1f}% relative)"))
    return [ctx.finding(
        "reward_flat", name, sr.step(0), sr.step_end(n - 1), sev, title,
        evidence={"early_level": sign * early, "late_level": sign * late, "improvement": imp,
                  "level_in_range": level, "range_low": low if low is not None else float("nan"),
                  "range_high": high if high is not None else float("nan")},
        causes=["the learning rate or update size is too small (see clip fraction / KL)",
                "the reward is too sparse for the exploration the policy does",
                "the algorithm's defaults do not suit the task (e.g. PPO defaults on Pendulum)",
                "entropy is collapsing before the task is learned"],
        check=["advantage std and reward std (is there a learning signal?)",
               "entropy trend", "clip fraction and KL (is the policy moving at all?)",
               "runs of the same task that succeeded (baseline)"],
        action="tune the task's hyper-parameters (learning rate, batch/rollout size, gamma, "
               "entropy bonus) or shape the reward; compare with a solved configuration",
        detected_at=sr.step_end(p_first - 1), layer=ctx.layer(name))]


def _reward_plateau(ctx: Context, name: str, sr, y: np.ndarray, sign: float, low: float | None,
                    high: float | None) -> list[Finding]:
    """A reward that learned, then stopped improving well below its task range's top.

    Judged only for control tasks with a task range: over the last ``plateau_frac`` of the
    run the smoothed reward gains less than ``flat_min_improvement`` of the range while it
    sits below ``flat_max_level`` of it. Without a range a plateau cannot be told from
    convergence; for language-model tasks the range's top (every answer right) is rarely
    reached, so a plateau below it is usually convergence too.
    """
    st = ctx.s
    n = sr.n
    info = ctx.metrics.get(name)
    if info is None or info.healthy_low is None or info.healthy_high is None:
        return []                        # only the dictionary's task range says where the top is
    if ctx.run_kind != "control" or low is None or high is None or high <= low or n < st.flat_min_points:
        return []
    width = high - low
    tail = max(st.persist_min_points * 2, int(round(st.plateau_frac * n)))
    if tail >= n:
        return []
    s = rolling_median(y, max(3, ctx.window(name, sr)), "centered")
    seg = s[n - tail:]
    gain = (float(np.max(seg[-max(1, tail // 4):])) - float(seg[0])) / width
    level = (float(np.median(y[n - max(1, tail // 4):])) - low) / width
    if gain >= st.flat_min_improvement or level >= st.flat_max_level:
        return []
    if rank_corr(seg) >= st.plateau_max_corr:
        return []                            # still rising steadily, only slowly: not a plateau yet
    start = sr.step(n - tail)
    return [ctx.finding(
        "reward_flat", name, start, sr.step_end(n - 1), "warning",
        f"reward stopped improving at {sign * float(np.median(y[-max(1, tail // 4):])):.4g} ({100 * level:.0f}% of "
        f"the task range) over the last {tail * sr.bin_size} points ({100 * gain:.1f}% of the range gained)",
        evidence={"plateau_level": sign * float(np.median(y[-max(1, tail // 4):])), "level_in_range": level,
                  "improvement": gain, "plateau_points": tail * sr.bin_size,
                  "range_low": low, "range_high": high},
        causes=["exploration that stays too high (an entropy bonus that keeps the policy random)",
                "the learning rate or update size became too small for further progress",
                "the algorithm's defaults do not suit the task"],
        check=["entropy over the plateau (still near its start?)", "clip fraction and KL",
               "runs of the same task that succeeded (baseline)"],
        action="compare the settings with a configuration that solved this task",
        detected_at=sr.step_end(n - 1), layer=ctx.layer(name))]


# ---------------------------------------------------------------------------------------
# KL
# ---------------------------------------------------------------------------------------
def detect_kl_spike(ctx: Context) -> list[Finding]:
    out = []
    st = ctx.s
    for name in ctx.role("kl"):
        sr = ctx.series(name)
        n = sr.n
        if n < 2:
            continue
        _, high = ctx.range(name)
        R = max(st.spike_ref_points, ctx.window(name, sr))
        ref = shift(rolling_median(sr.y, R, "trailing"), 1)
        ref[0] = float(np.median(sr.y))
        peak = sr.ymax
        floor = max(TINY, 1e-6 * float(np.median(np.abs(sr.y))))
        ratio = peak / np.maximum(ref, floor)
        cond = ratio >= st.spike_ratio
        if high is not None:
            cond &= peak > st.spike_gate_frac * high
        else:
            cond &= ratio >= st.spike_ratio_critical
        M = ctx.persist(n)
        found = []
        for a, b in merge_close(runs(cond), M):
            i = a + int(np.argmax(ratio[a:b + 1]))
            post = float(np.median(sr.y[i:min(n, i + M)]))
            r = float(ratio[i])
            sev = "critical" if r >= st.spike_ratio_critical else "warning"
            found.append(ctx.finding(
                "kl_spike", name, sr.step(a), sr.step_end(b), sev,
                (f"KL jumped to {float(peak[i]):.4g}, {r:.3g}x its recent level {float(ref[i]):.3g}"
                 if r < 1e6 else f"KL jumped to {float(peak[i]):.4g} from a recent level of ~0")
                + (f" (healthy high {high:g})" if high is not None else ""),
                evidence={"peak": float(peak[i]), "recent_level": float(ref[i]), "ratio": min(r, 1e12),
                          "level_after": post, "healthy_high": high if high is not None else float("nan")},
                causes=["learning rate too high for this batch size", "too many epochs / minibatches per rollout",
                        "a KL coefficient that is too small (or disabled)",
                        "a bad batch (outliers, very long responses)"],
                check=["clip fraction and grad norm at the same step", "learning-rate schedule (warm-up end?)",
                       "entropy and reward right after the spike"],
                action="lower the learning rate or raise the KL coefficient / tighten the clip range",
                detected_at=sr.step(i), related=["clip_fraction", "grad_norm", "learning_rate"]))
        out.extend(_top(found, ctx, "ratio"))
    return out


def detect_kl_climb(ctx: Context) -> list[Finding]:
    out = []
    st = ctx.s
    for name in ctx.role("kl"):
        sr = ctx.series(name)
        n = sr.n
        low, high = ctx.range(name)
        if high is None or n < 4:
            continue
        M = ctx.persist(n)
        s = rolling_median(sr.y, max(3, ctx.window(name, sr)), "centered")
        early = float(np.median(s[: ctx.early(n)]))
        base = max(min(early, high) * 1.5, 0.3 * high)
        found = []
        for a, b in runs(s > high, M):
            prior = np.flatnonzero(s[:a] <= base)
            onset = int(prior[-1]) if prior.size else 0
            corr = rank_corr(s[onset:a + M]) if a + M - onset >= 3 else 0.0
            climbing = corr >= st.climb_min_corr and (a - onset) >= M
            smax = float(s[a:b + 1].max())
            sev = "critical" if smax > st.kl_critical_factor * high else "warning"
            start = onset if climbing else a
            title = (f"KL climbing steadily from {float(s[onset]):.3g} to {smax:.3g}, above healthy high {high:g}"
                     if climbing else f"KL persistently above its healthy high {high:g} (up to {smax:.3g}) "
                                      f"for {(b - a + 1) * sr.bin_size} points")
            found.append(ctx.finding(
                "kl_climb", name, sr.step(start), sr.step_end(b), sev, title,
                evidence={"level_start": float(s[onset]), "level_max": smax, "healthy_high": high,
                          "rank_corr": corr, "points_above": (b - a + 1) * sr.bin_size,
                          "excess": smax / high},
                causes=["the policy drifts away from the reference/old policy faster than the KL term restrains it",
                        "KL coefficient too small or adaptive-KL target too high",
                        "learning rate too high late in training (no decay)"],
                check=["KL coefficient and its schedule", "reward trend over the same span (reward up + KL up?)",
                       "clip fraction"],
                action="raise the KL coefficient (or lower its target), lower the learning rate",
                detected_at=sr.step(min(a + M - 1, n - 1)), related=["clip_fraction", "reward_mean"]))
        out.extend(_top(found, ctx, "excess"))
    return out


# ---------------------------------------------------------------------------------------
# Clip fraction
# ---------------------------------------------------------------------------------------
def detect_clip_high(ctx: Context) -> list[Finding]:
    name = ctx.first("clip_fraction")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    _, high = ctx.range(name)
    if high is None:
        return []
    M = ctx.persist(n)
    s = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
    found = []
    covered = np.zeros(n, bool)
    tol = int(st.joint_overlap_frac * ctx.span)
    for a, b in runs(s > high, M):
        covered[a:b + 1] = True
        med = float(np.median(sr.y[a:b + 1]))
        sev = "critical" if med > st.clip_single_factor * high else "warning"
        found.append(ctx.finding(
            "clip_high", name, sr.step(a), sr.step_end(b), sev,
            f"clip fraction persistently above {high:g} (median {med:.3g}) for {(b - a + 1) * sr.bin_size} points",
            evidence={"median": med, "max": float(sr.ymax[a:b + 1].max()), "healthy_high": high,
                      "points": (b - a + 1) * sr.bin_size},
            causes=["update too large: learning rate too high", "too many epochs over the same rollout",
                    "advantages not normalised / too large"],
            check=["KL at the same steps", "learning rate and epochs per rollout", "advantage std"],
            action="lower the learning rate, use fewer epochs or larger minibatches",
            detected_at=sr.step(min(a + M - 1, n - 1)), related=["kl_old_mean", "learning_rate"]))
    for a, b in merge_close(runs((sr.ymax > high) & ~covered), M):
        peak = float(sr.ymax[a:b + 1].max())
        kl = [f for f in ctx.findings if f.detector == "kl_spike"
              and f.start <= sr.step_end(b) + tol and f.end >= sr.step(a) - tol]
        if peak < st.clip_single_factor * high and not kl:
            continue
        found.append(ctx.finding(
            "clip_high", name, sr.step(a), sr.step_end(b), "warning",
            f"clip fraction {peak:.3g} (healthy high {high:g})"
            + (" together with a KL spike" if kl else " in a short burst"),
            evidence={"max": peak, "healthy_high": high, "points": (b - a + 1) * sr.bin_size,
                      "with_kl_spike": float(bool(kl))},
            causes=["one update far outside the trust region (learning rate too high)",
                    "a bad batch"],
            check=["KL and entropy at and right after this step"],
            action="lower the learning rate; if it recurs, use fewer epochs per rollout",
            detected_at=sr.step(a), related=["kl_old_mean"]))
    return _top(found, ctx, "points")


def detect_clip_low(ctx: Context) -> list[Finding]:
    name = ctx.first("clip_fraction")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    low, _ = ctx.range(name)
    if low is None or n < 4:
        return []
    M = ctx.persist(n)
    L = max(M, int(np.ceil(st.clip_low_min_frac * n)))
    s = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
    kl_name = ctx.first("kl_update")
    found = []
    for a, b in runs(s < low, L):
        start, end = sr.step(a), sr.step_end(b)
        med = float(np.median(sr.y[a:b + 1]))
        ev = {"median": med, "healthy_low": low, "points": (b - a + 1) * sr.bin_size}
        if kl_name is not None:
            kl_low, kl_high = ctx.range(kl_name)
            kl_level = ctx.median_between(kl_name, start, end)
            ev["kl_median"] = kl_level
            ref = kl_low if kl_low is not None else (st.kl_conservative_frac * kl_high if kl_high is not None else None)
            corroborated = kl_level is not None and ref is not None and kl_level < ref
            if ref is not None:
                ev["kl_healthy_low"] = ref
        else:
            corroborated = med < st.clip_near_zero_factor * low
        collapsed = ctx.overlapping("entropy_collapse", start, end, int(st.joint_overlap_frac * ctx.span))
        causes = ["learning rate too small (the policy barely moves)", "too few epochs / too large minibatches",
                  "clip range much wider than the actual update"]
        if collapsed:
            causes.insert(0, "the policy has collapsed (entropy near zero), so updates no longer change it")
        sev = "warning" if corroborated else "info"
        found.append(ctx.finding(
            "clip_low", name, start, end, sev,
            (f"updates too conservative: clip fraction {med:.3g} < {low:g}"
             + (f" and KL {ev['kl_median']:.2g} below its healthy low" if corroborated and kl_name else "")
             if corroborated else
             f"clip fraction {med:.3g} below {low:g}, but KL is in range (acceptable late in training)")
            + f" for {(b - a + 1) * sr.bin_size} points",
            evidence=ev, causes=causes,
            check=["learning rate (and its schedule)", "KL to the old policy", "entropy (collapsed policy?)"],
            action="raise the learning rate (or epochs per rollout) until clip fraction is in range",
            detected_at=sr.step(min(a + L - 1, n - 1)), related=["kl_old_mean", "learning_rate"]))
    return found[: st.max_findings_per_metric]


# ---------------------------------------------------------------------------------------
# Entropy
# ---------------------------------------------------------------------------------------
def detect_entropy_collapse(ctx: Context) -> list[Finding]:
    name = ctx.first("entropy")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    M = ctx.persist(n)
    G = max(st.cliff_points, int(round(st.cliff_run_frac * n)))
    if n < 4:
        return []
    y = sr.y
    B = max(3, ctx.window(name, sr))
    before = shift(rolling_median(y, B, "trailing"), 1)
    after = shift(rolling_median(y, M, "leading"), -G)
    idx = np.arange(n)
    cond = (idx + G + M <= n) & (before > TINY) & (after <= (1 - st.cliff_frac) * before)
    elow, _ = ctx.range(name)
    found = []
    for a, b in merge_close(runs(cond), M):
        hi_k = min(n - 1, a + G + M)
        lo_k = max(1, a)
        c = lo_k + int(np.argmax(y[lo_k - 1:hi_k] - y[lo_k:hi_k + 1])) if hi_k >= lo_k else a
        lvl_b, lvl_a = float(before[a]), float(after[a])
        thr = (1 - st.cliff_frac) * lvl_b
        seg = runs(y[c:] < thr)
        end = c + (seg[0][1] if seg and seg[0][0] == 0 else 0)
        ratio = lvl_a / lvl_b
        sev = "critical" if ratio <= st.cliff_critical_ratio or (elow is not None and lvl_a < elow) else "warning"
        found.append(ctx.finding(
            "entropy_collapse", name, sr.step(max(a, c - 1)), sr.step_end(end), sev,
            f"entropy fell off a cliff: {lvl_b:.3g} -> {lvl_a:.3g} within {(c - a + G) * sr.bin_size} points",
            evidence={"level_before": lvl_b, "level_after": lvl_a, "ratio": ratio,
                      "cliff_step": sr.step(c), "healthy_low": elow if elow is not None else float("nan")},
            causes=["a too-large update made the policy (near-)deterministic",
                    "no entropy bonus and a strong, narrow reward signal",
                    "reward hacking onto one response pattern"],
            check=["KL and clip fraction just before the cliff", "reward after the cliff (still improving?)",
                   "sample diversity of responses/actions"],
            action="resume from before the cliff with a lower learning rate, an entropy bonus or a KL penalty",
            detected_at=sr.step(min(n - 1, c + M - 1)), related=["kl_old_mean", "clip_fraction"]))
    return _top(found, ctx, "level_before")


# ---------------------------------------------------------------------------------------
# Response length growing while reward is flat (reward hacking)
# ---------------------------------------------------------------------------------------
def detect_length_hacking(ctx: Context) -> list[Finding]:
    lname, rname = ctx.first("length"), ctx.first("reward")
    if lname is None or rname is None:
        return []
    sl = ctx.series(lname)
    sr = ctx.series(rname)
    n = sl.n
    st = ctx.s
    M = ctx.persist(n)
    Ws = sorted({max(2 * M, int(round(fr * n))) for fr in st.hack_window_fracs})
    if n < max(Ws[0], 8):
        return []
    L = rolling_median(sl.y, max(1, ctx.window(lname, sl)), "centered")
    sign = 1.0 if ctx.higher_is_better(rname) else -1.0
    R = sign * np.interp(sl.steps.astype(float), sr.steps.astype(float), sr.y)
    low, high = ctx.range(rname)
    if low is not None and high is not None and high > low:
        rscale = high - low
    else:
        rscale = max(float(np.quantile(R, 0.95) - np.quantile(R, 0.05)), TINY)
    # A reward that collapsed for another reason (reward_zero / reward_drop) is not a reward
    # that stays flat while the length grows: windows reaching such a collapse are skipped.
    collapses = [(f.start, f.end) for f in ctx.findings
                 if f.detector in ("reward_zero", "reward_drop") and f.at_least("warning")]
    fire = []
    for W in Ws:
        if W > n:
            continue
        q = max(1, W // 4)
        for e in window_ends(n, W, 40):
            s0 = e - W + 1
            if any(a <= sl.step_end(e) and b >= sl.step(s0) for a, b in collapses):
                continue
            l0, l1 = float(np.median(L[s0:s0 + q])), float(np.median(L[e - q + 1:e + 1]))
            growth = l1 / l0 - 1 if l0 > TINY else 0.0
            if growth < st.hack_min_growth:
                continue
            corr = rank_corr(L[s0:e + 1])
            dr = (float(np.median(R[e - q + 1:e + 1])) - float(np.median(R[s0:s0 + q]))) / rscale
            if corr >= st.hack_min_corr and dr <= st.hack_reward_tol:
                fire.append((int(s0), int(e), growth, corr, dr))
    if not fire:
        return []
    W = Ws[0]
    q = max(1, W // 4)
    spans = merge_close([(f[0], f[1]) for f in fire], W // 2)
    out = []
    for a, b in spans:
        inside = [f for f in fire if a <= f[0] and f[1] <= b]
        best = max(inside, key=lambda f: f[2])
        first = min(inside, key=lambda f: f[1])
        base = float(np.median(L[a:a + q]))
        near = np.flatnonzero(L[a:first[1] + 1] <= base * (1 + 0.2 * st.hack_min_growth))
        onset = a + int(near[-1]) if near.size else a      # where the growth takes off
        start, end = sl.step(onset), sl.step_end(b)
        ev = {"length_start": base, "length_end": float(np.median(L[b - q + 1:b + 1])),
              "growth": best[2], "rank_corr": best[3], "reward_change_frac": best[4]}
        for comp in ctx.role("reward_components"):
            v = ctx.values_between(comp, start, end)
            if v.size >= 4:
                k = max(1, v.size // 4)
                ev[f"{comp}_change"] = float(np.median(v[-k:]) - np.median(v[:k]))
        out.append(ctx.finding(
            "length_hacking", lname, start, end, "warning",
            f"response length grows {100 * best[2]:.0f}% ({ev['length_start']:.4g} -> {ev['length_end']:.4g}) "
            f"while the reward is flat or falling",
            evidence=ev,
            causes=["the policy found a length-correlated reward loophole (reward hacking)",
                    "a format/process reward that pays for verbosity",
                    "a missing or too weak length penalty"],
            check=["reward decomposition: accuracy vs format vs process rewards",
                   "samples of the longest responses", "truncation rate at the max length"],
            action="inspect the reward decomposition; add a length penalty or fix the loophole",
            detected_at=sl.step_end(first[1]), related=[rname, "reward_format_mean", "reward_accuracy_mean"]))
    return out[: st.max_findings_per_metric]


# ---------------------------------------------------------------------------------------
# Value loss not decreasing
# ---------------------------------------------------------------------------------------
def detect_value_loss_flat(ctx: Context) -> list[Finding]:
    name = ctx.first("value_loss")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    if n < st.vl_min_points:
        return []
    M = ctx.persist(n)
    e = ctx.early(n)
    early = float(np.median(sr.y[:e]))
    if early <= TINY:
        return []
    s = rolling_median(sr.y, max(3, ctx.window(name, sr), M), "centered")
    flat = s > (1 - st.vl_min_decrease) * early
    flat[:e] = True
    L = max(M, int(np.ceil(st.vl_min_frac * n)))
    spans = [(a, b) for a, b in merge_close(runs(flat), M) if b >= n - 1 - M and b - a + 1 >= L]
    if not spans:
        return []
    a, b = spans[0]
    start, end = sr.step(a), sr.step_end(b)
    late = float(np.median(sr.y[max(a, n - e):]))
    ev_name = ctx.first("explained_variance")
    ev = {"early_level": early, "late_level": late, "ratio": late / early, "points": (b - a + 1) * sr.bin_size}
    good_fit = False
    if ev_name is not None:
        evl = ctx.median_between(ev_name, start, end)
        if evl is not None:
            ev["explained_variance"] = evl
            good_fit = evl >= st.vl_good_explained_variance
    # Returns still climbing steadily: the critic chases a moving target, its loss cannot fall.
    chasing = False
    rname = ctx.first("reward")
    if rname is not None and not good_fit:
        rv = ctx.values_between(rname, start, end)
        lo_r, hi_r = ctx.range(rname)
        if rv.size >= 6:
            sign = 1.0 if ctx.higher_is_better(rname) else -1.0
            k = max(2, rv.size // 6)
            gain = sign * (float(np.median(rv[-k:])) - float(np.median(rv[:k])))
            scale = (hi_r - lo_r) if lo_r is not None and hi_r is not None and hi_r > lo_r else \
                max(float(np.max(rv) - np.min(rv)), 1e-12)
            ev["reward_gain"] = gain
            # Only when the critic demonstrably fits what it can (explained variance known and
            # fair): a flat loss with a critic that explains nothing is a critic problem.
            fair = ev.get("explained_variance", -1.0) >= st.vl_chasing_explained_variance
            chasing = fair and rank_corr(sign * rv) >= st.vl_chasing_corr and gain >= st.vl_chasing_gain * scale
    return [ctx.finding(
        "value_loss_flat", name, start, end, "info" if good_fit or chasing else "warning",
        f"value loss not decreasing: {early:.4g} early, {late:.4g} now"
        + (" (but explained variance is high: the critic fits)" if good_fit else "")
        + (" while the return is still rising steadily (the critic chases a moving target)" if chasing else ""),
        evidence=ev,
        causes=["the critic is not learning (value learning rate / vf_coef too small)",
                "returns are non-stationary or badly scaled (no reward normalisation)",
                "the learning rate is too small overall"],
        check=["explained variance", "return scale and reward normalisation", "vf_coef and value clipping"],
        action="check the critic: scale/normalise returns, raise vf_coef or the value learning rate",
        detected_at=sr.step(min(n - 1, a + L - 1)), related=["explained_variance"])]


# ---------------------------------------------------------------------------------------
# Learning signal: advantage / reward std to zero; advantage mean drifting
# ---------------------------------------------------------------------------------------
def detect_signal_collapse(ctx: Context) -> list[Finding]:
    out = []
    st = ctx.s
    reward = ctx.first("reward")
    for name in ctx.role("signal_std"):
        sr = ctx.series(name)
        n = sr.n
        M = ctx.persist(n)
        if n < M + 3:
            continue
        e = ctx.early(n)
        ref = float(np.median(sr.y[:e]))
        low, _ = ctx.range(name)
        if ref <= TINY:
            continue
        thr = st.std_zero_frac * ref
        if low is not None and low > 0:
            thr = min(max(thr, low), 0.5 * ref)
        s = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
        spans = [(a, b) for a, b in runs(s <= thr, M) if a > 0]
        if not spans:
            continue
        a, b = spans[0]
        start, end = sr.step(a), sr.step_end(b)
        level = float(np.median(sr.y[a:b + 1]))
        ev = {"early_level": ref, "level": level, "threshold": thr, "points": (b - a + 1) * sr.bin_size}
        saturated = False
        if reward is not None:
            rl = ctx.median_between(reward, start, end)
            if rl is not None:
                ev["reward_level"] = rl
                saturated = ctx.reward_saturated(reward, rl)
        if saturated:
            sev = "info"
            title = f"{name} fell to {level:.3g} because the reward is saturated at its ceiling (harmless)"
        else:
            sev = "critical" if b == n - 1 and level <= st.std_critical_frac * ref else "warning"
            title = f"no learning signal: {name} fell from {ref:.3g} to {level:.3g}"
        out.append(ctx.finding(
            "signal_collapse", name, start, end, sev, title, evidence=ev,
            causes=(["every sample already gets the maximal reward (task solved)"] if saturated else
                    ["every episode ends with the same return (a deterministic policy in a deterministic "
                     "environment)", "the reward is constant or broken", "the policy has collapsed (entropy)"]
                    if ctx.run_kind == "control" else
                    ["all samples of a group get the same reward (too easy / too hard prompts)",
                     "the reward is constant or broken", "the policy has collapsed to one answer (entropy)"]),
            check=["reward level vs its task range", "reward sparsity per prompt group", "entropy"],
            action=("nothing to fix; consider harder tasks or stopping" if saturated else
                    "re-balance prompt difficulty / filter degenerate groups; check the reward function"),
            detected_at=sr.step(min(n - 1, a + M - 1)), related=[reward or "reward_mean", "entropy"]))
    return out


def detect_advantage_drift(ctx: Context) -> list[Finding]:
    name = ctx.first("advantage_mean")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    M = ctx.persist(n)
    if n < M + 3:
        return []
    info = ctx.metrics.get(name)
    std_name = ctx.first("advantage_std")
    if info is not None and info.healthy_low is not None and info.healthy_high is not None:
        lo, hi = info.healthy_low, info.healthy_high
    elif std_name is not None:
        lvl = float(np.median(ctx.series(std_name).y))
        lo, hi = -st.drift_frac * lvl, st.drift_frac * lvl
        if hi <= TINY:
            lo, hi = ctx.range(name)
    else:
        lo, hi = ctx.range(name)
    if lo is None or hi is None:
        return []
    s = rolling_median(sr.y, max(3, ctx.window(name, sr)), "centered")
    out = []
    width = max(hi - lo, TINY)
    for a, b in runs((s > hi) | (s < lo), M)[: st.max_findings_per_metric]:
        peak = float(s[a:b + 1][np.argmax(np.abs(s[a:b + 1]))])
        sev = "critical" if peak > hi + 2 * width or peak < lo - 2 * width else "warning"
        out.append(ctx.finding(
            "advantage_drift", name, sr.step(a), sr.step_end(b), sev,
            f"advantage mean drifted from 0 to {peak:.3g} (allowed {lo:.3g}..{hi:.3g})",
            evidence={"peak": peak, "allowed_low": lo, "allowed_high": hi, "points": (b - a + 1) * sr.bin_size},
            causes=["a biased baseline/critic (value function lagging the returns)",
                    "advantage normalisation disabled or computed on the wrong axis",
                    "reward scale changing quickly"],
            check=["advantage std and the value loss", "advantage normalisation settings", "reward scale"],
            action="check advantage normalisation and the critic/baseline",
            detected_at=sr.step(min(n - 1, a + M - 1)), related=["advantage_std", "value_loss"]))
    return out


# ---------------------------------------------------------------------------------------
# Grad norm spikes
# ---------------------------------------------------------------------------------------
def detect_grad_spikes(ctx: Context) -> list[Finding]:
    name = ctx.first("grad_norm")
    if name is None:
        return []
    sr = ctx.series(name)
    st = ctx.s
    v = sr.raw_values
    nr = v.size
    if nr < 10:
        return []
    w = max(5, ctx.window(name, sr))
    base_bins = rolling_median(sr.y, w if sr.bin_size == 1 else max(3, w), "centered")
    base = np.repeat(base_bins, sr.bin_size)[:nr] if sr.bin_size > 1 else base_bins
    if base.size < nr:
        base = np.concatenate([base, np.full(nr - base.size, base[-1])])
    pos = (v > 0) & (base > 0)
    r = np.zeros(nr)
    r[pos] = np.log(v[pos]) - np.log(base[pos])
    sigma = mad_sigma(r[pos]) if pos.any() else 0.0
    thr = max(np.log(st.grad_spike_min_ratio), st.grad_spike_z * sigma)
    spike = pos & (r > thr)
    if spike.sum() < st.grad_spike_min_count:
        return []
    gap = max(st.grad_spike_gap_points, int(round(st.grad_spike_window_frac * nr)))
    nb = max(gap, int(st.grad_spike_baseline_frac * nr))
    base_rate = float(spike[:nb].mean())
    need_rate = max(st.grad_spike_min_rate, st.grad_spike_rate_factor * base_rate)
    spike_idx = np.flatnonzero(spike)
    cut = np.flatnonzero(np.diff(spike_idx) > gap)
    clusters = list(zip(spike_idx[np.concatenate([[0], cut + 1])].tolist(),
                        spike_idx[np.concatenate([cut, [spike_idx.size - 1]])].tolist()))
    out = []
    for a, b in clusters:
        ids = spike_idx[(spike_idx >= a) & (spike_idx <= b)]
        if ids.size < st.grad_spike_min_count or ids.size / (b - a + 1) < need_rate:
            continue
        if len(out) >= st.max_findings_per_metric:
            break
        ratios = np.exp(r[ids])
        start, end = int(sr.raw_steps[ids[0]]), int(sr.raw_steps[ids[-1]])
        sev = "critical" if ratios.max() >= 100 or ids.size >= 10 * st.grad_spike_min_count else "warning"
        out.append(ctx.finding(
            "grad_norm_spikes", name, start, end, sev,
            f"{ids.size} grad-norm spikes (up to {ratios.max():.3g}x the local median) between steps {start} and {end}",
            evidence={"n_spikes": ids.size, "max_ratio": float(ratios.max()), "median_ratio": float(np.median(ratios)),
                      "rate": ids.size / (b - a + 1), "baseline_rate": base_rate,
                      "threshold_ratio": float(np.exp(thr))},
            causes=["learning rate too high / no warm-up", "outlier batches (very long sequences, rare tokens)",
                    "mixed-precision overflow", "gradient clipping disabled or too loose"],
            check=["loss and KL at the spike steps", "the batches at those steps", "max_grad_norm setting"],
            action="lower the learning rate or clip gradients tighter; inspect the offending batches",
            detected_at=int(sr.raw_steps[ids[min(ids.size, st.grad_spike_min_count) - 1]]),
            related=["kl_old_mean", "policy_loss"]))
    return out


# ---------------------------------------------------------------------------------------
# Policy loss growing without convergence
# ---------------------------------------------------------------------------------------
def detect_policy_loss_growing(ctx: Context) -> list[Finding]:
    name = ctx.first("policy_loss")
    if name is None:
        return []
    sr = ctx.series(name)
    n = sr.n
    st = ctx.s
    M = ctx.persist(n)
    W = max(2 * M, int(round(st.pl_window_frac * n)))
    if n < max(W, 8):
        return []
    s = rolling_median(sr.y, max(3, ctx.window(name, sr)), "centered")
    a_s = np.abs(s)
    e = ctx.early(n)
    e0 = float(np.median(np.abs(sr.y[:e])) + mad_sigma(sr.y[:e]))
    if e0 <= TINY:
        return []
    q = max(1, W // 4)
    fire = []
    for end in window_ends(n, W, 40):
        s0 = end - W + 1
        lvl = float(np.median(a_s[end - q + 1:end + 1]))
        if lvl < st.pl_growth_factor * e0:
            continue
        if float(np.median(a_s[s0:s0 + q])) * (1 + st.pl_window_growth) > lvl:
            continue
        if rank_corr(a_s[s0:end + 1]) >= st.pl_min_corr:
            fire.append((int(s0), int(end), lvl))
    if not fire:
        return []
    a = fire[0][0]
    b = fire[-1][1]
    still = fire[-1][1] == n - 1
    lvl = max(f[2] for f in fire)
    return [ctx.finding(
        "policy_loss_growing", name, sr.step(a), sr.step_end(b), "warning" if still else "info",
        f"policy loss growing without converging: |loss| {e0:.3g} early -> {lvl:.3g}"
        + ("" if still else " (it has since stabilised)"),
        evidence={"early_scale": e0, "level": lvl, "growth": lvl / e0},
        causes=["the policy is moving away from the data it is trained on (off-policy drift)",
                "advantages growing in scale (no normalisation)", "learning rate too high"],
        check=["KL and clip fraction over the same span", "advantage std", "learning-rate schedule"],
        action="lower the learning rate; normalise advantages; check that rollouts are fresh",
        detected_at=sr.step_end(fire[0][1]), related=["kl_old_mean", "advantage_std"])]


DETECTORS: tuple[tuple[str, Callable[[Context], list[Finding]]], ...] = (
    ("nan_inf", detect_nonfinite),
    ("kl_spike", detect_kl_spike),
    ("kl_climb", detect_kl_climb),
    ("clip_high", detect_clip_high),
    ("entropy_collapse", detect_entropy_collapse),
    ("clip_low", detect_clip_low),
    ("reward_zero", detect_reward_zero),
    ("reward_drop", detect_reward_drop),
    ("reward_flat", detect_reward_flat),
    ("length_hacking", detect_length_hacking),
    ("value_loss_flat", detect_value_loss_flat),
    ("signal_collapse", detect_signal_collapse),
    ("advantage_drift", detect_advantage_drift),
    ("grad_norm_spikes", detect_grad_spikes),
    ("policy_loss_growing", detect_policy_loss_growing),
) + EXTRA_DETECTORS
DETECTOR_IDS = tuple(d for d, _ in DETECTORS) + ("baseline_deviation",)
