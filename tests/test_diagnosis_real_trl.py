"""Diagnosis of the committed real TRL GRPO runs, registered into a real SQLite registry.

Each run is TRL 1.16.0's own ``GRPOTrainer`` output as transformers' TensorBoard callback writes it
(``runs/<time>_<host>/``, keys prefixed ``train/``), with its ``GRPOConfig`` in ``config.json``, trained on
a tiny addition task by ``bench/real_runs/make_trl_sweep.py``; ``labels.yaml`` beside the runs says what
the curves show. The KL to the reference of this 2-layer model runs at 0.3-0.9 in healthy runs, far above
the diagnosis's default high for a language model's KL (0.1), so the healthy runs are judged with a
baseline of the others.
"""
from __future__ import annotations

import pytest
import yaml

from registry import open_registry
from registry.analysis.baselines import build_task_baseline
from registry.analysis.diagnosis.causes import only_difference_from_healthy, only_setting_off
from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.hyperparams import read_settings, settings_for_baseline
from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS
from registry.analysis.health import diagnose_run
from registry.importers.params import load_params_file
from real_labels import REAL, found_problem, load_labels, logger_run_dir

SWEEP = REAL / "trl_sweep"
LABELS = load_labels("trl_sweep")
TASK = "tiny-addition"
HEALTHY_RUNS = sorted(n for n, lab in LABELS.items() if lab["label"] == "healthy")
PROBLEM_RUNS = sorted(n for n, lab in LABELS.items() if lab["label"] == "problem")
#: Healthy runs (by their curves) that get a warning with a baseline of the other healthy runs; strict.
KNOWN_FALSE_ALARMS = {
    "default_s21": "its reward gain (0.63 -> 0.68, made in the first 40 steps) is under half what the other healthy "
                   "runs gain, so the reward reads flat beside them, and the entropy's steady fall with it; a KL "
                   "jump at step 7 comes before the KL has a level of its own",
    "temp_0.7_s38": "its reward gain (0.66 -> 0.72) is under half what the other healthy runs gain, so the reward "
                    "reads flat beside them, and the entropy's steady fall with it",
    # Batch 5 (first measured with DIAGNOSIS_VERSION 33). Its slow seeds default_s23 and default_s42 read flat beside
    # batch 5's healthy runs (gains up to +0.22) and no longer do beside batch 6's too (27 runs, gains from +0.05).
    # Batch 6 (first measured with DIAGNOSIS_VERSION 35).
    "default_s61": "its gain (+0.047, like default_s21's) reads flat beside the healthy runs",
    "temp_0.4_s67": "a start burst at steps 19-21 (KL 6.8 for three logged steps, grad norm 5-8.5, completions 2.5 "
                    "tokens) and 63-65 (8.7), and an entropy cliff 0.40 -> 0.19 at steps 94-119 that came back to "
                    "0.36-0.47: the label, read from 30-step windows, calls the run healthy for its gain and kept "
                    "entropy",
    "beta_0_s57": "steps 31-90: completions grow to 3.3 tokens (8 at step 57) with grad-norm spikes up to 75x and the "
                  "reward down to 0.46-0.55 before it rose; its label, read from 30-step windows, calls it healthy for "
                  "its gain (+0.118) and passes over that episode",
}
#: Labelled problems the diagnosis does not find without a baseline; strict.
KNOWN_MISSES = {
    "beta_2_s36": "its flat reward: the batch reward of the last 30 steps (0.68) is high enough that the gain over "
                  "the first 30 passes two standard errors of the batch noise",
    "beta_0.2_s56": "its grad-norm spikes (48 at step 202, 9-27 at 205-207, 22-34 at 260-261, beside ~1.2) are not "
                    "reported",
    "lr_2e-4_s55": "its flat reward without a baseline: its first 45 points hold the 0.56 of steps 1-30, so the late "
                   "mean is two standard errors above them (with a baseline it is found and the learning rate named)",
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('real') / 'trl.db'}")
    for name in sorted(LABELS):
        reg.register(logger_run_dir("trl_sweep", name), name=name, project="trl-sweep", algorithm="GRPO",
                     framework="trl", task=TASK, params=load_params_file(SWEEP / name / "config.json"))
    yield reg
    reg.close()


def warnings_of(registry, name: str, detector: str | None = None, *, baseline: bool = False) -> list:
    d = diagnose_run(registry, name, use_baseline=baseline)
    return [f for f in d.at_least("warning") if detector is None or f.detector == detector]


