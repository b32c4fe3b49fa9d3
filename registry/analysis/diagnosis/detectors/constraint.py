"""Constraint-layer detectors: KL spikes and climbs, a value loss that stops learning, a policy loss that
keeps growing. The clip fraction's are in ``clipping``, the entropy's in ``entropy``."""
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
    shift,
    window_ends,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import (
    return_at_top,
    top,
)


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
        early = np.arange(n) < R            # the running level is still the first update or two
        if name.startswith("kl_ref"):
            # A policy starts as its reference, so its KL to it starts at 0 and rises to the run's level over the
            # first updates: a jump among them is measured against the level the run reaches next as well (a
            # rise from 0 to 0.3 peaking at 0.97 is the policy leaving its reference, not a 10^5x spike).
            ahead = shift(rolling_median(sr.y[::-1], R, "trailing"), 1)[::-1]
            ref[early] = np.maximum(ref[early], np.nan_to_num(ahead[early]))
        peak = sr.ymax
        floor = max(TINY, 1e-6 * float(np.median(np.abs(sr.y))))
        ratio = peak / np.maximum(ref, floor)
        cond = ratio >= st.spike_ratio
        if high is not None:
            cond &= peak > np.where(early, st.spike_early_high_factor, st.spike_gate_frac) * high
        else:
            cond &= ratio >= st.spike_ratio_critical
        M = ctx.persist(n)
        found = []
        for a, b in merge_close(runs(cond), M):
            i = a + int(np.argmax(ratio[a:b + 1]))
            post = float(np.median(sr.y[i:min(n, i + M)]))
            r = float(ratio[i])
            # Critical: many times the run's own level and, where a healthy high is known, far above it too.
            # A run whose KL sits far below the high (CleanRL's defaults: about 1e-5 against 0.05) multiplies
            # it tenfold with one ordinary large update.
            far = high is None or float(peak[i]) >= st.spike_critical_high_factor * high
            sev = "critical" if r >= st.spike_ratio_critical and far else "warning"
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
        out.extend(top(found, ctx, "ratio"))
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
                          "excess": smax / high, "climbing": float(climbing)},
                causes=["the policy drifts away from the reference/old policy faster than the KL term restrains it",
                        "KL coefficient too small or adaptive-KL target too high",
                        "learning rate too high late in training (no decay)"],
                check=["KL coefficient and its schedule", "reward trend over the same span (reward up + KL up?)",
                       "clip fraction"],
                action="raise the KL coefficient (or lower its target), lower the learning rate",
                detected_at=sr.step(min(a + M - 1, n - 1)), related=["clip_fraction", "reward_mean"]))
        out.extend(top(found, ctx, "excess"))
    return out


# ---------------------------------------------------------------------------------------
# Value loss not decreasing
# ---------------------------------------------------------------------------------------
def detect_value_loss_flat(ctx: Context) -> list[Finding]:
    found = ctx.first_series("value_loss")
    if found is None:
        return []
    name, sr, n = found
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
    chasing = scaled = False
    rname = ctx.first("reward")
    scale_text = ""
    if rname is not None and not good_fit:
        rv = ctx.values_between(rname, start, end)
        lo_r, hi_r = ctx.range(rname)
        if rv.size >= 6:
            sign = 1.0 if ctx.higher_is_better(rname) else -1.0
            k = max(2, rv.size // 6)
            first_r, last_r = float(np.median(rv[:k])), float(np.median(rv[-k:]))
            gain = sign * (last_r - first_r)
            scale = (hi_r - lo_r) if lo_r is not None and hi_r is not None and hi_r > lo_r else \
                max(float(np.max(rv) - np.min(rv)), 1e-12)
            ev["reward_gain"] = gain
            # Only when the critic demonstrably fits what it can (explained variance known and
            # fair): a flat loss with a critic that explains nothing is a critic problem.
            fair = ev.get("explained_variance", -1.0) >= st.vl_chasing_explained_variance
            chasing = fair and rank_corr(sign * rv) >= st.vl_chasing_corr and gain >= st.vl_chasing_gain * scale
            # The return grew k-fold in size, and the value targets (discounted returns) with it, up to
            # the discount horizon: a squared error against them grows up to k^2-fold with the critic
            # fitting as well as before, so a loss that grew less is no failing critic.
            if fair and not chasing and abs(first_r) > TINY and abs(last_r) > abs(first_r):
                growth = (last_r / first_r) ** 2
                ev["target_growth_squared"] = growth
                scaled = late / early <= growth
                scale_text = (f" while the return grew from {first_r:.4g} to {last_r:.4g}: the value targets grow with "
                              f"it, and the loss grew {late / early:.2g}x, less than the square of that growth "
                              f"({growth:.2g}x), so the critic keeps up (explained variance "
                              f"{ev['explained_variance']:.2g})")
    at_top = None if good_fit or chasing or scaled else return_at_top(ctx, sr.step(max(a, n - e)), end)
    if at_top is not None:
        ev["return_level_in_task_range"] = at_top[1]
    return [ctx.finding(
        "value_loss_flat", name, start, end, "info" if good_fit or chasing or scaled or at_top else "warning",
        f"value loss not decreasing: {early:.4g} early, {late:.4g} now"
        + (" (but explained variance is high: the critic fits)" if good_fit else "")
        + (" while the return is still rising steadily (the critic chases a moving target)" if chasing else "")
        + (scale_text if scaled else "")
        + (f" while the return ends at {at_top[0]:.4g}, {100 * at_top[1]:.0f}% of its task range: the policy does "
           "what the task asks, so a critic loss that does not fall is not holding it back" if at_top else ""),
        evidence=ev,
        causes=["the critic is not learning (value learning rate / vf_coef too small)",
                "returns are non-stationary or badly scaled (no reward normalisation)",
                "the learning rate is too small overall"],
        check=["explained variance", "return scale and reward normalisation", "vf_coef and value clipping"],
        action="check the critic: scale/normalise returns, raise vf_coef or the value learning rate",
        detected_at=sr.step(min(n - 1, a + L - 1)), related=["explained_variance"])]


# ---------------------------------------------------------------------------------------
# Policy loss growing without convergence
# ---------------------------------------------------------------------------------------
def detect_policy_loss_growing(ctx: Context) -> list[Finding]:
    found = ctx.first_series("policy_loss")
    if found is None:
        return []
    name, sr, n = found
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
