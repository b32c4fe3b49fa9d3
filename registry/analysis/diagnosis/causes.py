"""Rank each finding's candidate causes by evidence from the run itself.

A detector knows *what* went wrong; why is read from the run: its hyperparameters compared
with the framework's defaults and the task's healthy runs (:mod:`.hyperparams`), and its
other metrics over the same steps. Each candidate cause carries the evidence that supports
it and a support in [0, 1]; the finding's causes are sorted by support and its suggested
action is the best-supported cause's action (when it has real support). A generic cause
that the run's own data contradicts is dropped, not merely ranked low (a clip fraction of
0.4 with a KL of 1e-3 and ``clip_range = 0.02`` is a small clip range, not an update that
is too large). A metric that is uninformative by construction (the clip fraction when each
batch gets one policy update, so the ratio is 1) is reported as such, as information.

Longer than 500 lines: it is the table of causes per detector, each a small rule over the
run's settings and other metrics; the rules read best side by side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.hyperparams import DEFAULT_SOURCES, FRAMEWORK_DEFAULTS, RunSettings, Setting, horizon
from registry.analysis.diagnosis.types import Finding

#: Support at or above which a cause is named as *the* cause and drives the action.
NAMED_SUPPORT = 0.5


@dataclass
class Cause:
    """One candidate explanation of a finding, with what in the run supports it."""

    key: str
    text: str
    support: float
    evidence: list[str] = field(default_factory=list)
    action: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "text": self.text, "support": round(float(self.support), 3),
                "evidence": list(self.evidence), "action": self.action}


# ---------------------------------------------------------------------------------------
# Evidence from the run's metrics over the finding's steps
# ---------------------------------------------------------------------------------------
def _kl_state(ctx: Context, start: int, end: int, onset: bool = False) -> tuple[str | None, float | None]:
    """("high" | "normal" | "small" | None, KL to the old policy over [start, end]).

    ``onset``: the finding is a sudden event (a cliff, a drop, a spike); what matters is the
    KL around its start (the largest value within a short window), not its median over the
    aftermath, where a collapsed policy no longer moves at all.
    """
    name = ctx.first("kl_update")
    if name is None:
        return None, None
    if onset:
        pad = max(1, int(ctx.s.joint_overlap_frac * ctx.span))
        v = ctx.values_between(name, start - pad, start + pad)
        level = float(np.max(v)) if v.size else None
    else:
        v = ctx.values_between(name, start, end)
        level = float(np.median(v)) if v.size else None
    if level is None:
        return None, None
    _, high = ctx.range(name)
    if high is not None and level > high:
        return "high", level
    if high is not None and level < ctx.s.cause_kl_small_frac * high:
        return "small", level
    return "normal", level


def _entropy_kept(ctx: Context, start: int, end: int) -> tuple[bool | None, float | None, float | None]:
    """Did the entropy stay near its starting level over [start, end]? (kept, start level, level)."""
    name = ctx.first("entropy")
    if name is None:
        return None, None, None
    sr = ctx.series(name)
    e0 = float(np.median(sr.y[: ctx.early(sr.n)]))
    v = ctx.values_between(name, start, end)
    if v.size == 0 or e0 <= 0:
        return None, e0, None
    k = max(1, v.size // 3)
    late = float(np.median(v[-k:]))
    return late >= ctx.s.cause_entropy_kept_frac * e0, e0, late


def _entropy_fell(ctx: Context) -> tuple[bool, float | None, float | None]:
    name = ctx.first("entropy")
    if name is None:
        return False, None, None
    sr = ctx.series(name)
    e = ctx.early(sr.n)
    e0, e1 = float(np.median(sr.y[:e])), float(np.median(sr.y[-e:]))
    return e0 > 0 and e1 < ctx.s.cause_entropy_fell_frac * e0, e0, e1


def _reward_constant(ctx: Context) -> float | None:
    """The reward's value when it never changed over the run (a sparse reward never found)."""
    name = ctx.first("reward")
    if name is None:
        return None
    sr = ctx.series(name)
    if sr.n < 4:
        return None
    y = sr.raw_values
    scale = max(float(np.max(np.abs(y))), 1e-12)
    at = np.abs(y - np.median(y)) <= 1e-9 * scale
    if float(np.mean(at)) < ctx.s.cause_constant_share:
        return None
    # A reward that had other values first and then stuck (a collapse to empty or run-on answers) is not a
    # sparse reward exploration never found: the run's first stretch must sit at that value too.
    first = at[:max(4, int(np.ceil(ctx.s.cause_constant_first_frac * at.size)))]
    return float(np.median(y)) if float(np.mean(first)) >= ctx.s.cause_constant_share else None


