"""Constraint-layer detectors of the clip fraction: too high (or ordinary beside a tiny KL, which is a
narrow clip range), and too low (updates too conservative, when the KL corroborates it)."""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.ranges import baseline_source
from registry.analysis.diagnosis.signal import TINY, Series, merge_close, rolling_median, runs
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import Rising, reward_still_rising, reward_top_reached, top


def detect_clip_high(ctx: Context) -> list[Finding]:
    found = ctx.first_series("clip_fraction")
    if found is None:
        return []
    name, sr, n = found
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
    found += _clipped_small_steps(ctx, name, sr, covered)
    return top(found, ctx, "points")


def _effective_clip_range(clip_fraction: np.ndarray, kl: np.ndarray) -> np.ndarray:
    """The ratio bound that clips ``clip_fraction`` of the samples of an update whose KL to the old
    policy is ``kl``: NaN where either says nothing.

    For a small step the per-sample log-ratio r has mean ~0 and KL ~ E[r^2] / 2 (k1 in
    expectation, k2 and k3 per sample), so r spreads with sigma ~ sqrt(2 KL); if a share c of
    samples leaves [1 - eps, 1 + eps], then eps ~ sigma * z(1 - c / 2) (z the normal quantile).
    Healthy SB3 runs give about 0.2 (their clip_range); a run set to 0.03 gives about 0.03.
    """
    z = NormalDist().inv_cdf
    out = np.full(clip_fraction.shape, np.nan)
    for i, (c, k) in enumerate(zip(clip_fraction, kl)):
        if 0 < c < 1 and k > 0:
            out[i] = math.sqrt(2 * k) * z(1 - c / 2)
    return out


def _clipped_small_steps(ctx: Context, name: str, sr: Series, covered: np.ndarray) -> list[Finding]:
    """Updates clipped although the policy barely moves: the clip fraction is in its range (or above it)
    while the KL is so small that only a narrow bound can clip that many samples. A clip fraction
    alone cannot show this (0.11 is ordinary), nor a KL alone (a small KL is also a slow learning
    rate); together they give the clip range the run effectively trains with. Narrow is a third of
    the usual range, or, when the run sets a range that far below its default, anything up to
    ``clip_binding_factor`` times the set value: the curves confirm the set bound is what clips."""
    kl_name = ctx.first("kl_update")
    low, _ = ctx.range(name)
    if kl_name is None or low is None:
        return []
    st = ctx.s
    kl = ctx.series(kl_name)
    n = sr.n
    L = max(ctx.persist(n), int(np.ceil(st.clip_low_min_frac * n)))
    if n < L + 2:
        return []
    cf = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
    kls = np.interp(sr.steps, kl.steps, rolling_median(kl.y, max(1, ctx.window(kl_name, kl)), "centered"))
    eps = _effective_clip_range(cf, kls)
    setting = ctx.hp.get("clip_range") if ctx.hp is not None else None
    usual = setting.default if setting is not None and setting.default else st.usual_clip_range
    narrow = usual / st.cause_setting_factor
    far = setting.far(st.cause_setting_factor) if setting is not None else None
    declared = setting if far is not None and 0 < far < 1 else None
    bound = max(narrow, st.clip_binding_factor * declared.value) if declared is not None else narrow
    found = []
    with np.errstate(invalid="ignore"):
        cond = (cf >= low) & (eps < bound) & ~covered
    # a break shorter than a stretch that counts on its own does not split the finding in two
    for a, b in merge_close(runs(cond, L), L):
        e, c = float(np.nanmedian(eps[a:b + 1])), float(np.median(sr.y[a:b + 1]))
        k = float(np.median(kls[a:b + 1]))  # the KL at the clip fraction's steps, wherever it was logged
        found.append(ctx.finding(
            "clip_high", name, sr.step(a), sr.step_end(b), "warning",
            f"updates clipped although the policy barely moves: clip fraction {c:.3g} with KL {k:.2g} means a "
            f"clip range of about {e:.2g}, {usual / e:.0f}x narrower than the usual {usual:g}"
            + (f" (the run sets {declared.describe()})" if declared is not None else "")
            + f", for {(b - a + 1) * sr.bin_size} points",
            evidence={"median": c, "kl_median": k, "effective_clip_range": e, "usual_clip_range": usual,
                      "points": (b - a + 1) * sr.bin_size,
                      **({"declared_clip_range": declared.value} if declared is not None else {})},
            causes=["the clip range is too small: ordinary updates leave [1 - eps, 1 + eps] and stop there"],
            check=["the clip range setting", "learning rate (is the step small because of it?)"],
            action=f"raise the clip range towards {usual:g}",
            detected_at=sr.step(min(a + L - 1, n - 1)), related=[kl_name, "clip_range"]))
    return found