def settings_beside_the_other_healthy_runs(name: str) -> tuple:
    """``name``'s settings as the diagnosis reads them beside the other healthy runs' (the run's own left out), and a
    context holding them."""
    healthy = settings_for_baseline([load_params_file(SWEEP / n / "config.json") for n in HEALTHY_RUNS if n != name],
                                    "trl")
    hp = read_settings(load_params_file(SWEEP / name / "config.json"), "trl", healthy_params=healthy)
    return hp, Context({}, {}, DEFAULT_SETTINGS, hp=hp)


def test_registration_binds_trls_prefixed_keys(registry):
    series = {s["key"]: s["definition"] for s in registry.run_detail("default_s1")["series"]}
    assert series["train/reward"] == "reward_sequence_mean"
    assert series["train/kl"] == "kl_ref_mean"
    assert series["train/completions/clipped_ratio"] == "response_truncation_rate"
    assert series["train/frac_reward_zero_std"] == "reward_zero_std_fraction"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[n]))
                                  if n in KNOWN_MISSES else n for n in PROBLEM_RUNS])
def test_every_labelled_problem_is_found_over_its_steps(registry, name):
    """Found, not explained: without a baseline most of these findings name no cause (see the README)."""
    warn = warnings_of(registry, name)
    for prob in LABELS[name]["problems"]:
        found_problem(prob, warn, name)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FALSE_ALARMS[n]))
                                  if n in KNOWN_FALSE_ALARMS else n for n in HEALTHY_RUNS])
def test_healthy_runs_are_healthy_with_a_baseline_of_the_other_healthy_runs(registry, name):
    others = [n for n in HEALTHY_RUNS if n != name]
    build_task_baseline(registry, TASK, others, author="test")
    d = diagnose_run(registry, name)
    assert d.healthy, [f.summary() for f in d.at_least("warning")]


def test_a_healthy_seeds_slow_rise_is_judged_by_what_the_healthy_runs_gain(registry):
    """default_s1 gains 0.125, a tenth of the range its baseline learns from batch rewards (mostly their
    noise), but most of what the other healthy seeds gain: no flat reward beside the baseline."""
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "default_s1"], author="test")
    assert not warnings_of(registry, "default_s1", "reward_flat", baseline=True)
    assert warnings_of(registry, "lr_1e-4_s10", "reward_flat", baseline=True)


def test_a_format_reward_every_completion_passes_is_saturated_not_stuck(registry):
    """TRL logs each reward function's batch mean; a format check all completions pass sits at exactly 1."""
    assert not [f for f in warnings_of(registry, "default_s1", "reward_zero") if f.metric == "reward_format_mean"]


