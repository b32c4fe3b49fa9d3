"""Joint detectors: what real GRPO/PPO logs need beyond one metric at a time.

* ``truncation``: a large share of responses cut at the maximum length;
* ``advantage_degenerate``: every advantage exactly zero (no learning signal at all), or a
  large / rising share of prompt groups whose rewards are all equal (zero-std groups);
* ``kl_coef_opposite``: the KL penalty coefficient and the KL moving in opposite directions
  (the penalty weakens while the policy drifts, or tightens while the KL is already falling);
* ``eval_diverging``: the evaluation reward falling while the training reward rises
  (overfitting to the training prompts, or reward hacking);
* ``components_diverging``: the total reward rising while one of its components falls;
* ``unusual_setting`` (information): a setting far from its reference.

Each returns findings in the same form as the core detectors, with the layer of the metric
they are about (triage order: diagnostic, constraint, objective).
"""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.detectors.common import gain_in_standard_errors
from registry.analysis.diagnosis.signal import rank_corr, rolling_median, runs
from registry.analysis.diagnosis.types import Finding


def detect_truncation(ctx: Context) -> list[Finding]:
    found = ctx.first_series("truncation")
    if found is None:
        return []
    name, sr, n = found
    st = ctx.s
    M = ctx.persist(n)
    if n < max(3, M):
        return []
    _, high = ctx.range(name)
    if high is None:
        return []
    s = rolling_median(sr.y, max(1, min(ctx.window(name, sr), M)), "centered")
    out = []
    for a, b in runs(s > high, M)[: st.max_findings_per_metric]:
        med = float(np.median(sr.y[a:b + 1]))
        sev = "critical" if med >= st.truncation_critical else "warning"
        start, end = sr.step(a), sr.step_end(b)
        ev = {"median": med, "max": float(sr.ymax[a:b + 1].max()), "threshold": high,
              "points": (b - a + 1) * sr.bin_size}
        causes = []
        mx = ctx.hp.get("max_response_length") if ctx.hp is not None else None
        if mx is not None:
            causes.append(f"the maximum response length is too short for this task: {mx.describe()}")
        lname = ctx.first("length")
        if lname is not None:
            v = ctx.values_between(lname, start, end)
            if v.size >= 4:
                k = max(1, v.size // 4)
                ev["length_start"], ev["length_end"] = float(np.median(v[:k])), float(np.median(v[-k:]))
                if ev["length_end"] > 1.1 * ev["length_start"]:
                    causes.append(f"responses keep growing ({ev['length_start']:.4g} -> {ev['length_end']:.4g} "
                                  f"tokens) into the limit")
        causes += ["the policy loops or rambles without emitting an end-of-sequence token",
                   "a length-correlated reward pays for longer answers"]
        out.append(ctx.finding(
            "truncation", name, start, end, sev,
            f"{100 * med:.0f}% of responses cut at the maximum length (above {100 * high:.0f}%) for "
            f"{(b - a + 1) * sr.bin_size} points",
            evidence=ev, causes=causes,
            check=["samples of truncated responses (looping? unfinished reasoning?)",
                   "the maximum response length vs the lengths the task needs",
                   "whether truncated responses are masked from the loss"],
            action="raise the maximum response length, or mask truncated completions and add a length penalty",
            detected_at=sr.step(min(n - 1, a + M - 1)), related=["response_length_mean"]))
    return out


def detect_advantage_degenerate(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    st = ctx.s
    # (a) every advantage exactly zero: max and min (or the std) are 0 at the same steps.
    cols = [m for m in ("advantage_max", "advantage_min", "advantage_std") if ctx.series(m) is not None]
    if cols:
        masks = []
        ref = ctx.series(cols[0])
        for m in cols:
            sr = ctx.series(m)
            zero = np.abs(sr.raw_values) == 0.0
            masks.append(np.interp(ref.raw_steps.astype(float), sr.raw_steps.astype(float), zero.astype(float)) >= 1)
        allzero = np.logical_and.reduce(masks)
        n = allzero.size
        M = max(2, ctx.persist(n))
        for a, b in runs(allzero, min(M, max(2, n)))[:1]:
            start, end = int(ref.raw_steps[a]), int(ref.raw_steps[b])
            share = (b - a + 1) / n
            pl = ctx.first("policy_loss")
            ev = {"points": b - a + 1, "share": share}
            if pl is not None:
                v = ctx.values_between(pl, start, end)
                if v.size:
                    ev["policy_loss_zero_share"] = float(np.mean(v == 0.0))
            out.append(ctx.finding(
                "advantage_degenerate", cols[0], start, end, "critical" if share >= 0.5 else "warning",
                f"every advantage is exactly 0 ({', '.join(cols)} all 0) for {b - a + 1} of {n} points: "
                f"no learning signal",
                evidence=ev,
                causes=["every response of every group gets the same reward (all right or all wrong)",
                        "the reward function returns a constant (crashed, or a format check nobody passes)",
                        "advantages are normalised by a zero std and then zeroed"],
                check=["raw rewards of one batch", "the share of groups with zero reward std",
                       "samples of responses with their rewards"],
                action="fix the reward (or the prompt difficulty) so that responses of a group differ in reward",
                detected_at=int(ref.raw_steps[min(b, a + M - 1)]), related=["policy_loss", "reward_std"],
                layer="diagnostic"))
    # (b) share of zero-std groups high or rising.
    name = ctx.first("zero_std_frac")
    if name is not None:
        sr = ctx.series(name)
        n = sr.n
        if n >= max(4, st.min_points_to_judge // 2):
            e = ctx.early(n)
            # Means, not medians: a batch of two prompts gives shares of 0, 0.5 or 1, whose median over a window
            # jumps between them; the mean is the share over all the window's groups.
            early, late = float(np.mean(sr.y[:e])), float(np.mean(sr.y[-e:]))
            corr = rank_corr(rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered"))
            rising = late - early >= st.zero_std_rise and corr >= 0.5
            _, high = ctx.range(name)
            if high is not None and ctx.ranges_used[name].get("read_as") == "mean" and e >= 3:
                # The highest healthy run's mean: above it by more than this run's own batch luck.
                high += st.zero_std_above_healthy_se * float(np.std(sr.y[-e:], ddof=1)) / np.sqrt(e)
            if (high is not None and late >= high) or rising:
                # A share that was already this high at the start and did not rise is the task's own (a sparse
                # reward over small groups): information while the reward improves anyway. Most groups alike
                # (``zero_std_critical``) is critical unless a language model's reward still gained past its batch
                # noise (a policy sure of the prompts it solves, the others carrying the learning); nearly every
                # group alike (``zero_std_total``) is critical whatever the reward did.
                stalled = any(g.at_least("warning") for d in ("reward_flat", "reward_slow")
                              for g in ctx.overlapping(d, sr.step(0), sr.step_end(n - 1)))
                gradient = _gradient_left(ctx)
                no_gradient = gradient is not None and gradient[0] < st.zero_std_gradient_left
                gained = _reward_gained(ctx) and not stalled and not no_gradient
                sev = ("critical" if late >= st.zero_std_total or late >= st.zero_std_critical and not gained
                       else "warning" if (rising or stalled) and not gained else "info")
                ev = {"early": early, "late": late, "rank_corr": corr}
                if gradient is not None:
                    ev.update(gradient_left=gradient[0], grad_norm_early=gradient[1], grad_norm_late=gradient[2])
                out.append(ctx.finding(
                    "advantage_degenerate", name, sr.step(0 if not rising else e), sr.step_end(n - 1), sev,
                    f"{100 * late:.0f}% of prompt groups have zero reward std (all responses rewarded alike)"
                    + (f", up from {100 * early:.0f}%" if rising else "") + ": those groups give no gradient"
                    + ("; the reward still gained past its batch noise, so the other groups carry the learning "
                       "(a batch used inefficiently, not a failure)" if sev == "info" and gained else "")
                    + (f"; the gradient norm fell to {gradient[2]:.2g}, {gradient[0]:.2g}x its early "
                       f"{gradient[1]:.2g}: no learning signal is left"
                       if no_gradient and late >= st.zero_std_critical else ""),
                    evidence=ev,
                    causes=["the prompts became too easy (all correct) or are too hard (all wrong)",
                            "the group size is too small to see different rewards",
                            "the policy collapsed to one answer per prompt (entropy)"],
                    check=["reward mean: near its ceiling (too easy) or floor (too hard)?", "group size", "entropy"],
                    action="filter or re-balance prompts by difficulty (dynamic sampling), or enlarge the groups",
                    detected_at=sr.step_end(n - 1), related=["reward_std", "entropy"], layer="diagnostic"))
    return out


def _gradient_left(ctx: Context) -> tuple[float, float, float] | None:
    """(late / early, early, late) medians of the gradient norm over the run's first and last ``early`` points;
    None without a gradient-norm curve long enough, or with an early median of 0."""
    name = ctx.first("grad_norm")
    sr = ctx.series(name) if name is not None else None
    if sr is None or sr.n < 2 * ctx.early(sr.n):
        return None
    e = ctx.early(sr.n)
    first, last = float(np.median(sr.raw_values[:e])), float(np.median(sr.raw_values[-e:]))
    return (last / first, first, last) if first > 0 else None


def _reward_gained(ctx: Context) -> bool:
    """Did a language model's reward gain past its batch noise over the run (its last ``early`` points against its
    first, ``flat_llm_gain_se`` standard errors)? False for a control run or without a reward."""
    name = ctx.first("reward")
    if name is None:
        return False
    sr = ctx.series(name)
    e = ctx.early(sr.n)
    y = sr.y if ctx.higher_is_better(name) else -sr.y
    t = gain_in_standard_errors(ctx, y[:e], y[-e:]) if sr.n >= 2 * e else None
    return t is not None and t >= ctx.s.flat_llm_gain_se


def _trend(ctx: Context, name: str) -> tuple[float, float, float] | None:
    """(rank correlation with time, early level, late level) of a smoothed curve."""
    sr = ctx.series(name)
    if sr is None or sr.n < ctx.s.min_points_to_judge:
        return None
    s = rolling_median(sr.y, max(1, ctx.window(name, sr)), "centered")
    e = ctx.early(sr.n)
    return rank_corr(s), float(np.median(sr.y[:e])), float(np.median(sr.y[-e:]))


def detect_kl_coef_opposite(ctx: Context) -> list[Finding]:
    cname, kname = ctx.first("kl_coef"), ctx.first("kl")
    if cname is None or kname is None:
        return []
    tc, tk = _trend(ctx, cname), _trend(ctx, kname)
    if tc is None or tk is None:
        return []
    st = ctx.s
    (cc, c0, c1), (kc, k0, k1) = tc, tk

    def moved(r: float, a: float, b: float) -> int:
        rel = (b - a) / max(abs(a), abs(b), 1e-12)
        if abs(r) >= st.coupled_min_corr and abs(rel) >= st.coupled_min_change:
            return 1 if b > a else -1
        return 0

    dc, dk = moved(cc, c0, c1), moved(kc, k0, k1)
    if not dc or not dk or dc == dk:
        return []
    sc, sk = ctx.series(cname), ctx.series(kname)
    weakening = dc < 0 and dk > 0
    title = (f"KL coefficient fell {c0:.3g} -> {c1:.3g} while {kname} rose {k0:.3g} -> {k1:.3g}: the penalty "
             f"weakens as the policy drifts" if weakening else
             f"KL coefficient rose {c0:.3g} -> {c1:.3g} while {kname} fell {k0:.3g} -> {k1:.3g}: the penalty "
             f"keeps tightening on a policy that already stays close")
    return [ctx.finding(
        "kl_coef_opposite", cname, max(sc.step(0), sk.step(0)), min(sc.step_end(sc.n - 1), sk.step_end(sk.n - 1)),
        "warning", title,
        evidence={"coef_start": c0, "coef_end": c1, "kl_start": k0, "kl_end": k1, "coef_corr": cc, "kl_corr": kc},
        causes=(["a KL-coefficient schedule that decays while the policy still drifts",
                 "an adaptive controller whose target KL is set too high"] if weakening else
                ["an adaptive controller whose target KL is set too low (it keeps raising the penalty)",
                 "a coefficient schedule that grows regardless of the KL"]),
        check=["the KL controller type, target and horizon", "reward over the same steps"],
        action=("stop the coefficient from decaying (fixed coefficient or a lower target KL)" if weakening else
                "raise the adaptive controller's target KL or fix the coefficient"),
        detected_at=sk.step_end(sk.n - 1), related=[kname], layer="constraint")]


def detect_eval_diverging(ctx: Context) -> list[Finding]:
    ename, rname = ctx.first("eval_reward"), ctx.first("reward")
    if ename is None or rname is None or ename == rname:
        return []
    se = ctx.series(ename)
    if se is None or se.n < 4:
        return []
    st = ctx.s
    ye = se.y
    best = int(np.argmax(ye))
    if best >= se.n - 1:
        return []
    peak, last = float(ye[best]), float(np.median(ye[-max(1, min(3, se.n - best - 1)):]))
    scale = max(float(np.max(ye) - np.min(ye)), abs(peak) * 0.05, 1e-12)
    fall = (peak - last) / max(abs(peak), 1e-12)
    start, end = se.step(best), se.step_end(se.n - 1)
    tr = ctx.values_between(rname, start, end)
    if tr.size < 3 or fall < st.eval_min_fall:
        return []
    k = max(1, tr.size // 3)
    rise = float(np.median(tr[-k:]) - np.median(tr[:k]))
    if rise <= 0:
        return []
    return [ctx.finding(
        "eval_diverging", ename, start, end, "warning",
        f"evaluation reward fell {100 * fall:.0f}% from its best {peak:.4g} (step {start}) to {last:.4g} "
        f"while the training reward rose by {rise:.4g}",
        evidence={"eval_best": peak, "eval_last": last, "fall": fall, "train_rise": rise, "scale": scale},
        causes=["overfitting to the training prompts", "reward hacking: the training reward pays for something "
                "the evaluation does not", "a shift between training and evaluation data"],
        check=["samples at the best and the last evaluation", "reward components on training batches"],
        action=f"keep the checkpoint nearest step {start}; inspect what the training reward pays for",
        detected_at=end, related=[rname], layer="objective")]


def detect_components_diverging(ctx: Context) -> list[Finding]:
    """The total reward rising while a component of it falls: the gain comes from another
    component (typically format up, accuracy down)."""
    total = ctx.first("reward")
    comps = [c for c in ctx.role("reward_components") if c != total]
    if total is None or len(comps) < 1:
        return []
    t = _trend(ctx, total)
    if t is None:
        return []
    st = ctx.s
    tc, t0, t1 = t
    if tc < st.coupled_min_corr or t1 <= t0:
        return []
    moves = {}
    for c in comps:
        tr = _trend(ctx, c)
        if tr is not None:
            moves[c] = tr
    falling = [c for c, (r, a, b) in moves.items() if r <= -st.coupled_min_corr and b < a]
    if not falling:
        return []
    rising = [c for c, (r, a, b) in moves.items() if r >= st.coupled_min_corr and b > a]
    c = falling[0]
    _, a, b = moves[c]
    sc, st_ = ctx.series(c), ctx.series(total)
    return [ctx.finding(
        "components_diverging", c, max(sc.step(0), st_.step(0)), min(sc.step_end(sc.n - 1), st_.step_end(st_.n - 1)),
        "warning",
        f"{total} rose {t0:.3g} -> {t1:.3g} while its component {c} fell {a:.3g} -> {b:.3g}"
        + (f" ({', '.join(rising)} rising)" if rising else ""),
        evidence={"total_start": t0, "total_end": t1, "component_start": a, "component_end": b},
        causes=[f"the gain comes from {', '.join(rising)}, not from {c}" if rising else
                f"the gain comes from another component than {c}",
                "reward hacking of an easier component (format, length)"],
        check=["samples: do the responses solve the task or only satisfy the format?",
               "the weights of the reward components"],
        action=f"re-weight the reward components so that {c} cannot be traded away",
        detected_at=st_.step_end(st_.n - 1), related=[total] + rising, layer="objective")]


def detect_unusual_settings(ctx: Context) -> list[Finding]:
    """Information: settings far from their reference (or a negative entropy coefficient), so a
    reader sees them even when no curve has gone wrong (yet)."""
    hp = ctx.hp
    if hp is None or ctx.first_step is None:
        return []
    out = []
    for s in hp.settings.values():
        r = s.ratio()
        negative = s.knob == "ent_coef" and s.value < 0
        far = s.far(ctx.s.cause_setting_factor) is not None
        if s.knob == "ent_coef" and s.value >= ctx.s.cause_ent_coef_large and not (r and r < ctx.s.cause_setting_factor):
            far = True                       # a large bonus where the reference is 0
        if not (negative or far):
            continue
        out.append(ctx.finding(
            "unusual_setting", f"param:{s.key or s.knob}", ctx.first_step, ctx.last_step, "info",
            f"{s.describe()}" + ("; a negative entropy coefficient rewards determinism" if negative else ""),
            evidence={"value": s.value, "reference": s.reference if s.reference is not None else float("nan")},
            causes=[f"read from {s.source}" + (f"; default from {s.default_source}" if s.default_source else "")],
            check=["whether this setting was intended"], action="", layer="diagnostic"))
    return out


JOINT_DETECTORS = (
    ("unusual_setting", detect_unusual_settings),
    ("components_diverging", detect_components_diverging),
    ("truncation", detect_truncation),
    ("advantage_degenerate", detect_advantage_degenerate),
    ("kl_coef_opposite", detect_kl_coef_opposite),
    ("eval_diverging", detect_eval_diverging),
)
