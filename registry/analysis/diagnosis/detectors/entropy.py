"""Constraint-layer detectors of the policy's entropy: a cliff (``detect_entropy_collapse``), and a steady
narrowing beside a reward that stopped improving or under a negative entropy coefficient
(``detect_entropy_narrowing``). KL, value and policy losses are in ``constraint``."""
from __future__ import annotations

import numpy as np

from registry.analysis.diagnosis.baseline import PHASES
from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.signal import (
    TINY,
    merge_close,
    noise_sigma,
    rolling_median,
    runs,
    shift,
)
from registry.analysis.diagnosis.types import Finding
from registry.analysis.diagnosis.detectors.common import (
    aftermath,
    instability_words,
    return_at_top,
    top,
    unstable_updates,
)


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
        if ctx.run_kind == "control":
            # What the return did tells a control policy that sharpened on what it learned.
            learned = None if unstable else _learned_through(ctx, start, stop)
            if learned is None and not unstable_updates(ctx, since, stop, "critical"):
                learned = _held_at_top(ctx, start, stop)
            lvl_end = lvl_a
        else:
            # A language model's: where it lands. Its level over the whole stretch it stays down, not at the
            # stretch's last points (the bottom, just before it climbs back).
            end, lvl_end = _stays_down(ctx, y, c, thr, M)
            learned = _where_healthy_runs_are(ctx, name, sr.step_end(end), float(np.median(y[c:end + 1])))
            if learned is not None:
                stop = sr.step_end(end)
        if learned is not None and not _entropy_penalised(ctx):
            words, evidence = learned
            # "findings", not "warnings": a KL spike that nothing followed becomes information afterwards.
            beside = (f"beside {instability_words(unstable, 'findings')}: large updates, but" if unstable else
                      "with no KL or clip-fraction warning over it:")
            found.append(ctx.finding(
                "entropy_collapse", name, start, stop, "info",
                f"entropy fell fast: {lvl_b:.3g} -> {lvl_a:.3g} within {(c - a + G) * sr.bin_size} points, {words}, "
                f"{beside} the policy sharpened as {'it learned' if ctx.run_kind == 'control' else 'they do'}",
                evidence={"level_before": lvl_b, "level_after": lvl_a, "ratio": ratio, "cliff_step": sr.step(c),
                          "learning": 1.0, **evidence},
                check=["the return, if it stops improving while the entropy keeps falling"],
                related=["kl_old_mean", "clip_fraction"]))
            continue
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


def _stays_down(ctx: Context, y: np.ndarray, c: int, thr: float, M: int) -> tuple[int, float]:
    """(last point, level there) of a language model's token entropy that stays under ``thr`` from its cliff
    at ``c`` (or from just after it, when the drop lands above ``thr`` on its way down), a point or two back
    above not ending it: a token entropy that keeps falling after its cliff is collapsing onto one answer."""
    seg = merge_close(runs(y[c:] < thr), M)
    end = c + (seg[0][1] if seg and seg[0][0] <= M else 0)
    return end, float(np.median(y[max(c, end - M + 1):end + 1]))


def _where_healthy_runs_are(ctx: Context, name: str, end: int, level: float) -> tuple[str, dict] | None:
    """Words and evidence when a language model's token entropy, after its cliff, stays (to step ``end``)
    at or above the low of the band the task's healthy runs have in the phase the run is in or heading
    into; None otherwise, and without a baseline of three or more runs. A language model's entropy
    halving within a few batches is how a small policy commits to an answer format; whether that is a
    collapse is told by where it lands: healthy seeds of the task land there too (0.3-0.5 from 1.0),
    collapsed ones far below (0.0003-0.04)."""
    base = ctx.baseline
    if base is None or base.weak or name not in base.metrics:
        return None
    mb = base.metrics[name]
    for phase in PHASES:
        bounds, band = base.phase_bounds(phase), mb.band(phase)
        if bounds is not None and band is not None and end <= bounds[1]:
            break
    else:
        return None
    if level < band.low:
        return None
    return (f"and stayed at {level:.3g} to step {end}, inside the band of the task's {mb.n_runs} healthy runs by "
            f"then ({phase}: {band.low:.3g}-{band.high:.3g})",
            {"level_end": level, "healthy_band_low": band.low, "healthy_band_high": band.high})


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
    before = return_at_top(ctx, sr.step(i - need), sr.step_end(i - 1))
    final = return_at_top(ctx, sr.step(max(0, sr.n - need)), sr.step_end(sr.n - 1))
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
