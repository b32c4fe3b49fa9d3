"""The public entry point :func:`diagnose`: detectors, baseline check, joint readings, triage."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from registry.analysis.diagnosis.baseline import BaselineProfile, baseline_strength, is_health_metric
from registry.analysis.diagnosis.causes import (
    NAMED_SUPPORT,
    RANK_ORDER,
    Cause,
    apply_uninformative,
    finding_confidence,
    rank_causes,
    sparse_reward,
)
from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.detectors import DETECTORS
from registry.analysis.diagnosis.detectors.excursions import settle_brief_excursions, settle_drift_without_harm
from registry.analysis.diagnosis.episodes import with_windowed_episode_means
from registry.analysis.diagnosis.hyperparams import read_settings
from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS, METRIC_ROLES, DiagnosisSettings
from registry.analysis.diagnosis.types import (
    LAYER_RANK,
    SEVERITY_RANK,
    Curve,
    Diagnosis,
    Finding,
    JointReading,
    MetricInfo,
    TriageStep,
)
from registry.analysis.diagnosis.ranges import resolve_ranges
from registry.analysis.diagnosis.updates import without_self_comparisons

#: What each role's detectors check, for the summary's "checked:" list.
ROLE_CHECKS = {
    "reward": "reward (drop, flat, zero)", "kl": "KL (spikes, climb)", "clip_fraction": "clip fraction",
    "entropy": "entropy", "length": "response length", "value_loss": "value loss",
    "signal_std": "learning signal (reward/advantage std)", "advantage_mean": "advantage mean",
    "grad_norm": "grad norm", "policy_loss": "policy loss", "truncation": "truncation at the max length",
    "kl_coef": "KL coefficient vs KL", "eval_reward": "eval vs train reward",
}


def diagnose(curves: Mapping[str, Curve], metrics: Mapping[str, MetricInfo],
             baseline: BaselineProfile | None = None, checkpoints: Sequence[int] = (),
             settings: DiagnosisSettings | None = None, params: Mapping[str, Any] | None = None,
             framework: str | None = None) -> Diagnosis:
    """Diagnose one run (possibly still training) from its canonical curves.

    ``metrics`` gives each metric's layer, healthy range (task range resolved) and
    smoothing window; a metric without an entry is judged with ``settings.fallback_ranges``.
    ``baseline`` adds deviations from healthy runs of the same task as findings, and gives
    the detectors a healthy range for metrics whose definition has none;
    ``checkpoints`` (steps) turns suggested actions into "roll back to checkpoint at step N".
    ``params`` (the run's flattened hyper-parameters) and ``framework`` let each finding rank
    its causes by the run's own settings compared with the framework's defaults and with the
    baseline's healthy runs.
    """
    st = settings or DEFAULT_SETTINGS
    curves, derived = with_windowed_episode_means(curves)
    healthy_params = baseline.hyperparams if baseline is not None else None
    hp = read_settings(params, framework, curves, healthy_params)
    curves, left_out = without_self_comparisons(curves, hp)
    derived = {**derived, **left_out}
    ctx = Context(curves, metrics, st, checkpoints, baseline, hp)
    not_judged, checked = _coverage(ctx)
    for _, detector in DETECTORS:
        ctx.findings.extend(detector(ctx))
    if baseline is not None:
        ctx.findings.extend(check_baseline(ctx, baseline))
    apply_uninformative(ctx, ctx.findings)
    settle_drift_without_harm(ctx, ctx.findings)
    settle_brief_excursions(ctx, ctx.findings)
    order = {d: i for i, d in enumerate(RANK_ORDER)}
    for f in sorted(ctx.findings, key=lambda f: (order.get(f.detector, len(order)), f.start)):
        # Information is not a problem to explain: only warnings and worse get ranked causes.
        if f.at_least("warning") and f.detector != "baseline_deviation":
            rank_causes(ctx, f)
        f.confidence = finding_confidence(ctx, f)
    findings = sorted(ctx.findings, key=lambda f: (LAYER_RANK.get(f.layer, 9), -SEVERITY_RANK[f.severity], f.start))
    joint = joint_readings(ctx, findings)
    rollback_step, reason = _rollback(ctx, findings)
    missing = [r for r, names in METRIC_ROLES.items() if not any(ctx.series(m) is not None for m in names)]
    return Diagnosis(findings=findings, joint_readings=joint, triage=_triage(findings, joint, rollback_step, reason),
                     rollback_step=rollback_step, rollback_reason=reason, first_step=ctx.first_step,
                     last_step=ctx.last_step, metrics_checked=sorted(ctx.curves), missing_roles=missing,
                     baseline_task=baseline.task if baseline is not None else None,
                     not_judged=not_judged, checked=checked, settings=hp.to_dict(),
                     baseline_note=baseline_strength(baseline) if baseline is not None else None,
                     ranges_used=dict(ctx.ranges_used), ranges=_ranges_shown(ctx), run_kind=ctx.run_kind,
                     derived=derived)


def _ranges_shown(ctx: Context) -> dict[str, dict[str, Any]]:
    """Every present metric's range by the detectors' own lookup, marked ``used`` when judged by."""
    ranges = resolve_ranges(sorted(ctx.curves), ctx.metrics, ctx.baseline, ctx.s)
    return {name: {**r, "used": name in ctx.ranges_used} for name, r in ranges.items()}


def _coverage(ctx: Context) -> tuple[list[dict[str, Any]], list[str]]:
    """Which roles had enough points to be judged, and which were present with too few."""
    not_judged: list[dict[str, Any]] = []
    checked: list[str] = []
    for role, label in ROLE_CHECKS.items():
        # Evaluations are logged rarely by design: a handful of them is a judgeable curve.
        need = ctx.s.min_points_to_judge if role != "eval_reward" else max(3, ctx.s.min_points_to_judge // 2)
        names = [m for m in METRIC_ROLES.get(role, ()) if ctx.series(m) is not None]
        if not names:
            continue
        n = max(ctx.series(m).n * ctx.series(m).bin_size for m in names)
        if n < need:
            not_judged.append({"role": role, "metric": names[0], "points": int(n), "needed": need,
                               "text": f"not enough data to judge {names[0]} ({n} point(s), {need} needed)"})
        else:
            checked.append(label)
    reward = ctx.first("reward")
    if reward is None:
        # Without the objective no run is healthy, whatever its other curves say.
        not_judged.append({"role": "reward", "metric": None, "points": 0, "needed": ctx.s.min_points_to_judge,
                           "text": "the objective: no reward or return curve ("
                                   + ", ".join(METRIC_ROLES["reward"]) + ")"})
    if reward is not None and ROLE_CHECKS.get("reward") in checked and (ctx.baseline is None or ctx.baseline.weak):
        # A run that learns, only more slowly than it should, looks healthy on its own curves: the
        # pace is judged against the task's healthy runs alone. Say so rather than imply it was checked.
        not_judged.append({"role": "reward_pace", "metric": reward, "needed": ctx.s.baseline_min_runs,
                           "text": f"whether {reward} rose as fast as healthy runs of this task do (no baseline "
                                   f"of {ctx.s.baseline_min_runs} or more healthy runs)"})
    return not_judged, checked


# ---------------------------------------------------------------------------------------
# Baseline comparison
# ---------------------------------------------------------------------------------------
def check_baseline(ctx: Context, profile: BaselineProfile) -> list[Finding]:
    """Deviations of the run's phase medians from the profile's healthy bands."""
    st = ctx.s
    out = []
    weak = profile.n_runs < st.baseline_min_runs
    strength = baseline_strength(profile)
    differing = [s for s in ctx.hp.settings.values() if _differs(s, st.cause_setting_factor)]
    # With the healthy runs' settings, a return that never changed says why the run differs from them: no
    # episode reached another outcome (their exploration found the goal, this run's did not). A setting far
    # from theirs explains it better (a learning rate of 1e-6 also leaves the return at its floor).
    never_changed = sparse_reward(ctx) if not differing else None
    caught_up = _ended_level_with_healthy_runs(ctx, profile)
    reward = ctx.first("reward")
    for name, mb in sorted(profile.metrics.items()):
        if ctx.series(name) is None or not is_health_metric(name, ctx.metrics.get(name)):
            continue
        for phase, band, lo_step, hi_step, med in ctx.phase_medians(name, profile):
            width = _band_width(st, band, med)
            margin = st.baseline_margin * width
            if band.low - margin <= med <= band.high + margin:
                continue
            above = med > band.high
            dist = (med - band.high) / width if above else (band.low - med) / width
            warn_at = _late_reward_widths(ctx, profile) if phase == "late" and name == reward \
                else st.baseline_warning_widths
            sev = "warning" if dist >= warn_at and not weak else "info"
            hib = ctx.info(name).higher_is_better
            if hib is not None and above == hib:
                sev = "info"                     # better than history is not a problem
            slow_start = caught_up is not None and phase != "late"
            if slow_start:
                sev = "info"                     # a different path to the same end, not a failure
            settled = caught_up is not None and phase == "late" and ctx.layer(name) != "objective"
            if settled:
                # A run that ended level with the healthy runs is judged there by its objective:
                # near convergence the other metrics settle into bands too narrow to judge against
                # (a value loss of 1e-4 at the episode cap, an entropy a few hundredths apart).
                # A run that ended above or below them keeps every late deviation (a late KL
                # blow-up behind a reward above the healthy runs' is how reward hacking looks).
                sev = "info"
            sr = ctx.series(name)
            start = max(int(sr.raw_steps[0]), lo_step)
            end = min(int(sr.raw_steps[-1]), hi_step)
            widths = f"{dist:.1f}" if dist < 100 else "more than 100"
            f = ctx.finding(
                "baseline_deviation", name, start, end, sev,
                f"{phase} {name} median {med:.4g} is {'above' if above else 'below'} the healthy "
                f"{profile.task} band [{band.low:.4g}, {band.high:.4g}] ({widths} band widths; {strength})",
                evidence={"median": med, "band_low": band.low, "band_high": band.high,
                          "band_widths": min(dist, 1e6), "n_runs": mb.n_runs},
                causes=[mb.warning or "outside the range seen in healthy runs"],
                check=[f"compare the {phase} {name} curve with the healthy {profile.task} runs",
                       "hyper-parameters that differ from those runs"],
                action=("align these settings with the healthy runs: " + "; ".join(s.describe() for s in differing))
                if differing else never_changed.action if never_changed is not None
                else "no hyper-parameter read from this run differs from the healthy runs' by "
                     f"{st.cause_setting_factor:g}x or more: compare the curves",
                detected_at=end, layer="comparison")
            f.causes = [Cause(s.cause_key, s.describe(), 0.5, [s.describe()],
                              f"align {s.name} with the healthy runs ({s.healthy:g})") for s in differing]
            if never_changed is not None:
                f.causes.insert(0, never_changed)
            f.causes += [Cause("generic", t, 0.15) for t in f.likely_causes]
            f.likely_causes = [c.text for c in f.causes]
            if weak:
                f.notes.append(f"{strength}: too few healthy runs to call a deviation a problem")
            if settled:
                f.notes.append("the run ended level with the healthy runs: in the late phase only its objective "
                               "is judged against them")
            if slow_start:
                f.notes.append(f"the run ended level with the healthy runs ({caught_up[1]}): a difference, "
                               f"not a failure")
            out.append(f)
    return out


def _band_width(st: DiagnosisSettings, band: Any, med: float) -> float:
    """The band's width, floored by the healthy runs' own logging noise (a band of a saturated
    metric has zero width; a deviation must still be finite and readable)."""
    return max(band.high - band.low, st.baseline_noise_floor * band.noise,
               st.baseline_rel_floor * max(abs(band.median), abs(med)), 1e-12)


def _ended_level_with_healthy_runs(ctx: Context, profile: BaselineProfile) -> tuple[str, str] | None:
    """(reward metric, how it ended) when the run's reward ended level with the healthy runs': in
    their late band, or outside it by less than a warning's distance. None when it did not, when
    the run has not trained as far, or when the profile has no late band. Such a run's early and
    mid deviations (a slow start, a different path) are not a failure; its late deviations are
    judged as always. A reward that ended *above* the healthy runs is not level: with other
    metrics off (a KL far from the reference), that is how reward hacking looks."""
    name = ctx.first("reward")
    late = [(band, med) for phase, band, _, _, med in ctx.phase_medians(name, profile) if phase == "late"] \
        if name else []
    if not late:
        return None
    band, med = late[0]
    short = _late_reward_widths(ctx, profile) * _band_width(ctx.s, band, med)
    level = band.low - short < med < band.high + short
    return (name, f"{name} {med:.4g} in its last phase, healthy runs {band.low:.4g} to {band.high:.4g}") \
        if level else None


def _late_reward_widths(ctx: Context, profile: BaselineProfile) -> float:
    """How many band widths below the healthy runs' late band a run's reward must end to have ended
    below them: fewer once the baseline holds many runs (its band is then a close estimate)."""
    st = ctx.s
    return st.baseline_late_reward_widths if profile.n_runs >= st.baseline_many_runs else st.baseline_warning_widths


def _differs(s: Any, factor: float) -> bool:
    """Does a setting differ from the healthy runs' (by ``factor``, in sign, or from zero)?"""
    # With healthy runs known, the setting's reference is their value.
    return s.healthy is not None and s.off(factor)


# ---------------------------------------------------------------------------------------
# Joint readings
# ---------------------------------------------------------------------------------------
def _overlap(a: Finding, b: Finding, tol: int) -> bool:
    return a.start <= b.end + tol and b.start <= a.end + tol


def _trend(ctx: Context, name: str | None, start: int, end: int) -> float | None:
    """Median of the run in [start, end] minus its median over the stretch just before start."""
    if name is None:
        return None
    sr = ctx.series(name)
    if sr is None:
        return None
    inside = ctx.values_between(name, start, end)
    span = max(1, end - start)
    before = ctx.values_between(name, start - span, start - 1)
    if inside.size < 2:
        return None
    if before.size < 2:
        k = max(1, inside.size // 3)
        return float(np.median(inside[-k:]) - np.median(inside[:k]))
    return float(np.median(inside) - np.median(before))


def joint_readings(ctx: Context, findings: Sequence[Finding]) -> list[JointReading]:
    tol = int(ctx.s.joint_overlap_frac * ctx.span)
    warn = [f for f in findings if f.at_least("warning") and f.layer != "comparison"]
    by = lambda *dets: [f for f in warn if f.detector in dets]  # noqa: E731
    out: list[JointReading] = []
    reward = ctx.first("reward")

    # (a) reward up + KL up (+ clip fraction high): update leaving the trust region
    for kl in by("kl_spike", "kl_climb"):
        clip = [f for f in by("clip_high") if _overlap(kl, f, tol)]
        dr = _trend(ctx, reward, kl.start, kl.end)
        if not clip and not (dr is not None and dr > 0):
            continue
        group = [kl] + clip
        if any(set(j.finding_ids) >= {f.id for f in group} for j in out):
            continue
        ev = {"kl_peak": kl.evidence.get("peak", kl.evidence.get("level_max", float("nan")))}
        if dr is not None:
            ev["reward_change"] = dr
        parts = [_kl_clause(kl)]
        if clip:
            cmax = max(f.evidence.get("max", f.evidence.get("median", 0.0)) for f in clip)
            ev["clip_fraction_max"] = cmax
            parts.append(f"the clip fraction reached {cmax:.3g} (healthy high {clip[0].evidence.get('healthy_high', 0):g})")
        if dr is not None and dr > 0:
            parts.append(f"the reward rose by {dr:.3g} meanwhile, a gain that is not trustworthy")
        out.append(JointReading(
            "trust_region", "update leaving the trust region"
            + (" (reward up while KL up)" if dr is not None and dr > 0 else " (KL up with clip fraction high)"),
            min(f.start for f in group), max(f.end for f in group), [f.id for f in group],
            "; ".join(parts) + ": each update moves the policy further than the clipped objective is meant to allow",
            _group_action(group, "lower the learning rate or raise the KL coefficient (or tighten the clip "
                                 "range / fewer epochs)"),
            ["learning rate and its warm-up", "epochs and minibatch size", "KL coefficient"],
            severity=max((f.severity for f in group), key=SEVERITY_RANK.get), evidence=ev))

    # (b) reward flat + entropy falling: converging without learning
    ent = ctx.first("entropy")
    for rf in by("reward_flat", "reward_drop"):
        ec = [f for f in by("entropy_collapse") if _overlap(rf, f, tol)]
        falling = False
        ev: dict[str, float] = {}
        if ent is not None:
            v = ctx.values_between(ent, rf.start, rf.end)
            if v.size >= 6:
                k = max(2, v.size // 6)
                e0, e1 = float(np.median(v[:k])), float(np.median(v[-k:]))
                ev = {"entropy_start": e0, "entropy_end": e1}
                falling = e0 > 0 and e1 < 0.85 * e0
        if not ec and not falling:
            continue
        group = [rf] + ec
        r0 = rf.evidence.get("early_level", rf.evidence.get("level_before"))
        r1 = rf.evidence.get("late_level", rf.evidence.get("level_after"))
        parts = []
        if r0 is not None and r1 is not None:
            parts.append(f"the reward went from {r0:.4g} to {r1:.4g}")
        if ec:
            how = "fell steadily" if ec[0].evidence.get("gradual") else "fell off a cliff"
            parts.append(f"the entropy {how} from {ec[0].evidence.get('level_before', 0):.3g} to "
                         f"{ec[0].evidence.get('level_after', 0):.3g}")
        elif ev:
            parts.append(f"the entropy fell from {ev['entropy_start']:.3g} to {ev['entropy_end']:.3g}")
        out.append(JointReading(
            "converging_without_learning",
            ("reward flat" if rf.detector == "reward_flat" else "reward falling")
            + " while entropy falls: converging without learning",
            min(f.start for f in group), max(f.end for f in group), [f.id for f in group],
            "; ".join(parts) + ": the policy is becoming deterministic without the reward improving",
            _group_action(group, "check the advantage std and the reward sparsity; add an entropy bonus or "
                                 "reshape the reward"),
            ["advantage std / reward std", "how often a non-zero reward is seen", "entropy coefficient"],
            severity=max((f.severity for f in group), key=SEVERITY_RANK.get), evidence=ev))

    # (c) length up + reward flat: reward hacking
    for lh in by("length_hacking"):
        group = [lh] + [f for f in by("reward_flat", "reward_drop", "signal_collapse") if _overlap(lh, f, tol)]
        ev = {k: v for k, v in lh.evidence.items() if k.endswith("_change") or k == "growth"}
        parts = [f"response length grew {100 * lh.evidence.get('growth', 0):.0f}% "
                 f"({lh.evidence.get('length_start', 0):.4g} -> {lh.evidence.get('length_end', 0):.4g})",
                 f"the reward changed by {100 * lh.evidence.get('reward_change_frac', 0):.1f}% of its range"]
        parts += [f"{k[:-7]} changed by {v:.3g}" for k, v in lh.evidence.items() if k.endswith("_change")
                  and k != "reward_change_frac"]
        out.append(JointReading(
            "reward_hacking", "response length up while reward is flat: likely reward hacking",
            min(f.start for f in group), max(f.end for f in group), [f.id for f in group],
            "; ".join(parts) + ": the policy may be exploiting something other than the task (a format/process "
            "reward, a length-correlated loophole)",
            "inspect the reward decomposition (accuracy / format / process) and samples of long responses",
            ["reward_accuracy_mean vs reward_format_mean", "truncation at the max length", "length penalty"],
            severity="warning", evidence=ev))

    # (d) numerical divergence: non-finite values with spikes just before
    for nf in by("nan_inf")[:1]:
        pre = [f for f in by("grad_norm_spikes", "kl_spike", "policy_loss_growing")
               if f.start <= nf.start + tol]
        if pre:
            group = [nf] + pre
            out.append(JointReading(
                "numerical_divergence", "spikes followed by NaN/Inf: the run diverged numerically",
                min(f.start for f in group), max(f.end for f in group), [f.id for f in group],
                "; ".join(f"{f.detector} on {f.metric} from step {f.start}" for f in pre)
                + f" precede the first non-finite {nf.metric} at step {nf.start}: the optimisation blew up",
                "roll back before the first spike; lower the learning rate and clip gradients",
                ["grad norm before the first NaN", "mixed-precision settings"], severity="critical"))
    return out


def _kl_clause(kl: Finding) -> str:
    if kl.detector == "kl_spike":
        r = kl.evidence.get("ratio", 0.0)
        ratio = f", {r:.3g}x its running level" if r < 1e6 else " from a running level of ~0"
        return f"{kl.metric} jumped to {kl.evidence.get('peak', 0):.3g}{ratio}"
    return (f"{kl.metric} climbed to {kl.evidence.get('level_max', 0):.3g}, above its healthy high "
            f"{kl.evidence.get('healthy_high', 0):g}")


def _group_action(group: Sequence[Finding], fallback: str) -> str:
    """The action of the best-supported named cause among the group's findings, else ``fallback``."""
    best: Cause | None = None
    for f in group:
        for c in f.causes[:1]:
            if c.support >= NAMED_SUPPORT and c.action and (best is None or c.support > best.support):
                best = c
    return best.action if best is not None else fallback


# ---------------------------------------------------------------------------------------
# Triage and rollback
# ---------------------------------------------------------------------------------------
def _rollback(ctx: Context, findings: Sequence[Finding]) -> tuple[int | None, str | None]:
    serious = [f for f in findings if f.at_least("warning") and f.layer != "comparison"]
    if not serious:
        return None, None
    first = min(serious, key=lambda f: (f.start, -f.severity_rank))
    step = ctx.rollback_before(first.start)
    if step is None:
        if ctx.checkpoints:
            return None, f"no checkpoint before the first problem at step {first.start} ({first.detector})"
        return None, (f"no checkpoints were given; the first problem ({first.detector} on {first.metric}) "
                      f"starts at step {first.start}")
    return step, (f"latest checkpoint before the first problem "
                  f"({first.detector} on {first.metric} at step {first.start})")


def _triage(findings: Sequence[Finding], joint: Sequence[JointReading], rollback_step: int | None,
            reason: str | None) -> list[TriageStep]:
    steps: list[TriageStep] = []
    for layer in ("diagnostic", "constraint", "objective", "comparison"):
        for f in findings:
            if f.layer != layer or not f.at_least("warning"):
                continue
            nxt = f"; check {f.check_next[0]}" if f.check_next else ""
            reading = next((j for j in joint if f.id in j.finding_ids), None)
            also = f" [read with: {reading.title}]" if reading else ""
            steps.append(TriageStep(len(steps) + 1, layer, f"{f.summary()}{nxt}{also}", [f.id]))
    if rollback_step is not None:
        steps.append(TriageStep(len(steps) + 1, "rollback",
                                f"roll back to checkpoint at step {rollback_step}: {reason}"))
    elif reason:
        steps.append(TriageStep(len(steps) + 1, "rollback", reason))
    return steps
