"""Constraint-layer detectors: KL spikes and climbs, entropy collapse, a value loss that stops
learning, a policy loss that keeps growing. The clip fraction's are in ``clipping``."""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.signal import (
    TINY,
    mad_sigma,
    merge_close,
    noise_sigma,
    rank_corr,
    rolling_median,
    runs,
    shift,
    window_ends,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import (
    aftermath,
    instability_words,
    level_in_task_range,
    top,
    unstable_updates,
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
        peak = sr.ymax
        floor = max(TINY, 1e-6 * float(np.median(np.abs(sr.y))))
        ratio = peak / np.maximum(ref, floor)
        cond = ratio >= st.spike_ratio
        if high is not None:
            early = np.arange(n) < R            # the running level is still the first update or two
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
# Entropy
# ---------------------------------------------------------------------------------------
def detect_entropy_collapse(ctx: Context) -> list[Finding]:
    found = ctx.first_series("entropy")
    if found is None:
        return []
    name, sr, n = found
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
        start, stop = sr.step(max(a, c - 1)), sr.step_end(end)
        # Beside unstable updates a rising return does not clear a cliff (the updates may have caused it and
        # the return may yet pay); a return that held the top of its task range to the end does, unless the
        # updates beside it were critical (far past the healthy high: no mild excursion of a fast learner).
        since = start - aftermath(ctx)
        unstable = unstable_updates(ctx, since, stop)
        learned = None if unstable else _learned_through(ctx, start, stop)
        if learned is None and not unstable_updates(ctx, since, stop, "critical"):
            learned = _held_at_top(ctx, start, stop)
        if learned is not None and not _entropy_penalised(ctx):
            words, evidence = learned
            # "findings", not "warnings": a KL spike that nothing followed becomes information afterwards.
            beside = (f"beside {instability_words(unstable, 'findings')}: large updates, but" if unstable else
                      "with no KL or clip-fraction warning over it:")
            found.append(ctx.finding(
                "entropy_collapse", name, start, stop, "info",
                f"entropy fell fast: {lvl_b:.3g} -> {lvl_a:.3g} within {(c - a + G) * sr.bin_size} points, {words}, "
                f"{beside} the policy sharpened as it learned",
                evidence={"level_before": lvl_b, "level_after": lvl_a, "ratio": ratio, "cliff_step": sr.step(c),
                          "learning": 1.0, **evidence},
                check=["the return, if it stops improving while the entropy keeps falling"],
                related=["kl_old_mean", "clip_fraction"]))
            continue
        lvl_end = lvl_a
        if ctx.run_kind != "control":
            # A language model's token entropy that keeps falling after its cliff is collapsing onto one answer:
            # the finding spans where it stays down, from the steepest drop (or the points right after it, when
            # the drop lands above the threshold on its way down), a point or two back above not ending it, and
            # is judged by where it ends up.
            seg = merge_close(runs(y[c:] < thr), M)
            end = c + (seg[0][1] if seg and seg[0][0] <= M else 0)
            lvl_end = float(np.median(y[max(c, end - M + 1):end + 1]))
        deeper = lvl_end < 0.5 * lvl_a          # it kept falling after the cliff, as a collapse to one answer does
        sev = "critical" if (min(ratio, lvl_end / lvl_b) <= st.cliff_critical_ratio
                             or (elow is not None and lvl_a < elow)) else "warning"
        found.append(ctx.finding(
            "entropy_collapse", name, sr.step(max(a, c - 1)), sr.step_end(end), sev,
            f"entropy fell off a cliff: {lvl_b:.3g} -> {lvl_a:.3g} within {(c - a + G) * sr.bin_size} points"
            + (f", and on down to {lvl_end:.3g} by step {sr.step_end(end)}" if deeper else ""),
            evidence={"level_before": lvl_b, "level_after": lvl_a, "level_end": lvl_end, "ratio": ratio,
                      "cliff_step": sr.step(c), "healthy_low": elow if elow is not None else float("nan")},
            causes=["a too-large update made the policy (near-)deterministic",
                    "no entropy bonus and a strong, narrow reward signal",
                    "reward hacking onto one response pattern"],
            check=["KL and clip fraction just before the cliff", "reward after the cliff (still improving?)",
                   "sample diversity of responses/actions"],
            action="resume from before the cliff with a lower learning rate, an entropy bonus or a KL penalty",
            detected_at=sr.step(min(n - 1, c + M - 1)), related=["kl_old_mean", "clip_fraction"]))
    return top(found, ctx, "level_before")


def _entropy_penalised(ctx: Context) -> bool:
    """The run's loss rewards lower entropy (a negative entropy coefficient): a setting that drives the
    policy to determinism, so a cliff is that setting's doing however the return moves."""
    ent = ctx.hp.value("ent_coef") if ctx.hp is not None else None
    return ent is not None and ent < 0


def _learned_through(ctx: Context, start: int, end: int) -> tuple[str, dict[str, float]] | None:
    """What the return did after steps [start, end] (words and evidence) when a control run's return
    kept rising after them, by ``sharpen_rise_noise_k`` times its noise, and held that level to its last
    point; None otherwise, and for language-model runs, whose entropy collapsing while the reward climbs
    is the failure itself (a policy that stops exploring plateaus soon after). What follows the cliff is
    what tells a policy that sharpened on what it learned from one that lost its exploration: a return
    that stops there is the second."""
    rname = ctx.first("reward")
    if rname is None or ctx.run_kind != "control":
        return None
    window = aftermath(ctx)
    after = ctx.values_between(rname, end + 1, end + window)
    sr = ctx.series(rname)
    need = ctx.persist(sr.n)
    if after.size < 2 * need:
        return None
    sign = 1.0 if ctx.higher_is_better(rname) else -1.0
    noise = noise_sigma(sign * after)
    r0, r1 = float(np.median(sign * after[:need])), float(np.median(sign * after[-need:]))
    r_end = float(np.median(sign * sr.y[-need:]))
    if r1 <= r0 + ctx.s.sharpen_rise_noise_k * noise or r_end < r1 - noise:
        return None
    r0, r1, r_end = sign * r0, sign * r1, sign * r_end
    return (f"and the return kept rising after it, from {r0:.4g} to {r1:.4g}, and ended at {r_end:.4g}",
            {"reward_before": r0, "reward_after": r1, "reward_final": r_end})


def _held_at_top(ctx: Context, start: int, end: int) -> tuple[str, dict[str, float]] | None:
    """What the return did around steps [start, end] (words and evidence) when a control run's return
    was already at the top of its task range (``flat_max_level`` or above) over its last updates before
    them and still was over its last ones; None otherwise. A policy that has solved its task has no reason
    to stay random: its entropy falling then is the policy committing to what it learned (the return
    cannot keep rising, so ``_learned_through`` cannot show it)."""
    rname = ctx.first("reward")
    if rname is None or ctx.run_kind != "control":
        return None
    sr = ctx.series(rname)
    need = ctx.persist(sr.n)
    # Its last updates before the cliff: a window's median would trail a return still climbing to the top.
    i = int(np.searchsorted(sr.steps, start))
    if i < need:
        return None
    before = _return_at_top(ctx, sr.step(i - need), sr.step_end(i - 1))
    final = _return_at_top(ctx, sr.step(max(0, sr.n - need)), sr.step_end(sr.n - 1))
    if before is None or final is None:
        return None
    return (f"while the return was already at {before[0]:.4g} ({100 * before[1]:.0f}% of the task range) and "
            f"held there to the end ({final[0]:.4g})",
            {"reward_before": before[0], "reward_final": final[0], "reward_level_in_range": before[1]})


#: Reward findings a narrowing is judged beside: one that stopped improving, slid back, or rose slowly.
_REWARD_SHORTFALLS = ("reward_flat", "reward_drop", "reward_slow")


def detect_entropy_narrowing(ctx: Context) -> list[Finding]:
    """A policy whose entropy fell steadily, with no cliff, to under half its start while its reward
    never improved.

    Healthy control runs end with a low entropy too, so a gradual narrowing is judged only beside
    the reward's own evidence: over the stretch the reward_flat detector found flat (a warning), the
    entropy ended below ``narrowing_entropy_frac`` of its start. Such a policy is losing its
    exploration without having learned, so training on is unlikely to find the reward. A cliff is left to
    :func:`detect_entropy_collapse`; an entropy at or below zero (a Gaussian policy's) gives no
    ratio, and then nothing is said. Runs after the reward detectors (flat, drop, slow).
    """
    found = ctx.first_series("entropy")
    if found is None:
        return []
    name, sr, _ = found
    st = ctx.s
    out = []
    for rf in ctx.findings:
        if rf.detector not in _REWARD_SHORTFALLS or not rf.at_least("warning") or ctx.overlapping(
                "entropy_collapse", rf.start, rf.end) or any(f.evidence.get("gradual") for f in out):
            continue
        if _entropy_penalised(ctx):
            out += _narrowed_by_penalty(ctx, name, sr, rf)
            continue
        if rf.detector != "reward_flat":
            continue
        fell = _steady_fall(ctx, sr, rf.start, rf.end)
        if fell is None:
            continue
        e0, e1, began, crossed = fell
        r0, r1 = rf.evidence.get("early_level"), rf.evidence.get("late_level")
        reward = f" ({r0:.4g} -> {r1:.4g})" if r0 is not None and r1 is not None else ""
        out.append(ctx.finding(
            "entropy_collapse", name, began, rf.end, "warning",
            f"entropy fell steadily {e0:.3g} -> {e1:.3g} ({100 * e1 / e0:.0f}% of its start) while the reward "
            f"stayed flat{reward}: the policy is narrowing without learning",
            evidence={"level_before": e0, "level_after": e1, "ratio": e1 / e0, "gradual": 1.0,
                      "threshold_frac": st.narrowing_entropy_frac},
            causes=["the advantages carry no signal (a reward never reached, or a critic that fits nothing), "
                    "so the policy sharpens on noise",
                    "a negative entropy coefficient", "no entropy bonus on a sparse task"],
            check=["explained variance and value loss (does the critic fit?)",
                   "how often a non-zero reward is seen", "entropy coefficient"],
            action="restart rather than resume (the policy explores less and less): fix what keeps the advantages "
                   "empty, or add an entropy bonus",
            detected_at=crossed, related=["episode_return_mean", "explained_variance"]))
    return out


def _steady_fall(ctx: Context, sr, start: int | None, end: int) -> tuple[float, float, int, int] | None:
    """(start level, end level, step the fall began, step it crossed ``narrowing_entropy_frac`` of the start)
    of the entropy's raw values over steps [start, end] when it ended below that fraction of its start; None
    otherwise or with too few points. The start level is the stretch's early part, or with ``start`` None the
    run's first updates (a narrowing measured from where the policy began); the fall began a tenth of the way
    down."""
    st = ctx.s
    lo, hi = np.searchsorted(sr.raw_steps, [-2**62 if start is None else start, end + 1])
    steps, v = sr.raw_steps[lo:hi], sr.raw_values[lo:hi]
    if v.size < st.min_points_to_judge:
        return None
    k = ctx.early(v.size)
    e0 = float(np.median(v[:ctx.persist(sr.n) if start is None else k]))
    e1 = float(np.median(v[-k:]))
    if e0 <= TINY or e1 <= 0 or e1 > st.narrowing_entropy_frac * e0:
        return None
    smooth = rolling_median(v, k, "trailing")
    began = int(np.argmax(smooth <= e0 - 0.1 * (e0 - e1)))
    crossed = int(np.argmax(smooth <= st.narrowing_entropy_frac * e0))
    return e0, e1, int(steps[began]), int(steps[crossed])


def _narrowed_by_penalty(ctx: Context, name: str, sr, rf: Finding) -> list[Finding]:
    """The entropy's steady fall from the run's start to under ``narrowing_entropy_frac`` of it by the end
    of ``rf`` (a reward that stopped improving, slid back or rose slowly), in a run whose negative entropy
    coefficient rewards determinism: the setting drove the policy narrow and the reward shows the cost. Measured
    from the start, not over ``rf``'s stretch: the narrowing happens while the return still rises, and the
    plateau or slide comes after it."""
    fell = _steady_fall(ctx, sr, None, rf.end)
    if fell is None:
        return []
    e0, e1, began, crossed = fell
    what = {"reward_flat": "stopped improving", "reward_drop": "slid back", "reward_slow": "rose slowly"}[rf.detector]
    return [ctx.finding(
        "entropy_collapse", name, began, rf.end, "warning",
        f"entropy fell steadily {e0:.3g} -> {e1:.3g} ({100 * e1 / e0:.0f}% of its start) under "
        f"{ctx.hp.get('ent_coef').describe()}, which rewards determinism, and the reward {what} "
        f"(steps {rf.start}-{rf.end})",
        evidence={"level_before": e0, "level_after": e1, "ratio": e1 / e0, "gradual": 1.0,
                  "threshold_frac": ctx.s.narrowing_entropy_frac},
        causes=["a negative entropy coefficient pushes the policy to determinism"],
        check=["entropy coefficient", "the return after the narrowing"],
        action="restart with a non-negative entropy coefficient",
        detected_at=crossed, related=["episode_return_mean"])]


# ---------------------------------------------------------------------------------------
# Value loss not decreasing
# ---------------------------------------------------------------------------------------
def _return_at_top(ctx: Context, start: int, end: int) -> tuple[float, float] | None:
    """(median return over steps [start, end], its level in the task range) when that level is
    ``flat_max_level`` or above; None otherwise or without a dictionary task range."""
    rname = ctx.first("reward")
    if rname is None:
        return None
    rv = ctx.values_between(rname, start, end)
    if rv.size == 0:
        return None
    final = float(np.median(rv))
    level = level_in_task_range(ctx, rname, final)
    return (final, level) if level is not None and level >= ctx.s.flat_max_level else None


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
    at_top = None if good_fit or chasing or scaled else _return_at_top(ctx, sr.step(max(a, n - e)), end)
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
