"""Diagnostic-layer detectors: non-finite values, length growing while the reward is flat, the reward or
advantage std collapsing, grad-norm spikes."""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.signal import (
    TINY,
    mad_sigma,
    merge_close,
    rank_corr,
    rolling_median,
    runs,
    window_ends,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import by_chance


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
# Learning signal: advantage / reward std to zero; advantage mean drifting
# ---------------------------------------------------------------------------------------
def detect_signal_collapse(ctx: Context) -> list[Finding]:
    out = []
    st = ctx.s
    reward = ctx.first("reward")
    for name in ctx.role("signal_std"):
        opened = ctx.opening(name, extra=3)
        if opened is None:
            continue
        sr, n, M = opened
        e = ctx.early(n)
        ref = float(np.median(sr.y[:e]))
        low, _ = ctx.range(name)
        if ref <= TINY:
            continue
        thr = st.std_zero_frac * ref
        if low is not None and low > 0:
            thr = min(max(thr, low), 0.5 * ref)
        s = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
        # A language model's reward std is 0 at every step all its few groups agree: a stretch of such steps
        # no longer than their rate elsewhere makes likely is that rate, which advantage_degenerate reads.
        spans = [(a, b) for a, b in runs(s <= thr, M) if a > 0 and not by_chance(ctx, sr.y <= thr, a, b)]
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
    # A stretch of batches with no policy gradient (every GRPO group rewarded alike: norms of 1e-3 beside the
    # run's usual 1) is not a level to measure spikes against: an ordinary batch after it is no 1000x spike.
    typical = float(np.median(v[v > 0])) if (v > 0).any() else 0.0
    base = np.maximum(base, st.grad_spike_floor_frac * typical)
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
    spike_idx = np.flatnonzero(spike)
    cut = np.flatnonzero(np.diff(spike_idx) > gap)
    clusters = list(zip(spike_idx[np.concatenate([[0], cut + 1])].tolist(),
                        spike_idx[np.concatenate([cut, [spike_idx.size - 1]])].tolist()))
    out = []
    for a, b in clusters:
        # The run's own rate is read outside the cluster judged: a burst in the first quarter is not its own
        # reference (three spikes of 90-150x in steps 11-58 of 300 set a "baseline" they could never beat).
        outside = np.ones(nb, dtype=bool)
        outside[a:b + 1] = False
        base_rate = float(spike[:nb][outside].mean()) if outside.any() else 0.0
        need_rate = max(st.grad_spike_min_rate, st.grad_spike_rate_factor * base_rate)
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