def _kl_small_for_the_task(ctx: Context, kl_name: str, start: int, end: int) -> tuple[float, str, int] | None:
    """(ratio, per-phase text, last step) when the KL over [start, end] is small for the task though
    not in absolute terms: the geometric mean of its ratio to the healthy runs' KL over the baseline's
    phases is at most ``kl_conservative_baseline_ratio``. Only the phases from the start on in which
    the KL stays below ``kl_recovered_ratio`` of the healthy runs' count, and the stretch ends with
    the last of them: a KL that has come back to the healthy runs' level says the updates are no
    longer small. None without a baseline of three or more runs, or when the first phase's KL is not
    small. A ratio, not band widths: a KL spans orders of magnitude, and its bands are so wide in
    linear terms that a KL five times below the healthy runs' is inside them."""
    st = ctx.s
    if ctx.baseline is None or ctx.baseline.weak:
        return None
    low = []
    for phase, band, _, hi, med in ctx.phase_medians(kl_name, ctx.baseline, start, end):
        healthy = band.median
        if healthy <= 0:
            continue
        if med / healthy > st.kl_recovered_ratio:
            break
        low.append((phase, hi, med, healthy))
    if not low:
        return None
    ratio = float(np.exp(np.mean([np.log(max(m, TINY) / h) for _, _, m, h in low])))
    if ratio > st.kl_conservative_baseline_ratio:
        return None
    text = ", ".join(f"{p} {m:.2g} vs {h:.2g}" for p, _, m, h in low)
    return ratio, text, min(end, low[-1][1])


def detect_clip_low(ctx: Context) -> list[Finding]:
    found = ctx.first_series("clip_fraction")
    if found is None:
        return []
    name, sr, n = found
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
        if kl_name is None:
            found.append(_clip_low_finding(ctx, name, sr, a, b, L, None, None))
            continue
        kl_low, kl_high = ctx.range(kl_name)
        kl_level = ctx.median_between(kl_name, sr.step(a), sr.step_end(b))
        ref = kl_low if kl_low is not None else (st.kl_conservative_frac * kl_high if kl_high is not None else None)
        if kl_level is not None and ref is not None and kl_level < ref:
            # Say which bound it was: the definition's low, or a share of its high when it has no low.
            bound = (f" below its healthy low {ref:g}" if kl_low is not None else
                     f" below {ref:g} ({100 * st.kl_conservative_frac:g}% of its healthy high {kl_high:g})")
            found.append(_clip_low_finding(ctx, name, sr, a, b, L, bound, {"kl_healthy_low": ref}))
            continue
        small = _kl_small_for_the_task(ctx, kl_name, sr.step(a), sr.step_end(b))
        split = min(b, max(a, int(np.searchsorted(sr.steps, small[2], side="right")) - 1)) if small else a
        if small is None or split - a + 1 < L:   # small only briefly: not persistently conservative
            found.append(_clip_low_finding(ctx, name, sr, a, b, L, None,
                                           {"kl_healthy_low": ref} if ref is not None else {}))
            continue
        ratio, phases, _ = small
        found.append(_clip_low_finding(
            ctx, name, sr, a, split, L,
            f", {1 / max(ratio, TINY):.2g}x below the healthy runs' ({phases}; {baseline_source(ctx.baseline)})",
            {"kl_ratio_to_baseline": ratio}))
        if split < b:  # the KL came back to the healthy runs' level: what follows is judged on its own
            found.append(_clip_low_finding(ctx, name, sr, split + 1, b, 1, None, {}))
    return found[: st.max_findings_per_metric]