def test_a_steady_share_of_zero_std_groups_is_information_while_the_reward_rises(registry):
    """Groups of 4 with an accuracy near 15% leave about half the groups with equal rewards from the start."""
    d = diagnose_run(registry, "default_s2", use_baseline=False)
    (zs,) = [f for f in d.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert zs.severity == "info"


def test_a_collapse_to_empty_completions_is_found_as_the_reward_reaching_zero(registry):
    hit = [f for f in warnings_of(registry, "lr_1e-2_s7", "reward_zero") if f.start <= 100 and f.end >= 250]
    assert hit and hit[0].severity == "critical"


def test_truncation_names_the_maximum_length_only_where_completions_reach_it(registry):
    (trunc,) = warnings_of(registry, "maxlen_1_s16", "truncation")
    assert trunc.cause == "max_response_length_small"
    assert "max_completion_length" in trunc.summary() or "maximum response length" in trunc.causes[0].text
    # A length of 8 is 64x below TRL 1.16.0's default 512, but these completions end at 2 tokens: never the cause.
    d = diagnose_run(registry, "beta_0_s12", use_baseline=False)
    assert d.by_detector("entropy_collapse") and all(f.cause != "max_response_length_small" for f in d.findings)


def test_a_kl_penalty_is_not_called_large_against_trls_default_of_none(registry):
    d = diagnose_run(registry, "lr_6e-3_s20", use_baseline=False)
    assert all(f.cause != "kl_coef_large" for f in d.findings)


def test_a_limit_the_healthy_runs_share_is_not_the_cause_of_a_burst_of_cut_completions(registry):
    """At 10x the learning rate every completion is cut for 100 steps: the completions changed, not the limit,
    which the task's healthy runs share without being cut."""
    build_task_baseline(registry, TASK, HEALTHY_RUNS, author="test")
    cut = warnings_of(registry, "lr_3e-2_s9", "truncation", baseline=True)
    assert any(f.start <= 5 and f.end >= 95 for f in cut)
    assert all(f.cause != "max_response_length_small" for f in cut)


def test_a_token_entropy_collapsing_onto_one_answer_is_found_where_it_stays_down(registry):
    """At 3x the learning rate the entropy falls 0.95 -> 0.42 in ten steps and on to 0.001 from step 90."""
    hit = [f for f in warnings_of(registry, "lr_1e-2_s7", "entropy_collapse") if f.end >= 290]
    assert hit and hit[0].severity == "critical" and "on down to" in hit[0].title


def test_a_flat_total_is_found_beside_a_component_that_hit_zero_for_a_while(registry):
    """beta = 1.0: the accuracy component is 0 through a blow-up (steps 67-83), the total never rises."""
    assert warnings_of(registry, "beta_1_s13", "reward_zero")
    assert warnings_of(registry, "beta_1_s13", "reward_flat")


def test_a_batch_mean_repeating_its_commonest_value_is_not_a_stuck_reward(registry):
    """Four updates per batch log a reward every 4th step; 0.625, its commonest value, repeats 5 times in a row."""
    assert not [f for f in warnings_of(registry, "iters_4_s14", "reward_zero") if f.metric == "reward_sequence_mean"]


def test_a_sampling_temperature_far_below_trls_default_is_named_for_a_flat_reward(registry):
    """temperature 0.3 (TRL 1.16.0's GRPOConfig default 1.0): the only setting far off, named by elimination."""
    (flat,) = warnings_of(registry, "temp_0.3_s17", "reward_flat")
    assert flat.cause == "temperature_low"
    assert "temperature = 0.3" in flat.causes[0].text and "TRL default 1" in flat.causes[0].text
    # The learning rate has no TRL reference here (its default, 1e-6, is set for models of billions of weights):
    # the evidence says so, instead of counting it among the settings near their reference.
    assert any(e.startswith("no reference to judge them by: learning_rate = 0.003") for e in flat.causes[0].evidence)


def test_one_batch_kl_jumps_are_judged_by_what_followed_not_by_a_judgement_of_the_whole_run(registry):
    """default_s23's KL reaches 5.9-6.9 at single steps (102, 166, 251) and is back at 0.3 the next; a reward
    judged flat over the whole run beside the baseline is not something those batches led to."""
    # The healthy runs of the first two batches: beside the third's (smaller gains) its gain is no longer flat.
    third = set(yaml.safe_load((SWEEP / "split.yaml").read_text())["held_out_trl_3"])
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "default_s23" and n not in third],
                        author="test")
    d = diagnose_run(registry, "default_s23")
    assert d.by_detector("reward_flat") and d.by_detector("kl_spike")
    assert all(f.severity == "info" for f in d.by_detector("kl_spike"))


def test_a_reward_gain_the_batch_noise_could_make_is_flat_without_a_baseline(registry):
    """lr_1e-3_s25 gains 0.6 -> 0.65, 7% relative (above the 3% a relative test asks), but 1.6 standard
    errors of its batch noise; the healthy default_s2 gains 5 standard errors."""
    (flat,) = warnings_of(registry, "lr_1e-3_s25", "reward_flat")
    assert "standard errors of its batch noise" in flat.title
    assert not warnings_of(registry, "default_s2", "reward_flat")


def test_a_blow_up_the_reward_climbed_out_of_does_not_hide_that_it_never_gained(registry):
    """beta_1_s13's reward falls to 0.24 at steps 61-80 and returns to 0.6: both the fall and the flat run."""
    build_task_baseline(registry, TASK, HEALTHY_RUNS, author="test")
    detectors = {f.detector for f in warnings_of(registry, "beta_1_s13", baseline=True)}
    assert {"reward_drop", "reward_flat"} <= detectors


def test_a_reward_std_at_zero_as_often_as_chance_makes_it_is_no_signal_collapse(registry):
    """beta_0.4_s26's batch reward std is 0 at 10 of steps 43-57, at a rate of 35% elsewhere: TRL's reward_std
    is the std over the whole batch of two groups, 0 whenever both agree."""
    assert not warnings_of(registry, "beta_0.4_s26", "signal_collapse")
    # Every completion empty from step 90 on: the batch std is 0 at all of its last 210 steps.
    assert [f for f in warnings_of(registry, "lr_1e-2_s7", "signal_collapse") if f.start <= 100 and f.end >= 290]


