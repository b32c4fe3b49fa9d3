"""Every tunable of run diagnosis, in one place, plus the detector -> metric table.

Thresholds on a metric's *level* come from its :class:`~registry.analysis.diagnosis.types.MetricInfo`
(the dictionary's healthy range, task range already resolved) and from a learned
:class:`~registry.analysis.diagnosis.baseline.BaselineProfile`; ``fallback_ranges`` below is used
only for a metric whose definition gives no range. The numbers in
:class:`DiagnosisSettings` say how *persistent*, *sudden* or *large relative to the run's
own noise* a change must be before it is reported.

Lengths are in logged points unless a name ends in ``_frac`` (a fraction of the run's
logged points). Long curves are first reduced to at most ``max_points`` bins (median,
max and min of each bin) so that every detector is O(points) and vectorised; windows
given in logged points are divided by the bin size.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

#: Which canonical metrics each detector reads, best candidate first. The dictionary's
#: canonical names live here and only here: renaming a metric is a one-line change.
#: Detectors in ``FIRST_ONLY_ROLES`` read only the first candidate present in the run,
#: the others read every candidate present.
METRIC_ROLES: dict[str, tuple[str, ...]] = {
    "reward": ("reward_sequence_mean", "reward_total_mean", "episode_return_mean", "return_mean",
               "reward_accuracy_mean"),
    "reward_components": ("reward_accuracy_mean", "reward_format_mean"),
    "reward_family": ("reward_sequence_mean", "reward_total_mean", "episode_return_mean", "return_mean",
                      "reward_accuracy_mean", "reward_format_mean"),
    "kl": ("kl_ref_max", "kl_ref_mean", "kl_old_mean"),
    "kl_update": ("kl_old_mean",),          # KL to the old policy: size of one update
    "clip_fraction": ("clip_fraction",),
    "entropy": ("entropy",),
    "length": ("response_length_mean",),
    "value_loss": ("value_loss",),
    "explained_variance": ("explained_variance",),
    "signal_std": ("advantage_std", "reward_std", "reward_group_std", "episode_return_std"),
    "advantage_mean": ("advantage_mean",),
    "advantage_std": ("advantage_std",),
    "grad_norm": ("grad_norm",),
    "policy_loss": ("policy_loss",),
    "learning_rate": ("learning_rate",),
    "truncation": ("response_truncation_rate",),
    "zero_std_frac": ("reward_zero_std_fraction",),
    "kl_coef": ("kl_coef",),
    "eval_reward": ("eval_reward_mean",),
}
FIRST_ONLY_ROLES = frozenset({"reward", "kl_update", "length", "value_loss", "explained_variance",
                              "advantage_mean", "advantage_std", "grad_norm", "policy_loss",
                              "learning_rate", "entropy", "clip_fraction", "truncation", "zero_std_frac",
                              "kl_coef", "eval_reward"})

#: Layer a finding gets when its metric's definition does not say.
DEFAULT_LAYERS: dict[str, str] = {
    "reward_sequence_mean": "objective", "reward_total_mean": "objective",
    "episode_return_mean": "objective", "return_mean": "objective",
    "reward_accuracy_mean": "objective", "reward_format_mean": "objective",
    "kl_ref_max": "constraint", "kl_ref_mean": "constraint", "kl_old_mean": "constraint",
    "clip_fraction": "constraint", "entropy": "diagnostic",
}


def _default_fallback_ranges() -> dict[str, tuple[float | None, float | None]]:
    # Used only when a metric's definition has no healthy range.
    return {
        "kl_ref_mean": (None, 0.1),
        "kl_ref_max": (None, 1.0),
        "kl_old_mean": (1e-4, 0.05),
        "clip_fraction": (0.05, 0.3),
        "entropy": (0.01, None),
        "advantage_mean": (-0.1, 0.1),
        "explained_variance": (0.0, 1.0),
        # Share of responses cut at the maximum length, and of prompt groups with zero reward std,
        # above which it is a warning (shown on the plots as the diagnosis' default range).
        "response_truncation_rate": (None, 0.2),
        "reward_zero_std_fraction": (None, 0.5),
    }


@dataclass(frozen=True)
class DiagnosisSettings:
    """All tunables of :func:`registry.analysis.diagnosis.diagnose`, documented field by field."""

    # --- resolution and windows --------------------------------------------------------
    #: Curves longer than this are reduced to this many bins (median/max/min per bin).
    max_points: int = 1500
    #: The metric's smoothing window is capped to this fraction of the run's points, so
    #: that a 48-point run is not smoothed flat.
    max_window_frac: float = 0.08
    #: Minimum duration of a "persistent" condition: ``persist_frac`` of the run's points,
    #: at least ``persist_min_points`` and at most ``persist_max_points`` (bins).
    persist_frac: float = 0.04
    persist_min_points: int = 3
    persist_max_points: int = 60
    #: The "early" part of a run: this fraction of its points (at least 3 points).
    early_frac: float = 0.15
    #: Most findings one detector may report on one metric (largest first).
    max_findings_per_metric: int = 3

    # --- NaN / Inf ----------------------------------------------------------------------
    #: Non-finite values are critical from this many points on, a warning below.
    nonfinite_critical_points: int = 1

    # --- reward becomes zero / constant, reward drop, reward flat --------------------------
    #: |reward| <= zero_rel_tol * (90th percentile of |reward|) counts as zero.
    zero_rel_tol: float = 1e-3
    #: Consecutive values closer than this (relative to the reward's scale) count as constant.
    constant_rel_tol: float = 1e-7
    #: A constant level within this fraction of the range of its maximum is saturation
    #: (every episode hits the cap), not a broken reward.
    saturation_tol: float = 0.05
    #: A sudden drop must lose this fraction of the distance from the floor (healthy_low,
    #: or 0 when unknown) to the level before the drop ...
    drop_frac: float = 0.3
    #: ... and be this many times the run's own point-to-point noise (robust).
    drop_noise_k: float = 6.0
    #: A windowed episode mean is no level to fall from until this many episodes have finished
    #: (a mean of a handful of episodes is a lucky or unlucky few; 30 is the usual minimum for a
    #: sample mean to settle, and above CleanRL's 20-episode window it only delays, never hides).
    level_min_episodes: int = 30
    #: A gradual slide back must also lose this fraction of the task range, or without one of the
    #: reward's own magnitude: it says what a large loss is where the noise estimate cannot.
    regress_min_range_frac: float = 0.05
    #: Reward flat: improvement from the early to the late part smaller than this fraction
    #: of the healthy (task) range, while the late level is below ``flat_max_level`` of it.
    flat_min_improvement: float = 0.12
    flat_max_level: float = 0.8
    #: Without a healthy range: flat when the relative improvement is below this.
    flat_min_rel_improvement: float = 0.03
    #: Without a healthy range, a language model's batch reward is also flat when its late mean is above
    #: its early mean by less than this many standard errors of that difference: a gain the batch noise
    #: could make (the conventional two-sided 5% level), whatever its size relative to the reward's level.
    flat_llm_gain_se: float = 2.0
    #: Reward flat needs at least this many logged points (else it is only info).
    flat_min_points: int = 20
    #: A control run whose policy ended as random as it started (late entropy at least this
    #: fraction of the early entropy) has not learned a policy; its reward is called flat when
    #: it improved by less than ``flat_unsharpened_improvement`` (of the task range, or relative
    #: without one). The reward's own level cannot tell a slow start from no learning (a healthy
    #: Acrobot run sits at -500 for a third of its run while its entropy falls); the entropy can.
    flat_entropy_kept: float = 0.9
    flat_unsharpened_improvement: float = 0.5
    #: A plateau: over the last this fraction of the run the reward gains less than
    #: flat_min_improvement of its task range while below flat_max_level of it.
    plateau_frac: float = 0.3
    #: ... and is not still rising steadily (rank correlation with time below this).
    plateau_max_corr: float = 0.5
    #: A plateau is information when the run's learning rate over it is at most this share of its peak
    #: (annealed by its schedule) and no setting read from the run is far from its reference.
    plateau_lr_annealed: float = 0.5
    #: A control run's reward is still rising at its last logged step when the rank correlation of its
    #: raw values with time over the last ``plateau_frac`` of the run is at least this (and its smoothed
    #: level ends higher than it began there). Raw, not smoothed: a rolling median of noise is
    #: autocorrelated and ranks as a trend far more often.
    rising_min_corr: float = 0.5

    # --- KL ---------------------------------------------------------------------------
    #: A KL point this many times its recent running level (trailing median) is a spike ...
    spike_ratio: float = 5.0
    #: ... critical from this ratio on ...
    spike_ratio_critical: float = 10.0
    #: ... and, where the healthy high is known, from this multiple of it (0.1 against SB3's and CleanRL's 0.05).
    spike_critical_high_factor: float = 2.0
    #: ... and it must also exceed gate_frac * healthy_high (so tiny KL wiggles never fire).
    spike_gate_frac: float = 1.0
    #: Trailing window (points) for the running level; the metric's window if larger.
    spike_ref_points: int = 5
    #: Within the first window of a run the running level is the first update or two, which a fresh
    #: policy's KL climbs from to its operating level: a jump there counts only above this multiple of
    #: the healthy high. The zoo's tuned Pendulum runs climb from 0.011 to 0.06 in two updates (high
    #: 0.05); learning rates that blow up early jump to 0.2-2.9 in their first five.
    spike_early_high_factor: float = 1.5
    #: What followed a lone spike is read over this fraction of the run after it (and the reward's
    #: level before it): KL back in range and the reward not lower make it information.
    spike_aftermath_frac: float = 0.15
    #: A KL or clip fraction above its healthy high for at most this many times the persistence, back
    #: under it afterwards with the reward not lower and nothing else following, is information.
    excursion_persist_factor: float = 2.0
    #: KL persistently above healthy_high: climbing when the rank correlation of the
    #: smoothed KL with time over the climb is at least this.
    climb_min_corr: float = 0.6
    #: Critical when the smoothed KL exceeds healthy_high by this factor.
    kl_critical_factor: float = 5.0

    # --- clip fraction ----------------------------------------------------------------
    #: A single point above high * this factor counts even if short (the first update of
    #: a too-high learning rate); shorter excursions below it are info unless a KL spike
    #: coincides.
    clip_single_factor: float = 1.5
    #: "Persistently low" needs this fraction of the run's points.
    clip_low_min_frac: float = 0.25
    #: PPO's clip range when the run does not say its framework's default: 0.2, the default of every
    #: framework in ``hyperparams.FRAMEWORK_DEFAULTS`` (SB3, CleanRL, TRL, verl; sources there).
    usual_clip_range: float = 0.2
    #: Updates clipped although the policy barely moves: the effective clip range (from the clip
    #: fraction and the KL) below ``usual_clip_range / cause_setting_factor``; or, for a run that sets
    #: its clip range that far below its default, below this multiple of the set value. The estimate
    #: runs 10-20% above a narrow set value on the labelled runs (0.069 for a set 0.06, just above
    #: 0.2 / 3): the set value, once the curves confirm the bound binds, is the better measure.
    clip_binding_factor: float = 1.5
    #: "Too conservative" needs KL to the old policy below its healthy low, or (no low in its
    #: definition) below this fraction of its healthy high.
    kl_conservative_frac: float = 0.01
    #: With a baseline, "too conservative" also needs no more than this ratio of the KL to the healthy
    #: runs' KL (geometric mean over the baseline's phases the stretch covers, ``Context.phase_medians``). On
    #: the labelled runs up to batch 17, healthy runs' low-clip stretches stood at 0.35 of the healthy
    #: KL or above (a half-default clip range), learning rates 6x or more below the default at 0.18 or
    #: below. Batch 18 was placed before this rule and measures it.
    kl_conservative_baseline_ratio: float = 0.25
    #: ... counting the phases until the KL is back to this share of the healthy runs' (there the
    #: updates are no longer small, and the finding ends). Batch 18's lunarlander_lr_1e-4 reached
    #: 0.98 of it in its late phase after 0.08 and 0.15 before; acrobot_lr_5e-5 stayed at 0.34 or below.
    kl_recovered_ratio: float = 0.5
    #: Without a KL curve to corroborate, clip fraction below low * this is "too conservative".
    clip_near_zero_factor: float = 0.2
    #: A clip fraction below low * this from the start of training says the updates stay far inside the
    #: clip range (for SB3's 0.2, a KL well under 0.002); with the reward still rising at the last
    #: step, the run is held back by its update size. On the labelled runs up to batch 19 no healthy
    #: run's first-half median was below 0.0188, and learning rates 4x or more below the default
    #: were at 0.0017 or below.
    clip_held_back_factor: float = 0.1

    # --- entropy ------------------------------------------------------------------------
    #: A cliff loses at least this fraction of the entropy level ...
    cliff_frac: float = 0.5
    #: ... within this many points (or this fraction of the run, whichever is larger).
    cliff_points: int = 2
    cliff_run_frac: float = 0.02
    #: Critical when the level after the cliff is below this fraction of the level before.
    cliff_critical_ratio: float = 0.1
    #: A control run's cliff is information when its return kept rising after it, by this many times
    #: the return's point-to-point noise over the window after it, and held that level to the end.
    sharpen_rise_noise_k: float = 3.0
    #: A narrowing without a cliff is a problem only beside a reward judged flat: over the flat
    #: stretch the entropy ended below this fraction of its start (the policy narrowed
    #: without learning). Healthy control runs narrow as far, but their reward rises; on the labelled
    #: SB3 runs whose reward was flat, the entropy ended at 0.86-1.0 of its start when the policy kept
    #: exploring and at 0.09-0.27 when it did not.
    narrowing_entropy_frac: float = 0.5

    # --- response length vs reward (reward hacking) ------------------------------------
    #: Windows (fractions of the run) over which length growth and reward change are compared;
    #: several scales so that fast and slow steady growth are both seen.
    hack_window_fracs: tuple[float, ...] = (0.2, 0.4, 0.7)
    #: Length must grow by this fraction over the window ...
    hack_min_growth: float = 0.25
    #: ... near-monotonically (rank correlation with time at least this) ...
    hack_min_corr: float = 0.7
    #: ... while the reward changes by less than this fraction of its range (or falls).
    hack_reward_tol: float = 0.05

    # --- value loss -----------------------------------------------------------------------
    #: Not decreasing: staying above (1 - vl_min_decrease) * early level ...
    vl_min_decrease: float = 0.3
    #: ... for at least this fraction of the run.
    vl_min_frac: float = 0.3
    vl_min_points: int = 12
    #: Explained variance above this means the critic fits well: flat value loss is info.
    vl_good_explained_variance: float = 0.8
    #: ... and so is a flat value loss while the return rises steadily (rank correlation with
    #: time at least ``vl_chasing_corr``) by at least ``vl_chasing_gain`` of its range: the
    #: targets move, so the loss cannot fall.
    vl_chasing_corr: float = 0.8
    vl_chasing_gain: float = 0.2
    vl_chasing_explained_variance: float = 0.3

    # --- learning signal (advantage / reward std) ---------------------------------------
    #: Std below this fraction of its early level counts as zero.
    std_zero_frac: float = 0.05
    #: Critical when it is below this fraction at the end of the run.
    std_critical_frac: float = 0.01
    #: Advantage mean drifting: |mean| above this fraction of the advantage std level
    #: (used when the definition gives no healthy range).
    drift_frac: float = 0.2

    # --- grad norm spikes -----------------------------------------------------------------
    #: A spike is log(value / local median) above max(log(spike_min_ratio), spike_z * MAD).
    grad_spike_min_ratio: float = 3.0
    grad_spike_z: float = 6.0
    #: Spikes closer than max(grad_spike_gap_points, grad_spike_window_frac of the run) form
    #: a cluster; a cluster is "frequent" with at least grad_spike_min_count spikes at a rate
    #: >= grad_spike_min_rate and >= grad_spike_rate_factor x the run's own baseline rate
    #: (the spike rate over its first grad_spike_baseline_frac, outside the cluster judged).
    grad_spike_min_count: int = 3
    grad_spike_gap_points: int = 50
    grad_spike_window_frac: float = 0.1
    grad_spike_min_rate: float = 0.005
    grad_spike_rate_factor: float = 3.0
    grad_spike_baseline_frac: float = 0.25
    #: The local level a spike is measured against is at least this fraction of the run's median norm.
    grad_spike_floor_frac: float = 0.1

    # --- policy loss ----------------------------------------------------------------------
    #: Growing: |smoothed loss| rank-correlates with time at least this over the window ...
    pl_min_corr: float = 0.7
    #: ... and ends at least this many times its early scale (|median| + spread).
    pl_growth_factor: float = 3.0
    pl_window_frac: float = 0.2
    #: ... and still rising at the end: the window's last quarter this much above its first.
    pl_window_growth: float = 0.1

    # --- baseline comparison ---------------------------------------------------------------
    #: A phase median outside the learned band widened by this fraction of its width is a
    #: deviation; warning beyond ``baseline_warning_widths`` widths, else info.
    baseline_margin: float = 0.25
    baseline_warning_widths: float = 1.0
    #: Where the run ended: its reward's late phase is a warning (and the run did not end level with
    #: the healthy runs) from this many widths below the band, once the baseline holds
    #: ``baseline_many_runs`` healthy runs. Held-out healthy runs against baselines of 10 others (60
    #: draws per task) ended at most 0.23 widths below; slow learners 0.3-0.9. With 3 or 5 runs the
    #: band is a rougher estimate: 0-13% of healthy runs ended 0.5 widths below, so 1 width stays.
    baseline_late_reward_widths: float = 0.5
    baseline_many_runs: int = 10
    baseline_min_points: int = 3
    #: A baseline learned from fewer healthy runs is weak: its deviations are only info.
    baseline_min_runs: int = 3
    #: The band width used to measure a deviation is at least this many times the healthy
    #: runs' logging noise, and at least ``baseline_rel_floor`` of the level (a saturated
    #: metric's band has zero width).
    baseline_noise_floor: float = 2.0
    baseline_rel_floor: float = 0.01
    #: For a metric whose definition has no healthy range, the baseline's bands (early, mid and
    #: late together) widened by this many band widths on each side serve as one; a reward's or
    #: return's only below (``ranges.resolve_range``).
    baseline_range_widen: float = 1.0

    # --- joint readings ----------------------------------------------------------------------
    #: Findings overlap when their step ranges are within this fraction of the run's span.
    joint_overlap_frac: float = 0.05

    # --- truncation, degenerate advantages, KL coefficient vs KL, eval vs train -------------
    #: Share of responses cut at the maximum length: a warning above its healthy high (the
    #: definition's, else ``fallback_ranges``) and critical from this share on.
    truncation_critical: float = 0.5
    #: Share of zero-reward-std prompt groups: a warning above its healthy high (as above),
    #: critical from this level, and a rise from the early to the late part of the run that is
    #: a warning whatever the level.
    zero_std_critical: float = 0.8
    #: A share whose late mean is at least this is (nearly) every group alike: no learning signal left, critical
    #: whatever the reward did. Between ``zero_std_critical`` and this, a language model's reward that still
    #: gained past its batch noise (``flat_llm_gain_se``) says the remaining groups carry the learning: the share
    #: is then information (the batch is used inefficiently), not a failure.
    zero_std_total: float = 0.95
    #: ... unless the gradient norm's late median fell below this fraction of its early median: then the other
    #: groups carry no learning either (a gain made before the groups became alike is not one made since). On the
    #: TRL sweep the runs labelled with no learning signal end at 0.00001-0.006 of their early norm, the healthy
    #: runs at 0.06 or more, the sharpenings labelled borderline at 0.006-0.05.
    zero_std_gradient_left: float = 0.02
    #: Beside a baseline, a zero-std share is above the healthy runs only when its late mean is above
    #: the highest healthy run's by this many standard errors of that mean (a batch of two prompts gives
    #: shares of 0, 0.5 or 1: a 45-point mean moves by ~0.05 from batch luck alone).
    zero_std_above_healthy_se: float = 2.0
    zero_std_rise: float = 0.3
    #: KL coefficient and KL "move": rank correlation with time at least this and a relative
    #: change at least ``coupled_min_change`` from the early to the late part.
    coupled_min_corr: float = 0.6
    coupled_min_change: float = 0.3
    #: Evaluation reward falling by at least this fraction of its best while training rises.
    eval_min_fall: float = 0.1

    # --- causes from the run's own settings and metrics (registry/analysis/diagnosis/causes.py) -----
    #: A setting counts as far from its reference (the task's healthy runs, else the
    #: framework default) at this factor above or below it.
    cause_setting_factor: float = 3.0
    #: A learning rate above its reference by less than that, but by at least this factor, is named
    #: only beside a KL above its healthy high: the run's own updates then show the step is too large
    #: (a zoo Pendulum run at 2x the healthy runs' 1e-3 whose KL climbs to 0.3).
    cause_corroborated_factor: float = 1.5
    #: A setting at least this factor off the task's healthy runs' median, when every other setting read from
    #: the run is within it (a controlled comparison: the run is the healthy runs' configuration but for
    #: that setting), is named by elimination for a finding no rule explained. The TRL sweep's healthy runs
    #: share one configuration; temperature 0.7 (1.43x below it) stayed healthy, 0.5 (2x) collapsed.
    cause_sole_difference_factor: float = 1.5
    #: KL to the old policy below this fraction of its healthy high is "small".
    cause_kl_small_frac: float = 0.02
    #: Entropy "stayed" when its late level is at least this fraction of its early level ...
    cause_entropy_kept_frac: float = 0.9
    #: ... and "fell" when its late level is below this fraction of the early level.
    cause_entropy_fell_frac: float = 0.5
    #: An entropy coefficient at or above this is large (SB3's default is 0, TRL/verl use 0-0.001).
    cause_ent_coef_large: float = 0.05
    #: A reward equal to one value at this share of its points never changed (sparse reward).
    cause_constant_share: float = 0.9
    #: ... over the run and over its first stretch, this fraction of its points (it never had another value).
    cause_constant_first_frac: float = 0.1
    #: A maximum response length is not what cut completions whose median length, before the cut share first
    #: left its healthy range, was at most this fraction of it: they had room, so the completions changed.
    cause_length_room_frac: float = 0.5
    #: A critic whose explained variance stays below this does not fit the returns.
    cause_critic_explained_variance: float = 0.1

    # --- honest uncertainty ---------------------------------------------------------------
    #: A metric with fewer logged points than this is "not enough data to judge".
    min_points_to_judge: int = 8
    #: Finding confidence: low below ``confidence_medium_points`` points of its metric,
    #: medium below ``confidence_high_points``, else high.
    confidence_medium_points: int = 12
    confidence_high_points: int = 30

    #: Per-metric ranges used when the metric's definition has none: name -> (low, high).
    fallback_ranges: Mapping[str, tuple[float | None, float | None]] = field(
        default_factory=_default_fallback_ranges)

    def with_overrides(self, **changes: Any) -> "DiagnosisSettings":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["fallback_ranges"] = {k: list(v) for k, v in self.fallback_ranges.items()}
        return out


DEFAULT_SETTINGS = DiagnosisSettings()
