"""Brief excursions of the update size that nothing followed, and a language model's drift from its
reference that nothing in the run shows harm from: KL and clip-fraction warnings that the run's own
later updates show were harmless become information.

Runs after every detector (it reads what followed each finding, including the other findings).
"""
from __future__ import annotations

import math

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.detectors.common import (
    aftermath,
    gain_in_standard_errors,
    reward_level,
    settle_as_info,
)
from registry.analysis.diagnosis.ranges import FALLBACK_SOURCE
from registry.analysis.diagnosis.signal import noise_sigma
from registry.analysis.diagnosis.types import Finding


#: A KL to the reference is back at its level after a one-batch jump when the updates after it sit within
#: this factor of the level before it.
ONE_BATCH_BACK_FACTOR = 2.0

#: Constraint findings that can be a brief excursion of an update size, alone or together.
EXCURSION_DETECTORS = ("kl_spike", "kl_climb", "clip_high")


def _level_after(ctx: Context, f: Finding) -> float | None:
    """The median of ``f``'s metric over the updates after it; None when too few to tell."""
    sr = ctx.series(f.metric)
    v = ctx.values_between(f.metric, f.end + 1, f.end + aftermath(ctx))
    return float(np.median(v)) if sr is not None and v.size >= ctx.persist(sr.n) else None


def _brief_and_back(ctx: Context, f: Finding, findings: list[Finding]) -> float | None:
    """The level ``f``'s metric was back at when ``f`` is a brief, mild excursion of its kind and the
    metric returned under its healthy high after it; None otherwise."""
    st = ctx.s
    sr = ctx.series(f.metric)
    high = f.evidence.get("healthy_high", float("nan"))
    if sr is None or not math.isfinite(high):
        return None
    longest = st.excursion_persist_factor * ctx.persist(sr.n)
    if f.detector == "kl_spike":
        # A spike is one update (a warning: not far above the healthy high, ``detect_kl_spike``); several
        # are judged one by one, each by what followed it.
        brief = True
    elif f.detector == "kl_climb":
        brief = not f.evidence.get("climbing") and f.evidence.get("points_above", longest + 1) <= longest
    elif "median" in f.evidence:                       # clip fraction persistently above its high
        brief = f.evidence.get("points", longest + 1) <= longest
    else:                                              # a single clip point beside a KL spike
        brief = bool(f.evidence.get("with_kl_spike"))
    back = _level_after(ctx, f) if brief else None
    if back is not None and back > high and _brief_from_reference(ctx, f):
        # The KL to the reference measures how far the policy has drifted, which is the run's own level, not
        # a step size: back at that level is back, whatever a generic high says of the level itself (a level
        # above the high is another finding's to judge, kl_climb's).
        # While the policy drifts (its level rising, which kl_climb judges), an outlier batch is back when the
        # updates after it sit at a ``spike_ratio``-th of its peak or less: the batch was far above the level
        # both before and after it, and the level it left is no longer the one to come back to.
        return back if back <= _level_to_return_to(ctx, f) else None
    return back if back is not None and back <= high else None


