"""Diagnosis that follows the run's own evidence: causes from its settings, honest uncertainty,
the detectors real GRPO/PPO logs need, readings composed from their findings."""
from __future__ import annotations

import numpy as np
import pytest

from registry.analysis.diagnosis import Curve, diagnose
from registry.analysis.diagnosis.fixtures import default_metric_infos
from registry.analysis.diagnosis.hyperparams import read_settings
from registry.web import smoothing

INFOS = default_metric_infos()


def _steps(n: int) -> np.ndarray:
    return np.arange(1, n + 1) * 10


def _kl_spikes_beside_a_rising_return(seed: int, n: int = 100) -> dict[str, Curve]:
    """Three isolated KL spikes (0.18-0.25 on a level of 0.008) while the return rises steadily."""
    rng = np.random.default_rng(seed)
    kl = np.abs(0.008 + rng.normal(0, .001, n))
    kl[[30, 55, 80]] = [0.2, 0.25, 0.18]
    return {"kl_old_mean": Curve(_steps(n), kl),
            "episode_return_mean": Curve(_steps(n), np.linspace(20, 400, n) + rng.normal(0, 5, n))}


# --- settings read from the run ------------------------------------------------------------
def test_settings_are_read_under_each_frameworks_own_keys_and_compared_with_its_defaults():
    sb3 = read_settings({"clip_range": 0.02, "learning_rate": 3e-4, "n_epochs": 10.0}, "stable-baselines3")
    assert sb3.get("clip_range").describe() == "clip_range = 0.02, 10x below the SB3 default 0.2"
    assert sb3.get("learning_rate").describe() == "learning_rate = 0.0003, as the SB3 default 0.0003"
    trl = read_settings({"epsilon": 0.2, "num_iterations": 1, "beta": 0.04, "max_completion_length": 1024}, "trl")
    assert trl.value("clip_range") == 0.2 and trl.value("n_epochs") == 1 and trl.value("kl_coef") == 0.04
    verl = read_settings({"actor_rollout_ref.actor.clip_ratio": 0.28, "actor_rollout_ref.actor.ppo_epochs": 1,
                          "data.max_response_length": 2048}, "verl")
    assert verl.value("clip_range") == 0.28 and verl.value("max_response_length") == 2048
    # No framework: generic names only; Adam's epsilon is not taken for a clip range.
    unknown = read_settings({"optim.epsilon": 1e-8, "ppo.lr": 1e-5})
    assert unknown.get("clip_range") is None and unknown.value("learning_rate") == 1e-5
    # A logged schedule stands in for a missing hyperparameter.
    logged = read_settings({}, "stable-baselines3", {"clip_range": Curve(_steps(5), np.full(5, 0.05))})
    assert logged.value("clip_range") == 0.05 and logged.get("clip_range").source == "logged series 'clip_range'"



def test_discount_and_gae_lambda_are_compared_by_the_horizon_they_set():
    sb3 = read_settings({"gamma": 0.5, "gae_lambda": 0.0, "n_steps": 64}, "stable-baselines3")
    assert sb3.get("gamma").describe() == ("gamma = 0.5 (a horizon of 2 steps), a horizon 50x shorter than the SB3 "
                                           "default 0.99's (100 steps)")
    assert sb3.get("gamma").off(3) and sb3.get("gamma").cause_key == "gamma_low"
    assert sb3.get("gae_lambda").off(3) and sb3.get("gae_lambda").cause_key == "gae_lambda_low"
    assert sb3.get("n_steps").describe() == "n_steps = 64, 32x below the SB3 default 2048"
    assert sb3.get("n_steps").cause_key == "n_steps_small"
    longer = read_settings({"gamma": 0.999}, "stable-baselines3").get("gamma")
    assert "a horizon 10x longer than" in longer.describe() and longer.cause_key == "gamma_high"
    # Twice the value's distance from 1 is only 2x the horizon: not far; nor is the healthy runs' own discount.
    assert not read_settings({"gamma": 0.98}, "stable-baselines3").get("gamma").off(3)
    zoo = read_settings({"gamma": 0.9}, "stable-baselines3", healthy_params={"gamma": [0.9, 0.9, 0.9]}).get("gamma")
    assert zoo.off(3) is False and zoo.describe().endswith("as the median of 3 healthy run(s) of this task 0.9")
    clean = read_settings({"gamma": 0.99, "gae-lambda": 0.95, "num-steps": 16}, "cleanrl")
    assert clean.value("gae_lambda") == 0.95 and clean.get("n_steps").describe() == (
        "num-steps = 16, 8x below the CleanRL default 128")
    # Without a framework "gamma" may be a learning-rate scheduler's: not read.
    assert read_settings({"scheduler.gamma": 0.5}).get("gamma") is None