def _held_back(ctx: Context, sr: Series, a: int, b: int) -> Rising | None:
    """The still-rising reward when the clip fraction over bins [a, b] sits below
    ``clip_held_back_factor`` of its healthy low from the start of training: updates that stay far
    inside the clip range from the first rollouts on, while the reward has not levelled off, are
    holding the run back (a healthy run clips more early on, when its policy changes most; one
    that has converged clips little, but its reward no longer rises). None otherwise, and when the
    run's clip range is far above its default: then the clip fraction is low by construction and
    says nothing of the update size."""
    low, _ = ctx.range(sr.name)
    if low is None or a >= ctx.early(sr.n) or float(np.median(sr.y[a:b + 1])) >= ctx.s.clip_held_back_factor * low:
        return None
    clip = ctx.hp.get("clip_range") if ctx.hp is not None else None
    if clip is not None and (clip.far(ctx.s.cause_setting_factor) or 0) > 1:
        return None
    return reward_still_rising(ctx)


#: The settings that set how far one update moves the policy.
UPDATE_SIZE_KNOBS = ("learning_rate", "n_epochs", "clip_range")


def _small_by_design(ctx: Context, ev: dict) -> list | None:
    """The run's settings when every one read is its framework's default (the update-size ones among
    them) and only the generic ranges call its updates small (no healthy runs of the task say so:
    ``kl_ratio_to_baseline`` is absent).

    A framework's default configuration is its authors' reference, and small updates are what some of
    them make by design: CleanRL's ppo.py (fe8d8a03: 4 epochs, 128-sample minibatches, a learning rate
    annealed to zero, its approx_kl read on the last minibatch) logs a clip fraction of 0 and a KL near
    1e-5 through healthy CartPole and Acrobot runs that learn (tests/data/real/cleanrl_sweep, batch 28).
    Then "too conservative: raise the learning rate" has nothing in the run to stand on: the settings
    are the reference, and whether this task needs more is what a baseline of its healthy runs tells."""
    if ctx.hp is None or "kl_ratio_to_baseline" in ev:
        return None
    return ctx.hp.at_framework_defaults(UPDATE_SIZE_KNOBS, ctx.s.cause_setting_factor)


def _clip_low_by_design(ctx: Context, name: str, sr: Series, a: int, b: int, L: int, med: float, low: float,
                        ev: dict, settings: list) -> Finding:
    """The information that a clip fraction below the generic range comes with the framework's default
    update settings (see :func:`_small_by_design`)."""
    start, end = sr.step(a), sr.step_end(b)
    kl = f" and KL {ev['kl_median']:.2g}" if ev.get("kl_median") is not None else ""
    ev["update_settings_at_default"] = 1.0
    return ctx.finding(
        "clip_low", name, start, end, "info",
        f"clip fraction {med:.3g} below {low:g}{kl} for {(b - a + 1) * sr.bin_size} points, with every setting "
        f"read at the framework's default ({'; '.join(s.describe() for s in settings)}): small updates are what "
        f"its reference configuration makes, and nothing in the run says they are too small for this task",
        evidence=ev, causes=["the framework's default update size (its reference configuration)"],
        check=["a baseline of this task's healthy runs (is their clip fraction higher?)",
               "the return: does it keep improving?"],
        action="nothing, unless the task's healthy runs update more: then raise the learning rate or epochs",
        detected_at=sr.step(min(a + L - 1, sr.n - 1)), related=["kl_old_mean", "learning_rate"])