# ---------------------------------------------------------------------------------------
# Causes from settings
# ---------------------------------------------------------------------------------------
def _far(s: Setting | None, factor: float) -> float | None:
    """value/reference when it is at least ``factor`` times the reference (or 1/factor below), else None."""
    return s.far(factor) if s is not None else None


def _setting_off(hp: RunSettings, ctx: Context, name: str, above: bool) -> tuple[Setting, float] | None:
    """The run's setting ``name`` and its ratio to the reference, when it is far above (or below) it."""
    s = hp.get(name)
    r = _far(s, ctx.s.cause_setting_factor)
    if s is None or r is None or (r < 1 if above else r > 1):
        return None
    return s, r


def _bonus(r: float) -> float:
    """A little more support the further a setting is from its reference (0 .. 0.1)."""
    return min(0.1, 0.05 * abs(math.log10(max(r, 1e-12))))


def _ref(s: Setting) -> str:
    return f"{s.reference:g}" if s.reference is not None else "its usual value"


def lr_high(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    found = _setting_off(hp, ctx, "learning_rate", above=True)
    if found is None:
        return _lr_above_with_kl_high(hp, ctx, kl, kl_level)
    s, r = found
    ev = [s.describe()]
    sup = 0.55 + _bonus(r)
    if kl == "high":
        sup += 0.25
        ev.append(f"KL to the old policy {kl_level:.3g} is above its healthy high")
    elif kl == "small":
        sup -= 0.3
        ev.append(f"but KL to the old policy is small ({kl_level:.3g})")
    return Cause("learning_rate_high", f"learning rate too high: {s.describe()}", sup, ev,
                 f"lower learning_rate towards {_ref(s)}")


def _lr_above_with_kl_high(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    """A learning rate above its reference by at least ``cause_corroborated_factor`` (not far enough to
    count alone) when the KL to the old policy is above its healthy high at the finding: the setting
    and the run's own updates point the same way."""
    s = hp.get("learning_rate")
    r = s.ratio() if s is not None else None
    if kl != "high" or r is None or r < ctx.s.cause_corroborated_factor:
        return None
    return Cause("learning_rate_high", f"learning rate too high for this run's updates: {s.describe()}", 0.55,
                 [s.describe(), f"KL to the old policy {kl_level:.3g} is above its healthy high"],
                 f"lower learning_rate towards {_ref(s)}")


def lr_low(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    found = _setting_off(hp, ctx, "learning_rate", above=False)
    if found is None:
        return None
    s, r = found
    ev = [s.describe()]
    sup = 0.6 + _bonus(r)
    if kl == "small":
        sup += 0.25
        ev.append(f"KL to the old policy is only {kl_level:.3g}: the policy barely moves")
    elif kl == "high":
        sup -= 0.3
    return Cause("learning_rate_low", f"learning rate too low: {s.describe()}", sup, ev,
                 f"raise learning_rate towards {_ref(s)}")


def clip_small(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    found = _setting_off(hp, ctx, "clip_range", above=False)
    if found is None:
        return None
    s, r = found
    ev = [s.describe()]
    sup = 0.6 + _bonus(r)
    if kl in ("small", "normal"):
        sup += 0.25
        ev.append(f"KL to the old policy is {kl_level:.3g}, not large: the update is ordinary, the bound is narrow")
    return Cause("clip_range_small",
                 f"clip range too small: {s.describe()}; even an ordinary update leaves [1 - eps, 1 + eps]",
                 sup, ev, f"raise clip_range towards {_ref(s)}")


def clip_small_stalls(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    """A narrow clip range as the cause of updates that barely move the policy (clip_low).

    PPO's clipped objective has zero gradient for a sample once its ratio leaves
    [1 - eps, 1 + eps] in the advantage's direction, so a small eps ends each sample's move
    early and the whole update stays small: a small KL to the old policy is what it predicts.
    """
    found = _setting_off(hp, ctx, "clip_range", above=False)
    if found is None or kl != "small":
        return None
    s, r = found
    return Cause("clip_range_small",
                 f"clip range too small: {s.describe()}; the clipped objective stops each sample's update once the "
                 f"ratio leaves [1 - eps, 1 + eps], so the policy barely moves", 0.8 + _bonus(r),
                 [s.describe(), f"KL to the old policy is only {kl_level:.3g}"],
                 f"raise clip_range towards {_ref(s)}")


def clip_large(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    found = _setting_off(hp, ctx, "clip_range", above=True)
    if found is None:
        return None
    s, r = found
    ev = [s.describe()]
    sup = 0.5 + _bonus(r)
    if kl == "high":
        sup += 0.2
        ev.append(f"KL to the old policy {kl_level:.3g} is above its healthy high")
    return Cause("clip_range_large", f"clip range too large: {s.describe()}; the surrogate barely limits the update",
                 sup, ev, f"lower clip_range towards {_ref(s)}")


def epochs_high(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    found = _setting_off(hp, ctx, "n_epochs", above=True)
    if found is None:
        return None
    s, r = found
    ev = [s.describe()]
    sup = 0.55 + _bonus(r)
    if kl == "high":
        sup += 0.25
        ev.append(f"KL to the old policy {kl_level:.3g} is above its healthy high")
    elif kl == "small":
        sup -= 0.3
    return Cause("n_epochs_high",
                 f"too many passes over each rollout: {s.describe()}; the policy moves far from the one that "
                 f"collected the data", sup, ev, f"use fewer epochs (towards {_ref(s)}) or set a target KL")


def ent_negative(hp: RunSettings, ctx: Context, *_: Any) -> Cause | None:
    s = hp.get("ent_coef")
    if s is None or s.value >= 0:
        return None
    ev = [s.describe()]
    fell, e0, e1 = _entropy_fell(ctx)
    sup = 0.75
    if fell:
        sup += 0.2
        ev.append(f"entropy fell from {e0:.3g} to {e1:.3g}")
    return Cause("ent_coef_negative",
                 f"negative entropy coefficient: {s.describe()}; the loss rewards lower entropy and drives the "
                 f"policy to determinism", sup, ev, f"set ent_coef >= 0 (default {_ref(s)})")


def ent_large(hp: RunSettings, ctx: Context, start: int, end: int) -> Cause | None:
    s = hp.get("ent_coef")
    if s is None or s.value < ctx.s.cause_ent_coef_large:
        return None
    ev = [s.describe()]
    kept, e0, late = _entropy_kept(ctx, start, end)
    sup = 0.5
    if kept:
        sup += 0.35
        ev.append(f"entropy stayed at {late:.3g} (it started at {e0:.3g}): the policy stays near random")
    elif kept is False:
        sup -= 0.2
    return Cause("ent_coef_large",
                 f"entropy bonus too large: {s.describe()}; it outweighs the policy gradient", sup, ev,
                 f"lower ent_coef (towards {_ref(s)})")


def vf_coef_small(hp: RunSettings, ctx: Context, start: int, end: int) -> Cause | None:
    """A value-loss weight far below the framework's: the critic, trained by the same optimiser step as
    the policy, learns slowly, so the advantages carry little signal. Stronger when the critic indeed
    explained almost nothing, and when the policy's entropy meanwhile fell below
    ``cause_entropy_fell_frac`` of its start."""
    found = _setting_off(hp, ctx, "vf_coef", above=False)
    if found is None:
        return None
    s, r = found
    ev = [s.describe()]
    sup = 0.5 + _bonus(r)
    name = ctx.first("explained_variance")
    v = ctx.values_between(name, start, end) if name is not None else np.zeros(0)
    if v.size >= ctx.s.min_points_to_judge and float(np.median(v)) < ctx.s.cause_critic_explained_variance:
        sup += 0.2
        ev.append(f"the critic explained {float(np.median(v)):.2g} of the return's variance")
    fell, e0, e1 = _entropy_fell(ctx)
    if fell:
        sup += 0.15
        ev.append(f"the policy narrowed meanwhile to {100 * e1 / e0:.0f}% of its starting entropy "
                  f"({e0:.3g} -> {e1:.3g})")
    return Cause("vf_coef_small",
                 f"value-loss weight too small: {s.describe()}; the critic learns slowly, so the advantages "
                 f"carry little signal", sup, ev, f"raise vf_coef towards {_ref(s)}")


def kl_coef_small(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    s = hp.get("kl_coef")
    if s is None:
        return None
    r = s.far(ctx.s.cause_setting_factor)
    if not (s.value == 0 or (r is not None and r < 1)):
        return None
    return Cause("kl_coef_small", f"KL penalty weak or off: {s.describe()}", 0.45, [s.describe()],
                 "raise the KL coefficient")


def critic_not_fitting(ctx: Context, start: int, end: int, kl: str | None, kl_level: float | None) -> Cause | None:
    """The critic explains almost none of the return while the policy does move: advantages are noise."""
    name = ctx.first("explained_variance")
    if name is None or kl not in ("normal", "high"):
        return None
    v = ctx.values_between(name, start, end)
    if v.size < ctx.s.min_points_to_judge:
        return None
    ev = float(np.median(v))
    if ev >= ctx.s.cause_critic_explained_variance:
        return None
    return Cause("critic_not_fitting",
                 f"the critic does not fit the returns (explained variance {ev:.2g} over the run) while the policy "
                 f"does move (KL to the old policy {kl_level:.3g}): the advantages are mostly noise", 0.6,
                 [f"median explained variance {ev:.2g}", f"KL to the old policy {kl_level:.3g}"],
                 "fix the critic first: normalise rewards/returns, check gamma and gae_lambda against the task's "
                 "horizon, compare with a configuration that solved this task")


def _pass_fail_reward_mean(ctx: Context, start: int, end: int) -> float | None:
    """The reward's mean over [start, end] when every logged value lies in [0, 1] (pass/fail rewards), else None."""
    name = ctx.first("reward")
    if name is None:
        return None
    sr = ctx.series(name)
    if float(np.min(sr.raw_values)) < 0 or float(np.max(sr.raw_values)) > 1:
        return None
    v = ctx.values_between(name, start, end)
    return float(np.mean(v)) if v.size else None


def _identical_share(p: float, g: float) -> float:
    """Share of groups of ``g`` pass/fail responses (pass rate ``p``) that all get the same reward."""
    return float(p ** g + (1 - p) ** g)


def group_small(hp: RunSettings, ctx: Context, start: int, end: int) -> Cause | None:
    """Too few responses per prompt for their rewards to differ: zero-std groups give no gradient.

    With pass/fail rewards at pass rate p, a group of G responses is all-pass or all-fail with
    probability p^G + (1-p)^G; the cause is named from that expectation against the reference
    group size (the task's healthy runs, else the framework default), and checked against the
    share of zero-std groups the run logged when it did.
    """
    s = hp.get("group_size")
    if s is None or s.value < 1:
        return None
    if s.value == 1:
        return Cause("group_size_small",
                     f"one response per prompt: {s.describe()}; a group of one has zero reward std, so every "
                     f"group-relative (GRPO) advantage is 0", 0.85, [s.describe()],
                     "sample several responses per prompt (a group size of 4-16) for a group-relative estimator")
    p = _pass_fail_reward_mean(ctx, start, end)
    if p is None:
        return None
    ref = s.reference
    mine = _identical_share(p, s.value)
    ev = [s.describe(), f"pass rate {p:.2f} over these steps: {100 * mine:.0f}% of groups of {s.value:g} are "
                        f"expected to get identical rewards"]
    if ref is not None and ref <= s.value:
        return None                    # the reference (the healthy runs', else the default) uses no larger groups
    # Larger groups must make identical rewards much rarer: at a pass rate of 0 or 1 no group size helps.
    larger = ref if ref is not None else 2 * s.value
    theirs = _identical_share(p, larger)
    ev.append(f"{100 * theirs:.0f}% with groups of {larger:g}")
    if mine < 3 * theirs:
        return None
    if mine < 0.3:
        return None
    sup = 0.5
    zname = ctx.first("zero_std_frac")
    if zname is not None:
        seen = ctx.values_between(zname, start, end)
        if seen.size:
            observed = float(np.median(seen))
            ev.append(f"observed share of zero-std groups {100 * observed:.0f}%")
            sup += 0.25 if abs(observed - mine) <= 0.15 else -0.2
    return Cause("group_size_small",
                 f"too few responses per prompt: {s.describe()}; at a pass rate of {p:.2f} about {100 * mine:.0f}% "
                 f"of groups get identical rewards and give no gradient", sup, ev,
                 f"raise {s.name} (towards {_ref(s)})" if ref is not None and ref > s.value
                 else f"raise {s.name}")


def batch_small(hp: RunSettings, ctx: Context, kl: str | None, kl_level: float | None) -> Cause | None:
    """A minibatch far below its reference: noisy gradient estimates, isolated spikes."""
    found = _setting_off(hp, ctx, "batch_size", above=False)
    if found is None:
        return None
    s, r = found
    return Cause("batch_size_small",
                 f"minibatch too small: {s.describe()}; each gradient step averages few samples, so single "
                 f"steps can be far off (noisy KL and gradient-norm spikes)", 0.5 + _bonus(r), [s.describe()],
                 f"raise {s.name} (towards {_ref(s)}) or lower the learning rate with it")


def gamma_short(hp: RunSettings, ctx: Context, *_: Any) -> Cause | None:
    """A discount whose horizon is far shorter than its reference's: the returns the critic learns and
    the advantages count only the next few rewards, so what pays off later is not learned."""
    found = _setting_off(hp, ctx, "gamma", above=False)
    if found is None:
        return None
    s, r = found
    return Cause("gamma_low", f"discount too short: {s.describe()}; the advantages count about the next "
                 f"{horizon(s.value):.3g} step(s) of reward, so what pays off later is not learned",
                 0.55 + _bonus(r), [s.describe()], f"raise gamma towards {_ref(s)}")


#: Per detector, the cause keys that push the other way from what it found: a setting that enlarges the
#: update cannot be why updates are too small (a learning rate 4x its default beside a clip fraction of 0
#: at the return's cap), nor one that shrinks it why they are too large.
OPPOSITE_CAUSES: dict[str, frozenset[str]] = {
    **dict.fromkeys(("clip_low", "reward_slow"), frozenset({"learning_rate_high", "n_epochs_high"})),
    # Smaller steps do not make the update, or the gradient it is measured from, jump.
    **dict.fromkeys(("kl_spike", "kl_climb", "clip_high", "policy_loss_growing", "grad_norm_spikes"),
                    frozenset({"learning_rate_low", "n_epochs_low"})),
    # Smaller steps, hotter sampling and a larger entropy bonus all keep the entropy up, not down.
    "entropy_collapse": frozenset({"learning_rate_low", "n_epochs_low", "temperature_high", "ent_coef_large"}),
}


def only_setting_off(hp: RunSettings, ctx: Context, detector: str) -> Cause | None:
    """The one setting read from the run that is far from its reference, when no rule tied the finding
    to a cause: named by elimination, at the naming bar and no higher (the run says only that nothing
    else it records differs). None when no setting, or more than one, is far off, and when that setting
    pushes the other way from what ``detector`` found (:data:`OPPOSITE_CAUSES`)."""
    s = _sole_setting_off(hp, ctx, detector, ctx.s.cause_setting_factor)
    if s is None:
        return None
    rest = [t.describe() for t in hp.settings.values() if t is not s and t.reference is not None]
    unjudged = [t.describe() for t in hp.settings.values() if t is not s and t.reference is None]
    return Cause(s.cause_key, f"the only setting read from this run that is far from its reference: {s.describe()}",
                 NAMED_SUPPORT, [s.describe()] + ([f"not far from their reference: {'; '.join(rest)}"] if rest else [])
                 + ([f"no reference to judge them by: {'; '.join(unjudged)}"] if unjudged else []), _towards(s))


def only_difference_from_healthy(hp: RunSettings, ctx: Context, detector: str) -> Cause | None:
    """The one setting in which the run differs from the task's healthy runs (by at least
    ``cause_sole_difference_factor``; :func:`only_setting_off` is asked first, for one far off), when every
    other setting read from it is theirs: the run is then a controlled comparison with them, and that setting
    is named by elimination, at the naming bar. None without a baseline of at least ``baseline_min_runs`` runs
    that records every setting read, when no setting or more than one differs, and when the one that does
    pushes the other way from what ``detector`` found (:data:`OPPOSITE_CAUSES`)."""
    read = list(hp.settings.values())
    if not read or any(s.healthy is None or s.healthy_n < ctx.s.baseline_min_runs for s in read):
        return None
    s = _sole_setting_off(hp, ctx, detector, ctx.s.cause_sole_difference_factor)
    if s is None:
        return None
    rest = "; ".join(t.describe() for t in read if t is not s)
    return Cause(s.cause_key, f"the only setting in which this run differs from the task's {s.healthy_n} healthy "
                 f"runs: {s.describe()}", NAMED_SUPPORT,
                 [s.describe()] + ([f"the healthy runs' own: {rest}"] if rest else []), _towards(s))


def _sole_setting_off(hp: RunSettings, ctx: Context, detector: str, factor: float) -> Setting | None:
    """The one setting read from the run that is ``factor`` or more off its reference (a maximum length its
    completions do not reach left out), unless it pushes the other way from what ``detector`` found; None when
    no setting, or more than one, is that far off."""
    off = [s for s in hp.off_reference(factor) if not _length_not_binding(s, ctx)]
    if len(off) != 1 or off[0].cause_key in OPPOSITE_CAUSES.get(detector, ()):
        return None
    return off[0]


def _towards(s: Setting) -> str:
    """The action for a setting named by elimination: move it back towards its reference, then compare."""
    return f"{'lower' if s.above_reference else 'raise'} {s.name} towards {_ref(s)} and compare"


def _length_not_binding(s: Setting, ctx: Context) -> bool:
    """A maximum response length far below the framework's default that the run's completions do not
    reach: its truncation share stayed within the healthy range over most of the run, so the limit
    cannot explain anything (a burst of cut completions is the completions changing, not the limit);
    or the limit the task's healthy runs use."""
    name = ctx.first("truncation")
    if s.knob != "max_response_length" or name is None:
        return False
    if s.healthy is not None and not s.off(ctx.s.cause_setting_factor):
        return True                     # the healthy runs of the task use this limit and are not cut by it
    _, high = ctx.range(name)
    if high is None:
        return False
    return float(np.median(ctx.series(name).y)) <= high or _room_before_cut(s, ctx, name, high)


def _room_before_cut(s: Setting, ctx: Context, trunc: str, high: float) -> bool:
    """Did the completions sit well inside the limit before the cut share first left its healthy range?
    Then the completions changed (a policy breaking into run-on text cuts every completion at once), not
    the limit they had room under; completions that grew into the limit sit near it first. False when
    the cut share is out of range from the first point (no "before" to read) or no length is logged."""
    length = ctx.first("length")
    if length is None:
        return False
    sr = ctx.series(trunc)
    over = np.flatnonzero(sr.raw_values > high)
    if over.size == 0 or over[0] == 0:
        return False
    before = ctx.values_between(length, int(sr.raw_steps[0]), int(sr.raw_steps[over[0]]) - 1)
    return before.size > 0 and float(np.median(before)) <= ctx.s.cause_length_room_frac * s.value


#: Where a TRL run's setting is read when its configuration was not recorded (a trainer_state.json
#: alone). TRL 1.16.0: GRPOConfig.num_iterations defaults to 1 and steps_per_generation to
#: gradient_accumulation_steps (trl/trainer/grpo_config.py); GRPOTrainer then keeps no old log-probs
#: and uses per_token_logps.detach() as the old ones (trl/trainer/grpo_trainer.py,
#: _generate_and_score_completions and _compute_loss), so the ratio is 1.
NOT_RECORDED = "not recorded: the framework's default"


def single_update(hp: RunSettings, ctx: Context) -> Setting | None:
    """The epochs setting when each batch gets exactly one policy update (ratio is 1 by construction);
    for a TRL run whose configuration was not recorded, TRL's default (one), marked as assumed."""
    if hp.framework not in ("trl",):
        return None
    s = hp.get("n_epochs")
    if s is None:
        default = FRAMEWORK_DEFAULTS["trl"]["n_epochs"]
        s = Setting("n_epochs", default, NOT_RECORDED, default, DEFAULT_SOURCES["trl"], "trl", key="num_iterations")
    return s if s.value == 1 else None


# ---------------------------------------------------------------------------------------
# Per detector: which causes apply
# ---------------------------------------------------------------------------------------
def sparse_reward(ctx: Context) -> Cause | None:
    """A return that never changed over the run: no episode reached another outcome."""
    const = _reward_constant(ctx)
    if const is None:
        return None
    return Cause("sparse_reward", f"the return never changed from {const:g}: no episode reached another outcome "
                 f"(a sparse reward that exploration has not found)", 0.8,
                 [f"{100 * ctx.s.cause_constant_share:.0f}% or more of the logged returns equal {const:g}"],
                 "explore more (entropy bonus, longer rollouts) or shape the reward")


def _generic(f: Finding, support: float = 0.15) -> list[Cause]:
    return [Cause("generic", text, support) for text in f.likely_causes]


_UPDATE_TOO_LARGE = ("update too large", "learning rate too high", "too-large update", "too large an update",
                     "destructive policy update", "one update far outside")


def _drop_contradicted(causes: list[Cause], specific: list[Cause], kl: str | None) -> list[Cause]:
    """Generic 'update too large' causes are contradicted by a small/normal KL with a narrow clip range."""
    narrow = any(c.key == "clip_range_small" and c.support >= NAMED_SUPPORT for c in specific)
    if narrow and kl in ("small", "normal"):
        return [c for c in causes if not any(t in c.text for t in _UPDATE_TOO_LARGE)]
    return causes


#: Sudden events: their KL evidence is read around their start.
ONSET_DETECTORS = frozenset({"entropy_collapse", "reward_drop", "reward_zero", "kl_spike", "clip_high"})
#: Findings that an earlier entropy collapse explains (a deterministic policy stops moving,
#: stops exploring and stops learning); they inherit that collapse's named cause.
AFTER_COLLAPSE = frozenset({"clip_low", "signal_collapse", "reward_flat", "value_loss_flat", "reward_drop",
                            "reward_zero"})
#: Order in which findings are explained: root events first, so consequences can cite them.
RANK_ORDER = ("kl_spike", "kl_climb", "clip_high", "entropy_collapse")


def _after_collapse(ctx: Context, f: Finding) -> list[Cause]:
    tol = int(ctx.s.joint_overlap_frac * ctx.span)
    out = []
    for c in ctx.findings:
        if c.detector != "entropy_collapse" or not c.at_least("warning") or c.start > f.start + tol:
            continue
        if c.evidence.get("gradual"):
            continue  # found beside a flat reward: it accompanies that reward, it does not explain it
        root = c.causes[0] if c.causes and c.causes[0].support >= NAMED_SUPPORT else None
        text = (f"the policy collapsed at step {c.start} (entropy {c.evidence.get('level_before', 0):.3g} -> "
                f"{c.evidence.get('level_after', 0):.3g}), so updates no longer change it"
                + (f"; that collapse's cause: {root.text}" if root else ""))
        out.append(Cause(root.key if root else "policy_collapsed", text, 0.7 if root else 0.55,
                         [f"entropy_collapse from step {c.start}"] + (root.evidence if root else []),
                         root.action if root else "resume from before the collapse"))
        break
    return out


def rank_causes(ctx: Context, f: Finding) -> None:
    """Fill ``f.causes`` (ranked), rewrite ``likely_causes`` and the action from them, set confidence."""
    hp: RunSettings = ctx.hp
    onset = f.detector in ONSET_DETECTORS
    kl, kl_level = _kl_state(ctx, f.start, f.end, onset)
    args = (hp, ctx, kl, kl_level)
    specific: list[Cause | None] = []
    d = f.detector
    if d == "clip_high":
        specific = [clip_small(*args), lr_high(*args), epochs_high(*args), ent_negative(*args)]
    elif d in ("kl_spike", "kl_climb", "policy_loss_growing", "grad_norm_spikes"):
        specific = [lr_high(*args), epochs_high(*args), clip_large(*args), kl_coef_small(*args)]
        if d in ("kl_spike", "grad_norm_spikes"):        # isolated spikes, not a systematic climb
            specific.append(batch_small(*args))
    elif d == "entropy_collapse":
        specific = [ent_negative(*args), lr_high(*args), epochs_high(*args), clip_large(*args)]
        flat = any(g.at_least("warning") for g in ctx.overlapping("reward_flat", f.start, f.end))
        if f.evidence.get("gradual") or flat:
            # A narrowing (steady, or a cliff) beside a flat reward: the advantages carried no signal.
            specific += [critic_not_fitting(ctx, f.start, f.end, kl, kl_level),
                         vf_coef_small(hp, ctx, f.start, f.end), sparse_reward(ctx)]
    elif d in ("reward_drop", "reward_zero"):
        specific = [lr_high(*args), epochs_high(*args), ent_negative(*args), clip_large(*args), gamma_short(*args)]
    elif d == "clip_low":
        specific = [lr_low(*args), clip_small_stalls(*args), ent_large(hp, ctx, f.start, f.end), ent_negative(*args)]
    elif d == "reward_slow":
        specific = [lr_low(*args), clip_small(*args), ent_large(hp, ctx, f.start, f.end), gamma_short(*args)]
    elif d == "reward_flat":
        specific = [lr_low(*args), ent_large(hp, ctx, f.start, f.end), ent_negative(*args), clip_small(*args),
                    epochs_high(*args), lr_high(*args)]
        specific.append(critic_not_fitting(ctx, f.start, f.end, kl, kl_level))
        specific.append(vf_coef_small(hp, ctx, f.start, f.end))
        specific.append(sparse_reward(ctx))
        specific.append(gamma_short(*args))
    elif d == "truncation":
        mx = hp.get("max_response_length")
        if mx is not None and not _length_not_binding(mx, ctx):
            specific = [Cause("max_response_length_small", f"the maximum response length is too short: "
                              f"{mx.describe()}", 0.55, [mx.describe()],
                              f"raise the maximum response length above {mx.value:g} (or mask truncated "
                              f"completions)")]
    elif d in ("value_loss_flat",):
        specific = [lr_low(*args), vf_coef_small(hp, ctx, f.start, f.end)]
    elif d in ("signal_collapse",):
        specific = [ent_negative(*args), group_small(hp, ctx, f.start, f.end)]
    elif d == "advantage_degenerate":
        specific = [group_small(hp, ctx, f.start, f.end)]
    found = [c for c in specific if c is not None]
    if d in AFTER_COLLAPSE:
        found += _after_collapse(ctx, f)
    generic = _drop_contradicted(_generic(f), found, kl)
    if not any(c.support >= NAMED_SUPPORT for c in found):
        found += [c for c in [only_setting_off(hp, ctx, d) or only_difference_from_healthy(hp, ctx, d)]
                  if c is not None]
    if d == "reward_flat" and not any(c.support >= NAMED_SUPPORT for c in found) and hp.settings:
        read = ", ".join(s.describe() for s in hp.settings.values())
        found.append(Cause("task_hyperparameters",
                           f"no setting read from this run is far from its reference ({read}): the configuration "
                           f"does not suit this task", 0.45, [read],
                           "tune the task's hyper-parameters (rollout size, gamma, learning rate) against a solved "
                           "configuration of this task"))
    if d == "clip_low" and kl == "high":
        generic = [c for c in generic if "too small" not in c.text and "too few" not in c.text]
    causes = sorted(found, key=lambda c: -c.support) + generic
    f.causes = causes
    f.likely_causes = [c.text for c in causes]
    top = causes[0] if causes else None
    if top is not None and top.support >= NAMED_SUPPORT and top.action:
        rb = f" (roll back to checkpoint at step {f.rollback_step})" if f.rollback_step is not None else ""
        f.suggested_action = top.action + rb
    elif d == "clip_low" and hp.get("learning_rate") is not None and (hp.get("learning_rate").ratio() or 1) >= 1:
        # The generic advice (raise the learning rate) is not supported by a run already at or above its reference.
        f.suggested_action = "check the KL to the old policy and the entropy before changing the learning rate"
    if kl is None and d in ("clip_high", "clip_low"):
        f.notes.append("no KL-to-old-policy curve: the update size could not be checked")
    if not hp.settings:
        f.notes.append("no hyper-parameters of this run are known: causes are ranked from its metrics only")


def apply_uninformative(ctx: Context, findings: list[Finding]) -> None:
    """Clip-fraction findings on a metric that is uninformative by construction become information."""
    hp: RunSettings = ctx.hp
    one = single_update(hp, ctx)
    clip = hp.get("clip_range")
    wide = clip is not None and (clip.far(ctx.s.cause_setting_factor) or 0) > 1
    for f in findings:
        if f.detector != "clip_low":
            continue
        if one is not None:
            assumed = one.source == NOT_RECORDED
            f.severity = "info"
            f.title = (f"clip fraction {f.evidence.get('median', 0):.3g} is uninformative by construction: "
                       + (f"this run's {one.name} is not recorded, and with TRL's default of {one.value:g} each batch "
                          "gets one policy update and the ratio is 1" if assumed else
                          f"{one.describe()}, so each batch gets one policy update and the ratio is 1"))
            f.causes = [Cause("clip_uninformative", f.title, 0.7 if assumed else 0.95, [one.describe()], "nothing to fix")]
            f.likely_causes = [f.title]
            f.suggested_action = "nothing to fix: judge the update size by the KL and the entropy instead"
        elif wide:
            f.severity = "info"
            f.title = (f"clip fraction {f.evidence.get('median', 0):.3g} is low by construction: {clip.describe()}, "
                       f"so the ratio rarely leaves [1 - eps, 1 + eps]")
            f.causes = [Cause("clip_range_large", f.title, 0.8, [clip.describe()],
                              f"lower clip_range towards {_ref(clip)} if updates are unstable")]
            f.likely_causes = [f.title]
            f.suggested_action = "judge the update size by the KL and the entropy instead of the clip fraction"


def finding_confidence(ctx: Context, f: Finding) -> str:
    """How sure the finding itself is: from how many points the metric has (and the cause's support)."""
    if f.detector == "unusual_setting":
        return "high"                        # read from the run's configuration, not estimated
    sr = ctx.series(f.metric)
    n = sr.n if sr is not None else 0
    if n < ctx.s.confidence_medium_points:
        return "low"
    if n < ctx.s.confidence_high_points:
        return "medium"
    return "high"


RANKERS: tuple[Callable[[Context, Finding], None], ...] = (rank_causes,)