def test_a_setting_is_named_by_elimination_only_when_it_is_the_one_far_from_its_reference():
    """cartpole_gae_0_s43: KL spikes and clipping with every setting the diagnosis reads at SB3's defaults but
    gae_lambda = 0; no rule ties a spike to the GAE lambda, but it is the one setting that differs."""
    curves = _kl_spikes_beside_a_rising_return(seed=5)

    def spike_causes(params: dict) -> list:
        d = diagnose(curves, INFOS, params={"learning_rate": 3e-4, **params}, framework="stable-baselines3")
        return [f.causes[0] if f.causes else None for f in d.by_detector("kl_spike") if f.at_least("warning")]

    alone = spike_causes({"gae_lambda": 0.0})
    assert alone and all(c.key == "gae_lambda_low" and c.support == 0.5 for c in alone)
    assert alone[0].text.startswith("the only setting read from this run that is far from its reference: gae_lambda")
    assert alone[0].action == "raise gae_lambda towards 0.95 and compare"
    # A rule that reads the run's updates wins over elimination; two settings off leave the cause open.
    assert {c.key for c in spike_causes({"gae_lambda": 0.0, "learning_rate": 3e-3})} == {"learning_rate_high"}
    two = spike_causes({"gae_lambda": 0.0, "n_steps": 64})
    assert two and all(c is None or c.support < 0.5 for c in two)


# --- uninformative by construction ---------------------------------------------------------
def test_trl_clip_ratio_with_one_update_per_batch_is_uninformative_not_a_problem():
    n = 60
    rng = np.random.default_rng(0)
    curves = {"clip_fraction": Curve(_steps(n), np.zeros(n)),
              "kl_old_mean": Curve(_steps(n), np.zeros(n)),
              "reward_sequence_mean": Curve(_steps(n), np.clip(np.linspace(0.2, 0.7, n) + rng.normal(0, .02, n), 0, 1))}
    d = diagnose(curves, INFOS, params={"num_iterations": 1, "epsilon": 0.2}, framework="trl")
    low = d.by_detector("clip_low")
    assert low and all(f.severity == "info" for f in low)
    assert "uninformative by construction" in low[0].title and "num_iterations = 1" in low[0].title
    assert "raise the learning rate" not in low[0].suggested_action
    # The same curves from a run with several updates per batch: a real "too conservative" finding.
    d2 = diagnose(curves, INFOS, params={"num_iterations": 4, "epsilon": 0.2}, framework="trl")
    assert any(f.severity == "warning" for f in d2.by_detector("clip_low"))


# --- honest uncertainty ---------------------------------------------------------------------
def test_a_two_step_excerpt_is_not_called_healthy():
    curves = {"reward_sequence_mean": Curve([1, 2], [0.3, 0.31]), "kl_old_mean": Curve([1, 2], [0.01, 0.012])}
    d = diagnose(curves, INFOS)
    assert not d.healthy and d.verdict == "not enough data"
    assert "not enough data to judge reward_sequence_mean (2 point(s), 8 needed)" in d.summary()
    assert d.to_dict()["verdict"] == "not enough data"


def test_summary_says_what_was_checked_and_confidence_follows_the_data():
    n = 200
    rng = np.random.default_rng(1)
    reward = np.clip(np.linspace(0.2, 0.8, n) + rng.normal(0, 0.02, n), 0, 1)
    kl = 0.01 * np.exp(rng.normal(0, 0.1, n))
    kl[120] = 0.5
    d = diagnose({"reward_sequence_mean": Curve(_steps(n), reward), "kl_old_mean": Curve(_steps(n), kl),
                  "entropy": Curve(_steps(5), [1.0, 0.9, 0.8, 0.9, 0.85])}, INFOS)
    assert "checked: reward (drop, flat, zero), KL (spikes, climb)" in d.summary()
    assert "not enough data to judge entropy (5 point(s), 8 needed)" in d.summary()
    spike = d.by_detector("kl_spike")[0]
    assert spike.confidence == "high" and spike.to_dict()["confidence"] == "high"
    # Every range a detector judged by is reported with where it came from.
    assert d.ranges_used["kl_old_mean"] == {"low": None, "high": 0.05, "source": "dictionary: healthy range"}