def test_the_zero_std_share_is_read_against_the_healthy_runs_own_means(registry):
    """Per step the share of zero-std groups of two prompts is 0, 0.5 or 1; the range a baseline learns is the
    spread of the healthy runs' means, and temp_0.5_s29 (every group agreeing from step 121) is above it."""
    build_task_baseline(registry, TASK, HEALTHY_RUNS, author="test")
    d = diagnose_run(registry, "temp_0.5_s29")
    low, high = d.ranges_used["reward_zero_std_fraction"]["low"], d.ranges_used["reward_zero_std_fraction"]["high"]
    assert 0.0 <= low < high <= 1.0
    assert [f for f in d.by_detector("advantage_degenerate") if f.at_least("warning")]


def test_clip_fraction_leaves_out_the_updates_that_compare_the_policy_with_itself(registry):
    """With num_iterations = 2 every other step is a batch's first update (ratio 1, clip 0 by construction)."""
    d = diagnose_run(registry, "iters_2_eps_0.05_s27", use_baseline=False)
    assert "clip_fraction" in d.derived and "num_iterations = 2" in d.derived["clip_fraction"]["text"]
    assert all(f.start > 100 for f in d.by_detector("clip_low") if f.at_least("warning"))


def test_a_language_models_entropy_cliff_landing_where_healthy_runs_are_is_information(registry):
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "iters_2_eps_0.05_s27"], author="test")
    d = diagnose_run(registry, "iters_2_eps_0.05_s27")
    (first,) = [f for f in d.by_detector("entropy_collapse") if f.start < 100]
    assert first.severity == "info" and "inside the band of the task's" in first.title
    assert [f for f in diagnose_run(registry, "lr_6e-3_s20").by_detector("entropy_collapse") if f.at_least("warning")]


def test_a_burst_of_cut_completions_after_short_ones_is_not_blamed_on_the_limit(registry):
    """lr_5e-2_s34: completions of 2 tokens at step 1, then every one cut at 8 from step 37 (the model broke).
    The limit is 64x below TRL's default and cuts most of the run, but the completions had room under it;
    maxlen_1_s16's answers never fit under its limit of 1, and there the limit is named."""
    d = diagnose_run(registry, "lr_5e-2_s34", use_baseline=False)
    assert d.by_detector("truncation")
    assert all(f.cause != "max_response_length_small" for f in d.findings)
    (trunc,) = warnings_of(registry, "maxlen_1_s16", "truncation")
    assert trunc.cause == "max_response_length_small"


def test_a_reward_that_stuck_at_zero_after_other_values_is_no_sparse_reward(registry):
    """lr_5e-2_s34's reward is exactly 0 for 88% of the run, after 0.06-0.75 over its first 35 steps."""
    d = diagnose_run(registry, "lr_5e-2_s34", use_baseline=False)
    assert all(c.key != "sparse_reward" for f in d.findings for c in f.causes)


def test_a_group_size_the_healthy_runs_share_is_not_the_cause_of_identical_rewards(registry):
    """At a pass rate of 0 every group agrees, whatever its size; the healthy runs use the same groups of 4."""
    build_task_baseline(registry, TASK, HEALTHY_RUNS, author="test")
    d = diagnose_run(registry, "lr_5e-2_s34")
    degenerate = d.by_detector("advantage_degenerate") + d.by_detector("signal_collapse")
    assert degenerate and all(c.key != "group_size_small" for f in degenerate for c in f.causes)


def test_a_language_models_clip_fraction_near_zero_alone_is_information(registry):
    """TRL logs no KL to the old policy; its sign-aware token clip count is 0 on most update steps of a
    healthy run with num_iterations = 3 (published verl GSM8K logs show 0.000-0.001)."""
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "iters_3_s37"], author="test")
    low = diagnose_run(registry, "iters_3_s37").by_detector("clip_low")
    assert low and all(f.severity == "info" for f in low)
    assert "no KL to the old policy is logged" in low[0].title


def test_a_learning_rate_below_its_reference_is_not_named_by_elimination_for_grad_norm_spikes(registry):
    """A smaller step does not make the gradient it is measured from jump: by elimination it would advise raising
    the learning rate against spikes of the gradient norm (lr_3e-4_s35 is 10x below the healthy runs')."""
    hp, ctx = settings_beside_the_other_healthy_runs("lr_3e-4_s35")
    assert only_setting_off(hp, ctx, "reward_flat").key == "learning_rate_low"
    assert only_setting_off(hp, ctx, "grad_norm_spikes") is None
    assert only_setting_off(hp, ctx, "kl_spike") is None