def _clip_low_finding(ctx: Context, name: str, sr: Series, a: int, b: int, L: int, kl_bound: str | None,
                      extra: dict | None) -> Finding:
    """The clip_low finding over bins [a, b]: "too conservative" (a warning) when the KL corroborates
    it (``kl_bound`` says against what) or when the clip fraction stays near zero from the start
    while the reward is still rising (:func:`_held_back`), else information. ``extra`` is None
    without a KL curve: then a clip fraction near zero corroborates on its own."""
    st = ctx.s
    low, _ = ctx.range(name)
    kl_name = ctx.first("kl_update")
    start, end = sr.step(a), sr.step_end(b)
    med = float(np.median(sr.y[a:b + 1]))
    ev = {"median": med, "healthy_low": low, "points": (b - a + 1) * sr.bin_size}
    held_back = _held_back(ctx, sr, a, b)
    if extra is None:
        # A language model's trainer counts a token only when the clipped branch is the active one (sign-aware,
        # per token): published verl GSM8K logs show pg_clipfrac 0.000-0.001 (tests/data/real/published; the sglang
        # tutorial's steps 80-83 at a validation accuracy of 0.83), so near zero says nothing on its own there; a
        # control run's sign-agnostic count near zero does.
        near_zero = med < st.clip_near_zero_factor * low and ctx.run_kind != "llm"
        corroborated = near_zero or held_back is not None
    else:
        ev["kl_median"] = ctx.median_between(kl_name, start, end)
        ev.update(extra)
        corroborated = kl_bound is not None or held_back is not None
    by_design = _small_by_design(ctx, ev) if corroborated else None
    if by_design is not None:
        return _clip_low_by_design(ctx, name, sr, a, b, L, med, low, ev, by_design)
    top = reward_top_reached(ctx, start, end) if corroborated else None
    if top is not None:
        # The objective says otherwise: updates that took the return to the top of its task range
        # were large enough for the task, however small the clip fraction and KL look.
        ev.update({"reward_best": top[0], "reward_level_in_range": top[1]})
        corroborated = False
    why = f" and KL {ev['kl_median']:.2g}{kl_bound}" if kl_bound else ""
    if held_back is not None:
        ev.update({"held_back_from_start": 1.0, "reward_rising_from": held_back.level_from,
                   "reward_rising_to": held_back.level_to, "reward_rising_corr": held_back.corr})
        if not kl_bound:
            kl_words = f", KL {ev['kl_median']:.2g}" if ev.get("kl_median") is not None else ""
            why = (f" from the start of training (below {st.clip_held_back_factor * low:g}{kl_words}) while "
                   f"{held_back.words()}: the updates stay far inside the clip range")
    collapsed = ctx.overlapping("entropy_collapse", start, end, int(st.joint_overlap_frac * ctx.span))
    causes = ["learning rate too small (the policy barely moves)", "too few epochs / too large minibatches",
              "clip range much wider than the actual update"]
    if collapsed:
        causes.insert(0, "the policy has collapsed (entropy near zero), so updates no longer change it")
    return ctx.finding(
        "clip_low", name, start, end, "warning" if corroborated else "info",
        (f"updates too conservative: clip fraction {med:.3g} < {low:g}{why}" if corroborated else
         f"clip fraction {med:.3g} below {low:g} for {(b - a + 1) * sr.bin_size} points, but the return reached "
         f"{ev['reward_best']:.4g} ({100 * ev['reward_level_in_range']:.0f}% of its task range) over them: the "
         f"updates were large enough for the task" if "reward_best" in ev else
         (f"clip fraction {med:.3g} below {low:g} for {(b - a + 1) * sr.bin_size} points, "
          + ("a language model trainer's sign-aware token count, as low in healthy runs" if ctx.run_kind == "llm"
             else "not near zero")
          + "; no KL to the old policy is logged to say whether the updates are small") if extra is None else
         f"clip fraction {med:.3g} below {low:g}, but KL is in range: the policy still moves for "
         f"{(b - a + 1) * sr.bin_size} points"),
        evidence=ev, causes=causes,
        check=["learning rate (and its schedule)", "KL to the old policy", "entropy (collapsed policy?)"],
        action="raise the learning rate (or epochs per rollout) until clip fraction is in range",
        detected_at=sr.step(min(a + L - 1, sr.n - 1)), related=["kl_old_mean", "learning_rate"])