# --- detectors the real logs need -----------------------------------------------------------
def test_every_advantage_exactly_zero_is_a_critical_finding():
    n = 40
    z = np.zeros(n)
    curves = {"advantage_max": Curve(_steps(n), z), "advantage_min": Curve(_steps(n), z),
              "advantage_mean": Curve(_steps(n), z), "policy_loss": Curve(_steps(n), z),
              "reward_sequence_mean": Curve(_steps(n), np.full(n, 0.0))}
    d = diagnose(curves, INFOS)
    f = d.by_detector("advantage_degenerate")
    assert f and f[0].severity == "critical" and "every advantage is exactly 0" in f[0].title
    assert f[0].evidence["policy_loss_zero_share"] == 1.0 and not d.healthy


def test_rising_share_of_zero_std_groups_and_truncation_are_reported():
    n = 80
    rng = np.random.default_rng(2)
    curves = {"reward_zero_std_fraction": Curve(_steps(n), np.clip(np.linspace(0.1, 0.7, n) + rng.normal(0, .02, n), 0, 1)),
              "response_truncation_rate": Curve(_steps(n), np.clip(np.linspace(0.3, 0.95, n), 0, 1)),
              "response_length_mean": Curve(_steps(n), np.linspace(600, 1020, n)),
              "reward_sequence_mean": Curve(_steps(n), np.clip(np.linspace(0.3, 0.6, n) + rng.normal(0, .01, n), 0, 1))}
    d = diagnose(curves, INFOS, params={"max_completion_length": 1024}, framework="trl")
    zs = [f for f in d.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert zs and "zero reward std" in zs[0].title and "up from" in zs[0].title
    tr = d.by_detector("truncation")
    assert tr and tr[0].severity == "critical" and tr[0].cause == "max_response_length_small"
    assert "max_completion_length = 1024" in tr[0].likely_causes[0]
    # A healthy share of truncation (a few percent) is not reported.
    quiet = dict(curves, response_truncation_rate=Curve(_steps(n), np.full(n, 0.03)))
    assert not diagnose(quiet, INFOS).by_detector("truncation")


def test_kl_coefficient_and_kl_moving_in_opposite_directions():
    n = 100
    curves = {"kl_coef": Curve(_steps(n), np.linspace(0.1, 0.01, n)),
              "kl_ref_mean": Curve(_steps(n), np.linspace(0.005, 0.05, n)),
              "reward_sequence_mean": Curve(_steps(n), np.linspace(0.2, 0.6, n))}
    f = diagnose(curves, INFOS).by_detector("kl_coef_opposite")
    assert f and "penalty weakens as the policy drifts" in f[0].title and f[0].layer == "constraint"
    same = dict(curves, kl_coef=Curve(_steps(n), np.linspace(0.01, 0.1, n)))
    assert not diagnose(same, INFOS).by_detector("kl_coef_opposite")


def test_eval_falling_while_train_reward_rises():
    n = 100
    curves = {"reward_sequence_mean": Curve(_steps(n), np.linspace(0.2, 0.8, n)),
              "eval_reward_mean": Curve(_steps(n)[::10], [0.3, 0.45, 0.55, 0.6, 0.58, 0.5, 0.45, 0.42, 0.4, 0.38])}
    f = diagnose(curves, INFOS).by_detector("eval_diverging")
    assert f and f[0].layer == "objective" and f[0].start == 310 and "fell 33%" in f[0].title  # to the median of the last 3 evaluations
    both_up = dict(curves, eval_reward_mean=Curve(_steps(n)[::10], np.linspace(0.3, 0.7, 10)))
    assert not diagnose(both_up, INFOS).by_detector("eval_diverging")


def test_texts_are_worded_for_the_kind_of_run():
    from registry.analysis.diagnosis.baseline import build_baseline

    n = 60
    steps = _steps(n)
    ret = np.linspace(20, 200, n)
    control = {"episode_return_mean": Curve(steps, ret), "episode_length_mean": Curve(steps, ret)}
    prof = build_baseline("CartPole-v1", [control] * 3)
    assert "episodes last longer" in prof.metrics["episode_length_mean"].warning
    assert "responses" not in prof.metrics["episode_length_mean"].warning
    longer = {"episode_return_mean": Curve(steps, ret), "episode_length_mean": Curve(steps, ret * 3)}
    d = diagnose(longer, INFOS, baseline=prof)
    assert d.run_kind == "control"
    assert not any("hacking" in " ".join(f.likely_causes) for f in d.findings)
    llm = build_baseline("math", [{"response_length_mean": Curve(steps, np.linspace(200, 300, n))}] * 3)
    assert "responses are longer" in llm.metrics["response_length_mean"].warning


def test_total_reward_rising_while_a_component_falls():
    n = 100
    rng = np.random.default_rng(3)
    acc = np.clip(np.linspace(0.5, 0.3, n) + rng.normal(0, 0.01, n), 0, 1)
    fmt = np.clip(np.linspace(0.1, 0.9, n) + rng.normal(0, 0.01, n), 0, 1)
    curves = {"reward_sequence_mean": Curve(_steps(n), acc + fmt), "reward_accuracy_mean": Curve(_steps(n), acc),
              "reward_format_mean": Curve(_steps(n), fmt)}
    f = diagnose(curves, INFOS).by_detector("components_diverging")
    assert f and f[0].metric == "reward_accuracy_mean" and "reward_format_mean rising" in f[0].title
    together = dict(curves, reward_accuracy_mean=Curve(_steps(n), np.linspace(0.3, 0.5, n)))
    assert not diagnose(together, INFOS).by_detector("components_diverging")


# --- joint readings state only what their findings measured ----------------------------------
def test_trust_region_reading_without_a_clip_finding_does_not_claim_a_high_clip_fraction():
    n = 300
    rng = np.random.default_rng(0)
    kl = 0.01 * np.exp(rng.normal(0, 0.1, n))
    kl[150:] *= np.exp(np.linspace(0, np.log(30), n - 150))
    reward = np.clip(np.linspace(0.2, 0.8, n) + rng.normal(0, 0.01, n), 0, 1)
    clip = np.clip(0.1 + rng.normal(0, 0.01, n), 0, 1)          # logged, and never high
    d = diagnose({"kl_old_mean": Curve(_steps(n), kl), "reward_sequence_mean": Curve(_steps(n), reward),
                  "clip_fraction": Curve(_steps(n), clip)}, INFOS)
    tr = [j for j in d.joint_readings if j.kind == "trust_region"]
    assert tr and "clip fraction" not in tr[0].interpretation
    assert "kl_old_mean climbed to" in tr[0].interpretation and "reward rose by" in tr[0].interpretation


# --- smoothing keeps a short run's level ----------------------------------------------------
@pytest.mark.parametrize("n", [20, 49, 300])
def test_adaptive_window_keeps_the_level_of_a_short_run(n):
    steps = np.arange(n)
    # A return that rises and sits at its cap for the last 40% of the run, as a solved CartPole run does.
    y = np.minimum(500.0, 20 + 480 / (0.6 * n) * steps)
    w = smoothing.adaptive_window(50, n)
    assert w == min(50, max(1, round(0.1 * n)))
    ema = smoothing.smooth(y, "ema", w)
    assert abs(ema[-1] - y[-1]) < 0.02 * y[-1]
    if n < 100:
        fixed = smoothing.smooth(y, "ema", 50)
        assert y[-1] - fixed[-1] > 0.1 * y[-1]       # the fixed 50-point window drags the end down
    assert smoothing.adaptive_window(5, 1000) == 5    # never widened


# --- group and batch size as causes ----------------------------------------------------------
def _steady_zero_std_run(n: int = 80) -> dict:
    """A GRPO run whose pass rate sits near 0.8 and whose share of zero-std groups near 0.68."""
    rng = np.random.default_rng(5)
    return {"reward_zero_std_fraction": Curve(_steps(n), np.clip(0.68 + rng.normal(0, .03, n), 0, 1)),
            "reward_sequence_mean": Curve(_steps(n), np.clip(0.8 + rng.normal(0, .02, n), 0, 1))}


def test_a_small_group_is_named_when_its_expected_share_of_identical_rewards_matches_the_run():
    curves = _steady_zero_std_run()
    d = diagnose(curves, INFOS, params={"num_generations": 2}, framework="trl")
    zs = [f for f in d.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert zs and zs[0].cause == "group_size_small"
    top = zs[0].causes[0]
    # 0.8^2 + 0.2^2 = 0.68 expected with groups of 2, against 0.8^8 + 0.2^8 = 0.17 with TRL's default 8.
    assert "num_generations = 2, 4x below the TRL default 8" in top.text and "68%" in top.text
    assert any("17% with groups of 8" in e for e in top.evidence)
    assert "raise num_generations" in zs[0].suggested_action
    # Groups of 16 would see almost no identical rewards at this pass rate: the group is not the cause.
    big = diagnose(curves, INFOS, params={"num_generations": 16}, framework="trl")
    zs = [f for f in big.by_detector("advantage_degenerate") if f.metric == "reward_zero_std_fraction"]
    assert zs and not any(c.key == "group_size_small" for c in zs[0].causes)


def test_one_response_per_prompt_explains_advantages_that_are_all_zero():
    n = 40
    rng = np.random.default_rng(6)
    curves = {"advantage_mean": Curve(_steps(n), np.zeros(n)), "advantage_std": Curve(_steps(n), np.zeros(n)),
              "policy_loss": Curve(_steps(n), np.zeros(n)),
              "reward_sequence_mean": Curve(_steps(n), np.clip(0.4 + rng.normal(0, .05, n), 0, 1))}
    d = diagnose(curves, INFOS, params={"actor_rollout_ref.rollout.n": 1}, framework="verl")
    deg = [f for f in d.by_detector("advantage_degenerate") if f.at_least("warning")]
    assert deg and deg[0].cause == "group_size_small" and "n = 1" in deg[0].likely_causes[0]
    # With several responses per prompt the same zeros get no group-size cause.
    d4 = diagnose(curves, INFOS, params={"actor_rollout_ref.rollout.n": 8}, framework="verl")
    deg = [f for f in d4.by_detector("advantage_degenerate") if f.at_least("warning")]
    assert deg and all(c.key != "group_size_small" for c in deg[0].causes)


def test_a_tiny_minibatch_is_a_cause_of_kl_spikes_only_when_the_run_has_one():
    curves = _kl_spikes_beside_a_rising_return(seed=7)
    small = diagnose(curves, INFOS, params={"batch_size": 8, "learning_rate": 3e-4}, framework="stable-baselines3")
    spikes = small.by_detector("kl_spike")
    assert spikes and spikes[0].cause == "batch_size_small"
    assert "batch_size = 8, 8x below the SB3 default 64" in spikes[0].likely_causes[0]
    usual = diagnose(curves, INFOS, params={"batch_size": 64, "learning_rate": 3e-4}, framework="stable-baselines3")
    assert usual.by_detector("kl_spike")
    assert all(c.key != "batch_size_small" for f in usual.by_detector("kl_spike") for c in f.causes)


def test_a_learning_rate_twice_the_healthy_runs_is_named_beside_a_kl_above_its_high():
    """pendulum_zoo_lr_2e-3 beside a zoo baseline (learning rate 1e-3): 2x is not far enough to count alone, but with
    the KL climbing above its healthy high the run's own updates say the step is too large."""
    from registry.analysis.diagnosis import build_baseline

    n = 60
    rng = np.random.default_rng(11)
    ret = lambda: Curve(_steps(n), np.linspace(-1200, -200, n) + rng.normal(0, 10, n))  # noqa: E731
    healthy = [{"episode_return_mean": ret(), "kl_old_mean": Curve(_steps(n), 0.03 * np.exp(rng.normal(0, .1, n)))}
               for _ in range(3)]
    base = build_baseline("Pendulum-v1", healthy, infos=INFOS, hyperparams={"learning_rate": [1e-3] * 3})
    climbing = {"episode_return_mean": ret(), "kl_old_mean": Curve(_steps(n), np.geomspace(0.03, 0.4, n))}

    def lr_named(lr: float, curves: dict) -> set:
        d = diagnose(curves, INFOS, baseline=base, params={"learning_rate": lr}, framework="stable-baselines3")
        return {f.cause for f in d.by_detector("kl_climb") if f.at_least("warning")}

    assert lr_named(2e-3, climbing) == {"learning_rate_high"}
    assert lr_named(1.2e-3, climbing) == {None}         # within the healthy runs' spread of settings: no cause