def test_grad_norm_spikes_in_the_first_quarter_are_not_their_own_reference(registry):
    """beta_2_s36: spikes of 148x, 128x and 89x at steps 11, 52 and 58 (every healthy run's largest norm is
    4.7-16); with a baseline the penalty 50x the healthy runs' is named."""
    (spikes,) = warnings_of(registry, "beta_2_s36", "grad_norm_spikes")
    assert spikes.start == 11 and spikes.end == 58
    build_task_baseline(registry, TASK, HEALTHY_RUNS, author="test")
    (spikes,) = warnings_of(registry, "beta_2_s36", "grad_norm_spikes", baseline=True)
    assert spikes.cause == "kl_coef_large"


def test_an_ordinary_batch_after_batches_without_gradient_is_no_spike(registry):
    """lr_3e-5_s11: batches where every group is rewarded alike have norms of 3e-4-3e-3 beside the run's usual
    0.9; the next ordinary batch is not a 1000x spike."""
    assert not warnings_of(registry, "lr_3e-5_s11", "grad_norm_spikes")


def test_a_drift_from_the_reference_above_the_default_high_is_a_warning_only_with_harm(registry):
    """Without a baseline the KL to the reference is judged against the diagnosis default (0.1 nats per token,
    a rule of thumb): default_s2 drifts to 0.8 while its reward rises 0.64 -> 0.87, information that names the
    default; lr_5e-2_s34's drift to 5-9 comes with its reward falling to 0, a warning."""
    d = diagnose_run(registry, "default_s2", use_baseline=False)
    climbs = d.by_detector("kl_climb")
    assert climbs and all(f.severity == "info" for f in climbs)
    assert all("diagnosis default" in f.title and "did not fall" in f.title for f in climbs)
    assert all(not f.causes for f in climbs)
    assert [f for f in warnings_of(registry, "lr_5e-2_s34", "kl_climb") if f.evidence["level_max"] > 5]


def test_the_kl_leaving_the_reference_is_no_spike_and_a_batch_above_a_rising_level_is_judged_by_what_followed(registry):
    """default_s2's KL to the reference goes from 0 to 0.3 over its first steps, peaking at 0.97 (at v32 "KL jumped
    from a recent level of ~0", critical); maxlen_3_s50's batch at 2.5 during the rise from 0.05 to 0.18 sits far
    above the level before and after it, and the reward did not fall after it."""
    d = diagnose_run(registry, "default_s2", use_baseline=False)
    assert not [f for f in d.by_detector("kl_spike") if f.at_least("warning")]
    assert not [f for f in d.by_detector("kl_spike") if f.start <= 15]
    d = diagnose_run(registry, "maxlen_3_s50", use_baseline=False)
    (jump,) = [f for f in d.by_detector("kl_spike") if f.start <= 30 <= f.end]
    assert jump.severity == "info" and "of the jump's peak" in jump.title
    # A blow-up that stays (lr_5e-2_s34: 5-9 from step 2, the reward at 0) is no outlier batch.
    assert warnings_of(registry, "lr_5e-2_s34", "kl_climb")