def _level_to_return_to(ctx: Context, f: Finding) -> float:
    """The KL a brief jump ``f`` of the KL to the reference must be back under: twice the level before it, or
    while the policy drifts, a ``spike_ratio``-th of the jump's peak, or the level the run holds over its second
    half, whichever is largest. A jump during the KL's first rise lands where the run settles later (default_s1:
    0.05 -> 0.49 at step 44, the run at 0.4-0.6 from step 100): that is the drift kl_climb judges, not an update
    out of line, and whether the reward suffered after it is still asked (iters_4_s14's jump to 2.4-3.5 at steps
    61-75, the reward down from 0.68 to 0.47, stays a warning)."""
    sr = ctx.series(f.metric)
    held = float(np.median(sr.raw_values[sr.n // 2:])) if sr is not None and sr.n >= 2 else 0.0
    return max(ONE_BATCH_BACK_FACTOR * f.evidence.get("recent_level", 0.0), f.evidence["peak"] / ctx.s.spike_ratio,
               held)


def _nothing_followed(ctx: Context, episode: list[Finding], findings: list[Finding]) -> bool:
    """Did the run carry on unharmed after the episode? False when what followed cannot be seen (no
    reward curve, too few points before or after), when the reward fell below its level at the
    episode's start over the following updates (a language model's by its mean, past the batch noise),
    or when another warning starts from it on."""
    st = ctx.s
    reward = ctx.first("reward")
    if reward is None:
        return False
    start, end = min(f.start for f in episode), max(f.end for f in episode)
    window = aftermath(ctx)
    need = max(ctx.persist(ctx.series(f.metric).n) for f in episode)
    # The reward's level at the start (its last points before it), not a mean over a window that
    # trails a rising curve, against the updates after the episode.
    before = ctx.values_between(reward, start - window, start - 1)[-need:]
    if before.size < need and all(_brief_from_reference(ctx, f) for f in episode):
        # Outlier batches of a language model's first updates: the level the reward started from is its first points.
        before = ctx.series(reward).raw_values[:need]
    after = ctx.values_between(reward, end + 1, end + window)
    if min(after.size, before.size) < need:
        return False
    if not ctx.higher_is_better(reward):
        before, after = -before, -after
    if ctx.run_kind == "llm":
        # A language model's batch reward takes a few values (the mean of a handful of completions' 0 / 0.5 / 1):
        # a median jumps between them (0.72 before, 0.5 after, where the means were 0.72 and 0.70), so the level is
        # a mean and a fall is one past the batch noise of the two means, as for a drift (settle_drift_without_harm).
        t = gain_in_standard_errors(ctx, before, after)
        if t is None or t <= -st.flat_llm_gain_se:
            return False
    elif float(np.median(after)) < float(np.median(before)) - _loss_that_counts(ctx, reward, start - window,
                                                                                     end + window):
        return False
    tol = int(st.joint_overlap_frac * ctx.span)
    return not any(g not in episode and g.at_least("warning") and g.end >= start - tol
                   and not _judged_over_the_run(g) for g in findings)


def _judged_over_the_run(f: Finding) -> bool:
    """A finding about the run's progress as a whole (a reward flat or slow over it, an entropy narrowing
    beside such a reward, a share of zero-std groups read over it): not something one excursion leads
    to, so it says nothing of what followed one. A drop, a collapse or a spike is."""
    return (f.detector in ("reward_flat", "reward_slow")
            or f.detector == "entropy_collapse" and bool(f.evidence.get("gradual"))
            or f.detector == "advantage_degenerate" and "rank_corr" in f.evidence)


def _loss_that_counts(ctx: Context, reward: str, start: int, end: int) -> float:
    """How far the reward must sit below its level before an excursion (steps [start, end] around it) for
    it to have fallen: its noise there, and with a task range at least ``regress_min_range_frac`` of what the
    run had gained before it (capped by the range's width): the loss a slide back must have to count. A
    windowed episode mean is smooth, so its noise alone calls a point lower on a 500-point range a fall;
    the gain, not the range, is the scale because a task range can be far wider than what runs reach
    (Pendulum's [-3255, 0] against -1200 -> -200)."""
    noise = noise_sigma(ctx.values_between(reward, start, end))
    low, high = ctx.range(reward)
    if low is None or high is None or high <= low:
        return noise
    sr = ctx.series(reward)
    sign = 1.0 if ctx.higher_is_better(reward) else -1.0
    y = sign * sr.y[:max(1, int(np.searchsorted(sr.steps, start)))]
    gain = float(np.max(y)) - float(np.median(y[:ctx.early(sr.n)]))
    return max(noise, ctx.s.regress_min_range_frac * min(high - low, max(gain, 0.0)))


def _one_batch_from_reference(ctx: Context, f: Finding) -> bool:
    """KL-to-the-reference spikes of single batches: a jump of one or two logged points, or a span where at
    most half the points are jumps (``spike_ratio`` times the level around it: the larger of the level before
    and the level after), the KL back at its level between. The policy cannot drift from its reference and
    come back within one step, so such a jump is a batch whose sampled tokens the reference finds unlikely
    (the k3 estimator's heavy tail: TRL's ``kl`` of a healthy run reaches 5-50 at single steps), a property
    of that batch, not of the policy: judged like a warning-sized spike, by what followed it."""
    if f.detector != "kl_spike" or not f.metric.startswith("kl_ref") or ctx.series(f.metric) is None:
        return False
    v = ctx.values_between(f.metric, f.start, f.end)
    if v.size <= 2:
        return v.size > 0
    # A span's jumps are measured against the level the run holds around it: the larger of the level before
    # (its first steps: the KL still at 0, the policy at its reference) and the level after it.
    level = max(f.evidence.get("recent_level", 0.0), _level_after(ctx, f) or 0.0)
    jumps = v >= ctx.s.spike_ratio * level
    return level > 0 and (int(jumps.sum()) <= 2 or float(np.mean(jumps)) <= 0.5)


def _brief_from_reference(ctx: Context, f: Finding) -> bool:
    """A jump of a language model's KL to its reference that is one batch's (:func:`_one_batch_from_reference`)
    or a burst over at most the persistence's count of logged points: the KL at 2-3 nats for seven steps of a
    300-step run, then back near 0 (default_s52, steps 6-12). However far it went, it is judged like a one-batch
    jump, by the level it came back to and by what followed it (the reward's mean, the findings after it)."""
    if _one_batch_from_reference(ctx, f):
        return True
    if ctx.run_kind != "llm" or f.detector != "kl_spike" or not f.metric.startswith("kl_ref"):
        return False
    sr = ctx.series(f.metric)
    return sr is not None and 0 < ctx.values_between(f.metric, f.start, f.end).size <= ctx.persist(sr.n)


def _episodes(ctx: Context, findings: list[Finding]) -> list[list[Finding]]:
    """Warning-level excursion findings (and brief jumps of a language model's KL to the reference) grouped by
    overlap: a KL jump and the clip fraction it drove are one event."""
    tol = int(ctx.s.joint_overlap_frac * ctx.span)
    out: list[list[Finding]] = []
    for f in sorted((f for f in findings if f.detector in EXCURSION_DETECTORS
                     and (f.severity == "warning" or _brief_from_reference(ctx, f))),
                    key=lambda f: f.start):
        if out and f.start <= max(g.end for g in out[-1]) + tol:
            out[-1].append(f)
        else:
            out.append([f])
    return out


def settle_brief_excursions(ctx: Context, findings: list[Finding]) -> None:
    """A brief excursion of the update size that nothing followed is information, not a problem.

    One update can move the policy far (a fast learning rate, an unlucky minibatch), and
    configurations tuned for fast learning (the zoo's Pendulum PPO: learning rate 1e-3, gSDE) run
    with a KL near 0.05 and a clip fraction near 0.3 that they cross for a few updates while the
    reward climbs. Telling the user to lower the learning rate would then be advice the run's own
    data contradicts. An episode of overlapping KL and clip-fraction warnings is information when
    each is brief and mild of its kind (a KL spike of warning severity; KL or clip fraction
    above the high for at most ``excursion_persist_factor`` times the persistence, not a steady
    climb, below the critical factor), each metric is back under its healthy high over the
    following updates, the reward did not fall, and no other warning starts from the episode on
    (episodes are judged latest first, so one followed only by harmless ones counts as followed by nothing).
    Without a reward curve, or with too few points after it to see what followed, it stays.
    """
    reward = ctx.first("reward")
    # Latest first: an excursion followed only by later excursions that were themselves harmless was
    # followed by nothing.
    for episode in reversed(_episodes(ctx, findings)):
        backs = [_brief_and_back(ctx, f, findings) for f in episode]
        if any(b is None for b in backs) or not _nothing_followed(ctx, episode, findings):
            continue
        for f, back in zip(episode, backs):
            others = sorted({g.detector for g in episode if g is not f})
            with_ = f" (with {', '.join(others)})" if others else ""
            settle_as_info(f, _excursion_title(f, back, reward) + with_,
                           "nothing to fix; if it recurs or lasts, lower the learning rate or use fewer epochs",
                           level_next=back, brief=1.0)


def settle_drift_without_harm(ctx: Context, findings: list[Finding]) -> None:
    """A language model's KL to its reference above the diagnosis' default high, with nothing in the run showing
    harm from it, is information: the level cannot be judged without the task's healthy runs.

    The KL to the reference is how far the policy has moved from where it started, and under a KL penalty
    the level it settles at is set by the coefficient against the reward's scale, so no one figure is a
    healthy high for every task (the default, 0.1 nats per token, is a rule of thumb, not a framework's;
    healthy runs of a tiny task sit at 0.3-1). A dictionary or task-baseline range is a claim about the task
    and stands. Against the default, the finding stays a warning only where the run shows harm over the
    drift: its reward fell (``flat_llm_gain_se`` standard errors below its level before the drift, or a reward
    drop or zero reward over it). Spikes are judged by ``detect_kl_spike`` relative to the run's own level
    whatever the range, and a flat reward by ``reward_flat``."""
    reward = ctx.first("reward")
    if ctx.run_kind != "llm" or reward is None:
        return
    rs = ctx.series(reward)
    e = ctx.early(rs.n)
    sign = 1.0 if ctx.higher_is_better(reward) else -1.0
    for f in findings:
        if (f.detector != "kl_climb" or not f.at_least("warning") or not f.metric.startswith("kl_ref")
                or ctx.ranges_used.get(f.metric, {}).get("source") != FALLBACK_SOURCE):
            continue
        if any(g.at_least("warning") for d in ("reward_drop", "reward_zero")
               for g in ctx.overlapping(d, f.start, f.end)):
            continue
        before = ctx.values_between(reward, int(rs.raw_steps[0]), f.start - 1)
        early = before[-e:] if before.size >= e else rs.raw_values[:e]
        late = ctx.values_between(reward, f.start, f.end)[-e:]
        t = gain_in_standard_errors(ctx, sign * early, sign * late)
        if t is None or t <= -ctx.s.flat_llm_gain_se:
            continue
        settle_as_info(
            f, f"{f.title}; the reward ({reward}) did not fall over it ({reward_level(ctx, early):.4g} -> "
               f"{reward_level(ctx, late):.4g}): against no baseline of this task's healthy runs the level itself "
               f"cannot be judged (the high is the diagnosis default; the level a KL penalty settles at depends on "
               f"its coefficient and the reward's scale)",
            "nothing to fix on this evidence; register healthy runs of the task as a baseline to judge the level, "
            "and read samples or an eval metric if the reward can be gamed",
            reward_gain_se=t)


def _excursion_title(f: Finding, back: float, reward: str | None) -> str:
    high = f.evidence["healthy_high"]
    where = (f"healthy high {high:g}" if back <= high
             else f"its level before, {f.evidence['recent_level']:.3g}"
             if back <= ONE_BATCH_BACK_FACTOR * f.evidence.get("recent_level", 0.0)
             else f"{100 * back / f.evidence['peak']:.0f}% of the jump's peak: one batch far above the level before "
                  f"and after it")
    then = f"over the next updates it was back at {back:.3g} ({where}) and the reward ({reward}) did not fall"
    if f.detector == "kl_spike":
        return (f"KL jumped once to {f.evidence['peak']:.4g}, {f.evidence['ratio']:.3g}x its recent level "
                f"{f.evidence['recent_level']:.3g}; {then}: a single large update that nothing followed")
    if f.detector == "kl_climb":
        return (f"KL above its healthy high for {f.evidence['points_above']:.0f} points (up to "
                f"{f.evidence['level_max']:.3g}); {then}: a brief excursion that nothing followed")
    if "median" in f.evidence:
        return (f"clip fraction above {high:g} for {f.evidence['points']:.0f} points (median "
                f"{f.evidence['median']:.3g}); {then}: a brief excursion that nothing followed")
    return f"clip fraction {f.evidence['max']:.3g} at one point; {then}: a brief excursion that nothing followed"