def test_most_groups_alike_while_the_reward_gains_is_information_every_group_alike_is_not(registry):
    """temp_1.2_s49's zero-std share rises to 0.86 while its reward gains +0.14 (2.6 standard errors): the other
    groups carry the learning. lr_8e-3_s54's reaches 1 (every group alike from step 118) although its reward also
    gained (+0.16: one answer per prompt fixed); default_s21's 0.81 comes with a reward flat by its batch noise."""
    d = diagnose_run(registry, "temp_1.2_s49", use_baseline=False)
    (share,) = [f for f in d.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert share.severity == "info" and "carry the learning" in share.title
    assert [f for f in warnings_of(registry, "lr_8e-3_s54", "advantage_degenerate") if f.severity == "critical"]
    assert [f for f in warnings_of(registry, "default_s21", "advantage_degenerate") if f.severity == "critical"]


def test_most_groups_alike_with_no_gradient_left_is_critical_whatever_the_reward_gained_before(registry):
    """temp_0.6_s66 gained the most of the sweep (+0.24) before its groups became alike (0.93 late); its gradient norm
    then fell to 0.0065, 0.004x its early 1.6: the other groups carry no learning either. temp_1.2_s49's norm keeps
    0.07x its early level while its share sits at 0.86: information, as above."""
    (share,) = [f for f in warnings_of(registry, "temp_0.6_s66", "advantage_degenerate")
                if f.metric == "reward_zero_std_fraction"]
    assert share.severity == "critical" and "no learning signal is left" in share.title
    assert share.evidence["gradient_left"] < 0.01
    d = diagnose_run(registry, "temp_1.2_s49", use_baseline=False)
    (kept,) = [f for f in d.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert kept.severity == "info" and kept.evidence["gradient_left"] > 0.05


def test_the_one_setting_a_run_has_apart_from_the_healthy_runs_is_named_for_what_no_rule_explained(registry):
    """lr_8e-3_s54 is the healthy runs' configuration but for a learning rate 2.7x theirs (under the 3x that makes
    a setting far off), temp_0.5_s29 but for a temperature 2x below: with a baseline of those runs, the findings no
    rule explained (an entropy collapse, grad-norm spikes) name that setting. Without the baseline there is no
    controlled comparison and nothing is named by it; iters_2_eps_0.05_s27 differs in two settings and gets no
    cause from it either."""
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "iters_2_eps_0.05_s27"], author="test")
    for name, key, setting in (("lr_8e-3_s54", "learning_rate_high", "learning_rate = 0.008"),
                               ("temp_0.5_s29", "temperature_low", "temperature = 0.5")):
        found = warnings_of(registry, name, baseline=True)
        collapse = [f for f in found if f.detector == "entropy_collapse"]
        assert collapse and {f.cause for f in found} == {key}, name
        assert collapse[0].causes[0].text.startswith("the only setting in which this run differs from the task's")
        assert setting in collapse[0].causes[0].text
        assert all(f.cause is None for f in warnings_of(registry, name, "entropy_collapse"))
    two = warnings_of(registry, "iters_2_eps_0.05_s27", baseline=True)
    assert not any(c.text.startswith("the only setting in which") for f in two for c in f.causes)


def test_a_setting_that_keeps_the_entropy_up_is_not_named_for_its_collapse(registry):
    """A learning rate below the healthy runs' moves the policy less, not into a collapse."""
    hp, ctx = settings_beside_the_other_healthy_runs("lr_3e-4_s35")
    assert only_difference_from_healthy(hp, ctx, "reward_flat").key == "learning_rate_low"
    assert only_difference_from_healthy(hp, ctx, "entropy_collapse") is None
    assert only_setting_off(hp, ctx, "entropy_collapse") is None


def test_what_followed_a_kl_jump_is_read_from_the_reward_means_not_from_medians_of_batch_rewards(registry):
    """default_s61's batch rewards take a few values (0.5, 0.625, 0.75, ...): after its KL jump at steps 142-145 their
    median fell 0.72 -> 0.5 while their mean went 0.72 -> 0.70, within the batch noise; the jumps are information.
    default_s63's mean fell 0.73 -> 0.61 (2.1 standard errors) after its KL episode at steps 68-74, the setback its
    label describes: that one stays a warning."""
    build_task_baseline(registry, TASK, [n for n in HEALTHY_RUNS if n != "default_s61"], author="test")
    assert not warnings_of(registry, "default_s61", "kl_spike", baseline=True)
    jumps = diagnose_run(registry, "default_s61").by_detector("kl_spike")
    assert any(f.start == 126 and "nothing followed" in f.title for f in jumps)
    assert [f for f in warnings_of(registry, "default_s63", "kl_spike") if f.start == 68]


def test_a_kl_jump_to_the_level_the_run_holds_later_or_a_brief_burst_back_near_zero_is_judged_by_what_followed(
        registry):
    """default_s1's KL jumps 0.05 -> 0.49 at step 44 during its first rise, to the 0.4-0.6 it holds from step 100;
    default_s52's sits at 1.7-2.9 for seven steps (6-12) and is back at 0.03-0.1 after: with the reward no lower
    after either, both are information without a baseline. iters_4_s14's jump to 2.4-3.5 at steps 61-68 is
    followed by the reward falling from 0.68 to 0.47: still a warning, with its labelled cause."""
    for name in ("default_s1", "default_s52"):
        assert not warnings_of(registry, name, "kl_spike"), name
    (jump,) = [f for f in warnings_of(registry, "iters_4_s14", "kl_spike") if f.start == 61]
    assert jump.severity == "critical" and jump.cause == "n_epochs_high"
