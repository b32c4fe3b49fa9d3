"""Run diagnosis: each detector on synthetic and hand-built input, the real SB3 runs, output shape."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from registry.analysis.diagnosis import (Curve, DiagnosisSettings, MetricInfo, METRIC_ROLES, diagnose)
from registry.analysis.diagnosis.fixtures import default_metric_infos, load_sb3_run
from registry.demo.synthetic import KIND_ALGORITHMS, generate_run

SB3 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sb3_ppo"
needs_sb3 = pytest.mark.skipif(not SB3.is_dir(), reason="shared/data/sb3_ppo not present")

#: anomaly kind -> detector that must report it
DETECTOR_FOR = {
    "kl_blowup": ("kl_spike", "kl_climb"),
    "entropy_collapse": ("entropy_collapse",),
    "reward_std_zero": ("signal_collapse",),
    "length_hacking": ("length_hacking",),
    "value_loss_flat": ("value_loss_flat",),
    "grad_norm_spikes": ("grad_norm_spikes",),
    "reward_zero": ("reward_zero",),
    "nan": ("nan_inf",),
    "clip_high": ("clip_high",),
    "clip_low": ("clip_low",),
    "policy_loss_growing": ("policy_loss_growing",),
    "advantage_mean_drift": ("advantage_drift",),
    "stagnant": ("reward_flat",),
}

INFOS = default_metric_infos()


def _diag(run, **kw):
    return diagnose(run.curves, run.metric_infos(INFOS), **kw)


def _cases():
    for kind, dets in DETECTOR_FOR.items():
        for alg in KIND_ALGORITHMS[kind]:
            for seed, n in ((11, 400), (12, 2500)):
                yield pytest.param(kind, alg, seed, n, dets, id=f"{kind}-{alg}-{n}")


@pytest.mark.parametrize("kind,alg,seed,n,dets", list(_cases()))
def test_detector_fires_at_the_injected_step_and_not_on_the_healthy_twin(kind, alg, seed, n, dets):
    run = generate_run(kind, seed=seed, algorithm=alg, n_steps=n)
    label = run.labels[0]
    steps = run.curves[run.reward_metric].steps
    span = int(steps[-1] - steps[0])
    tol = int(0.02 * span)
    found = [f for f in _diag(run).at_least("warning") if f.detector in dets]
    assert found, f"{dets} did not fire on {kind}"
    # the finding covers the anomaly, and was not detected before the anomaly existed
    assert any(f.end >= label.start - tol and f.start <= label.start + 0.4 * span for f in found)
    first = min(f.detected_at for f in found)
    assert first >= label.start - tol, (first, label.start)
    # the healthy twin (same seed, algorithm, task, length, step scale) is clean
    twin = generate_run("healthy", seed=seed, algorithm=alg, n_steps=n, task=run.task,
                        step_stride=run.params["step_stride"])
    twin_diag = _diag(twin)
    assert not [f for f in twin_diag.at_least("warning") if f.detector in dets]


@pytest.mark.parametrize("alg", ["grpo", "ppo"])
@pytest.mark.parametrize("seed", range(8))
def test_healthy_synthetic_runs_raise_no_warning(alg, seed):
    run = generate_run("healthy", seed=100 + seed, algorithm=alg)
    warn = _diag(run).at_least("warning")
    assert not warn, [f.summary() for f in warn]


# ---------------------------------------------------------------------------------------
# Hand-built curves: the rules themselves, independent of the generator
# ---------------------------------------------------------------------------------------
def _c(values, stride=1):
    v = np.asarray(values, dtype=float)
    return Curve(np.arange(1, v.size + 1) * stride, v)


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_kl_spike_fires_on_the_spike_step_and_not_on_a_3x_wiggle():
    rng = _rng()
    kl = 0.01 * np.exp(rng.normal(0, 0.1, 200))
    kl[120] = 0.08                       # 8x its running level, above healthy high 0.05
    d = diagnose({"kl_old_mean": _c(kl)}, INFOS)
    spikes = d.by_detector("kl_spike")
    assert len(spikes) == 1 and spikes[0].start == 121 and spikes[0].severity == "warning"
    assert spikes[0].evidence["ratio"] == pytest.approx(8, rel=0.15)
    kl[120] = 0.03                       # 3x: not a spike
    assert not diagnose({"kl_old_mean": _c(kl)}, INFOS).by_detector("kl_spike")


def test_a_lone_kl_spike_that_nothing_followed_is_information_and_a_harmful_one_stays_a_warning():
    rng = _rng(3)
    n = 60
    kl = 0.008 * np.exp(rng.normal(0, 0.1, n))
    kl[25] = 0.06                        # 7.5x, once, above the healthy high 0.05
    rising = np.linspace(20, 450, n) + rng.normal(0, 5, n)
    d = diagnose({"kl_old_mean": _c(kl), "episode_return_mean": _c(rising)}, INFOS)
    (spike,) = d.by_detector("kl_spike")
    assert spike.severity == "info" and "nothing followed" in spike.title and "back at 0.00" in spike.title
    assert d.healthy and not spike.causes
    # The same jump followed by a falling return is a problem with causes.
    falling = rising.copy()
    falling[26:] = np.linspace(rising[25], 60, n - 26)
    hurt = diagnose({"kl_old_mean": _c(kl), "episode_return_mean": _c(falling)}, INFOS)
    assert hurt.by_detector("kl_spike")[0].severity == "warning"
    # A KL that stays up after the jump is no lone spike either.
    stays = kl.copy()
    stays[25:] = 0.06 * np.exp(rng.normal(0, 0.05, n - 25))
    assert diagnose({"kl_old_mean": _c(stays), "episode_return_mean": _c(rising)},
                    INFOS).by_detector("kl_spike")[0].severity != "info"
    # Without a reward curve nothing shows that the jump did no harm.
    assert diagnose({"kl_old_mean": _c(kl)}, INFOS).by_detector("kl_spike")[0].severity == "warning"
    # Two jumps are judged each by what followed it: harmless both, information both ...
    twice = kl.copy()
    twice[45] = 0.06
    assert all(f.severity == "info" for f in diagnose({"kl_old_mean": _c(twice), "episode_return_mean": _c(rising)},
                                                         INFOS).by_detector("kl_spike"))
    # ... and when the return falls after the second, both stay warnings: the first was followed by it.
    after_second = rising.copy()
    after_second[46:] = np.linspace(rising[45], 60, n - 46)
    spikes = diagnose({"kl_old_mean": _c(twice), "episode_return_mean": _c(after_second)},
                      INFOS).by_detector("kl_spike")
    assert len(spikes) == 2 and all(f.severity == "warning" for f in spikes)
    # A jump far above the healthy high is critical; ten times a run's own tiny level alone is not.
    far = kl.copy()
    far[25] = 0.2
    assert diagnose({"kl_old_mean": _c(far), "episode_return_mean": _c(rising)}, INFOS).by_detector(
        "kl_spike")[0].severity == "critical"
    low = 0.005 * np.exp(rng.normal(0, 0.1, n))
    low[25] = 0.07                       # 14x the run's level, 1.4x the healthy high
    (spike,) = diagnose({"kl_old_mean": _c(low), "episode_return_mean": _c(falling)}, INFOS).by_detector("kl_spike")
    assert spike.evidence["ratio"] >= 10 and spike.severity == "warning"


def test_kl_spike_needs_the_healthy_range_gate():
    kl = np.full(100, 1e-4)
    kl[50] = 1e-3                        # 10x, but far below the healthy high
    assert not diagnose({"kl_old_mean": _c(kl)}, INFOS).by_detector("kl_spike")


def test_a_kl_rising_to_its_operating_level_in_the_first_updates_is_no_spike():
    """pendulum_zoo_s6: KL 0.011, 0.016, then 0.060 and about 0.05 from there on (the zoo's tuned configuration
    runs at the healthy high); against its first update that is 5.7x, but no running level exists yet."""
    rng = _rng(8)
    kl = np.concatenate([[0.0107, 0.0158, 0.0603], 0.048 * np.exp(rng.normal(0, 0.08, 21))])
    assert not diagnose({"kl_old_mean": _c(kl, 4096)}, INFOS).by_detector("kl_spike")
    # An early jump well above the high still counts (a learning rate that blows up in its third update) ...
    early = kl.copy()
    early[2] = 0.25
    f = diagnose({"kl_old_mean": _c(early, 4096)}, INFOS).by_detector("kl_spike")
    assert f and f[0].start == 3 * 4096 and f[0].severity == "critical"
    # ... and once a running level exists, the usual gate (the healthy high itself) applies.
    later = np.concatenate([0.0107 * np.exp(rng.normal(0, 0.05, 12)), [0.0603], 0.0107 * np.ones(11)])
    assert diagnose({"kl_old_mean": _c(later, 4096)}, INFOS).by_detector("kl_spike")


def test_kl_climbing_steadily_is_reported_with_its_onset():
    rng = _rng(1)
    n = 300
    kl = 0.01 * np.exp(rng.normal(0, 0.1, n))
    kl[150:] *= np.exp(np.linspace(0, np.log(20), n - 150))        # 0.01 -> 0.2 steadily
    f = diagnose({"kl_old_mean": _c(kl)}, INFOS).by_detector("kl_climb")
    assert f and "climbing steadily" in f[0].title
    assert 130 <= f[0].start <= 220 and f[0].end == n


def test_one_noisy_clip_point_does_not_fire_but_a_persistent_excursion_does():
    rng = _rng(2)
    clip = np.clip(0.1 + rng.normal(0, 0.01, 200), 0, 1)
    clip[80] = 0.35                      # one point above 0.3, below 1.5 x 0.3
    assert not diagnose({"clip_fraction": _c(clip)}, INFOS).at_least("warning")
    clip[100:140] = 0.4
    f = diagnose({"clip_fraction": _c(clip)}, INFOS).by_detector("clip_high")
    assert f and f[0].severity == "warning" and 95 <= f[0].start <= 105 and 135 <= f[0].end <= 145
    # a single point far above the range (>= 1.5 x high) is not noise: a short burst
    burst = np.clip(0.1 + rng.normal(0, 0.01, 200), 0, 1)
    burst[50] = 0.5
    f = diagnose({"clip_fraction": _c(burst)}, INFOS).by_detector("clip_high")
    assert [(x.start, x.severity) for x in f] == [(51, "warning")] and "short burst" in f[0].title


def test_a_brief_clip_excursion_that_nothing_followed_is_information_and_a_harmful_or_long_one_is_not():
    rng = _rng(21)
    n = 24                               # the zoo's Pendulum runs log 24 updates
    clip = np.clip(0.26 + rng.normal(0, 0.015, n), 0, 1)
    clip[5:8] = [0.315, 0.326, 0.341]    # three updates above 0.3, then back near 0.27
    rising = np.linspace(-1300, -190, n) + rng.normal(0, 10, n)
    curves = lambda c, r: {"clip_fraction": _c(c, 4096), "episode_return_mean": _c(r, 4096)}  # noqa: E731
    d = diagnose(curves(clip, rising), INFOS)
    (f,) = d.by_detector("clip_high")
    assert f.severity == "info" and "brief excursion that nothing followed" in f.title and not f.causes
    assert d.healthy
    # The same excursion followed by a falling return stays a problem.
    falling = rising.copy()
    falling[8:] = np.linspace(rising[7], -1400, n - 8)
    assert diagnose(curves(clip, falling), INFOS).by_detector("clip_high")[0].severity == "warning"
    # Twice the persistence or longer is a regime, not an excursion.
    long = clip.copy()
    long[5:13] = 0.33
    assert diagnose(curves(long, rising), INFOS).by_detector("clip_high")[0].severity == "warning"
    # A clip fraction that stays up afterwards is no excursion either.
    stays = clip.copy()
    stays[5:] = 0.33 + rng.normal(0, 0.005, n - 5)
    assert diagnose(curves(stays, rising), INFOS).by_detector("clip_high")[0].severity == "warning"
    # Without a reward curve nothing shows that it did no harm.
    assert diagnose({"clip_fraction": _c(clip, 4096)}, INFOS).by_detector("clip_high")[0].severity == "warning"
    # The KL above its high over the same updates is the same event: both are information together.
    kl = 0.03 * np.exp(rng.normal(0, 0.05, n))
    kl[5:8] = [0.056, 0.061, 0.058]
    both = diagnose(dict(curves(clip, rising), kl_old_mean=_c(kl, 4096)), INFOS)
    assert [(f.detector, f.severity) for f in both.findings if f.detector in ("clip_high", "kl_climb")] \
        == [("kl_climb", "info"), ("clip_high", "info")], [f.summary() for f in both.findings]
    assert "(with clip_high)" in both.by_detector("kl_climb")[0].title and both.healthy
    # ... and both stay problems when the KL climbs on afterwards.
    kl[8:12] = [0.07, 0.09, 0.12, 0.15]
    worse = diagnose(dict(curves(clip, rising), kl_old_mean=_c(kl, 4096)), INFOS)
    assert worse.by_detector("clip_high")[0].severity == "warning" and not worse.healthy


def test_clip_low_needs_kl_corroboration():
    rng = _rng(3)
    clip = np.clip(0.02 + rng.normal(0, 0.002, 100), 0, 1)
    normal_kl = 0.005 * np.exp(rng.normal(0, 0.1, 100))
    d = diagnose({"clip_fraction": _c(clip), "kl_old_mean": _c(normal_kl)}, INFOS)
    assert [f.severity for f in d.by_detector("clip_low")] == ["info"]
    d = diagnose({"clip_fraction": _c(clip * 0), "kl_old_mean": _c(normal_kl * 1e-3)}, INFOS)
    assert [f.severity for f in d.by_detector("clip_low")] == ["warning"]


def test_a_kl_small_for_its_task_corroborates_a_low_clip_fraction_only_against_a_baseline():
    from registry.analysis.diagnosis import build_baseline
    rng = _rng(4)
    n = 100
    healthy = [{"clip_fraction": _c(np.clip(0.02 + rng.normal(0, 0.002, n), 0, 1)),
                "kl_old_mean": _c(0.004 * np.exp(rng.normal(0, 0.2, n)))} for _ in range(3)]
    # 8e-4: above the absolute low (1% of the KL's healthy high) but 5x below the task's healthy runs.
    run = {"clip_fraction": _c(np.zeros(n)), "kl_old_mean": _c(8e-4 * np.exp(rng.normal(0, 0.2, n)))}
    alone = diagnose(run, INFOS).by_detector("clip_low")
    assert [f.severity for f in alone] == ["info"] and "kl_ratio_to_baseline" not in alone[0].evidence
    base = build_baseline("Task", healthy, infos=INFOS)
    found = diagnose(run, INFOS, baseline=base).by_detector("clip_low")
    assert [f.severity for f in found] == ["warning"], [f.summary() for f in found]
    assert 0.15 < found[0].evidence["kl_ratio_to_baseline"] < 0.25
    assert "below the healthy runs' (early" in found[0].title and "Task baseline (3 healthy runs)" in found[0].title
    # A KL at half the healthy runs' is no evidence of a too-conservative update.
    half = {"clip_fraction": _c(np.zeros(n)), "kl_old_mean": _c(0.002 * np.exp(rng.normal(0, 0.2, n)))}
    assert [f.severity for f in diagnose(half, INFOS, baseline=base).by_detector("clip_low")] == ["info"]
    # A KL that comes back to the healthy runs' level ends the finding: what follows is information.
    back = 8e-4 * np.exp(rng.normal(0, 0.2, n))
    back[70:] *= 5
    split = diagnose({"clip_fraction": _c(np.zeros(n)), "kl_old_mean": _c(back)}, INFOS, baseline=base)
    parts = [(f.severity, f.end < base.late_start_step) for f in split.by_detector("clip_low")]
    assert parts == [("warning", True), ("info", False)], [f.summary() for f in split.by_detector("clip_low")]
    assert "late" not in split.by_detector("clip_low")[0].title
    # Two healthy runs make a weak baseline: it corroborates nothing.
    weak = build_baseline("Task", healthy[:2], infos=INFOS)
    assert [f.severity for f in diagnose(run, INFOS, baseline=weak).by_detector("clip_low")] == ["info"]


def _held_back_run(rng, n=60, clip=0.0005, rising=True):
    """A control run logging like SB3: an episode return that rises linearly (or levels off at two
    thirds of the run), a clip fraction at ``clip`` and a KL at 1e-3, above its absolute low."""
    ret = np.linspace(-500.0, -110.0, n) + rng.normal(0, 3, n)
    if not rising:
        ret[2 * n // 3:] = -110 + rng.normal(0, 3, n - 2 * n // 3)
    return {"episode_return_mean": _c(ret, 1024), "clip_fraction": _c(np.full(n, clip), 1024),
            "kl_old_mean": _c(1e-3 * np.exp(rng.normal(0, 0.2, n)), 1024)}


def test_a_return_still_rising_while_the_clip_fraction_stays_near_zero_is_held_back():
    rng = _rng(7)
    params = {"learning_rate": 5e-5, "clip_range": 0.2, "n_epochs": 10}
    d = diagnose(_held_back_run(rng), INFOS, params=params, framework="stable-baselines3")
    low = d.by_detector("clip_low")
    assert [f.severity for f in low] == ["warning"] and low[0].evidence["held_back_from_start"] == 1.0
    assert "from the start of training" in low[0].title and "still rising" in low[0].title
    slow = d.by_detector("reward_slow")
    assert [f.severity for f in slow] == ["warning"], [f.summary() for f in d.findings]
    assert slow[0].cause == "learning_rate_low" and "learning_rate = 5e-05" in slow[0].causes[0].text
    assert "learning held back by the update size" in slow[0].title


def test_held_back_needs_a_rising_return_an_informative_clip_fraction_and_a_control_task():
    rng = _rng(8)
    params = {"learning_rate": 5e-5, "clip_range": 0.2}
    # Levelled off: a converged run clips little too; the low clip fraction alone is information.
    flat_end = diagnose(_held_back_run(rng, rising=False), INFOS, params=params, framework="stable-baselines3")
    assert not flat_end.by_detector("reward_slow")
    assert [f.severity for f in flat_end.by_detector("clip_low")] == ["info"]
    # A clip fraction of a healthy run (0.03, below the 0.05 low but not near zero): nothing held back.
    ordinary = diagnose(_held_back_run(rng, clip=0.03), INFOS, params=params, framework="stable-baselines3")
    assert not ordinary.by_detector("reward_slow")
    # A clip range 50x the default makes the clip fraction zero by construction: it says nothing.
    wide = diagnose(_held_back_run(rng), INFOS, params={"clip_range": 10.0}, framework="stable-baselines3")
    assert not wide.by_detector("reward_slow")
    assert all(f.severity == "info" for f in wide.by_detector("clip_low"))
    # The same curves beside a response length (a language-model run) are not judged this way.
    run = _held_back_run(rng)
    assert diagnose(run, INFOS, params=params, framework="stable-baselines3").by_detector("reward_slow")
    run["response_length_mean"] = _c(np.full(60, 200.0), 1024)
    assert not diagnose(run, INFOS, params=params, framework="stable-baselines3").by_detector("reward_slow")


def test_the_effective_clip_range_matches_the_setting_it_came_from():
    from registry.analysis.diagnosis.detectors.clipping import _effective_clip_range
    # Draw per-sample log-ratios as a PPO epoch would see them and clip them at a known eps:
    # the estimate from (clip fraction, k3 KL) recovers eps.
    rng = _rng(5)
    for eps, sigma in ((0.2, 0.08), (0.03, 0.02), (0.05, 0.03)):
        r = rng.normal(0, sigma, 200_000)
        ratio = np.exp(r)
        clip_fraction = np.mean(np.abs(ratio - 1) > eps)
        k3 = np.mean(ratio - 1 - r)
        est = _effective_clip_range(np.array([clip_fraction]), np.array([k3]))[0]
        assert est == pytest.approx(eps, rel=0.15), (eps, est)
    assert np.isnan(_effective_clip_range(np.array([0.0, 0.1]), np.array([1e-3, -1e-4]))).all()


def test_an_ordinary_clip_fraction_with_a_tiny_kl_is_a_narrow_clip_range():
    rng = _rng(6)
    n = 60
    clip = np.clip(0.11 + rng.normal(0, 0.01, n), 0, 1)            # inside 0.05-0.3
    tiny_kl = 2.2e-4 * np.exp(rng.normal(0, 0.1, n))
    f = diagnose({"clip_fraction": _c(clip), "kl_old_mean": _c(tiny_kl)}, INFOS).by_detector("clip_high")
    assert f and f[0].severity == "warning" and "clip range of about 0.03" in f[0].title
    assert 0.025 < f[0].evidence["effective_clip_range"] < 0.04
    # the same clip fraction with a healthy KL is an ordinary update
    healthy_kl = 0.02 * np.exp(rng.normal(0, 0.1, n))
    assert not diagnose({"clip_fraction": _c(clip), "kl_old_mean": _c(healthy_kl)}, INFOS).by_detector("clip_high")


def test_a_set_narrow_clip_range_counts_once_the_curves_show_it_binds():
    """acrobot_clip_0.06's curves: a clip fraction of 0.084 with a KL of 8e-4 estimate a range of about 0.069,
    just above a third of the usual 0.2; the run's own setting, 0.06, is what the curves confirm."""
    rng = _rng(61)
    n = 58
    curves = lambda: {"clip_fraction": _c(np.clip(0.084 + rng.normal(0, 0.005, n), 0, 1)),  # noqa: E731
                      "kl_old_mean": _c(8e-4 * np.exp(rng.normal(0, 0.05, n)))}
    assert not diagnose(curves(), INFOS).by_detector("clip_high")           # no setting: 0.069 is not narrow
    f = diagnose(curves(), INFOS, params={"clip_range": 0.06}, framework="stable-baselines3").by_detector("clip_high")
    assert f and f[0].severity == "warning" and f[0].evidence["declared_clip_range"] == 0.06
    assert 0.06 < f[0].evidence["effective_clip_range"] < 0.08
    assert "(the run sets clip_range = 0.06, 3.3x below the SB3 default 0.2)" in f[0].title
    # A set range within 3x of the default is not called narrow, whatever the estimate ...
    assert not diagnose(curves(), INFOS, params={"clip_range": 0.08}, framework="stable-baselines3"
                        ).by_detector("clip_high")
    # ... and a narrow setting the curves do not bear out (they clip as a range of 0.069 would, not 0.02) is not
    # what clips these updates.
    assert not diagnose(curves(), INFOS, params={"clip_range": 0.02}, framework="stable-baselines3"
                        ).by_detector("clip_high")


def test_entropy_cliff_versus_gentle_decline():
    rng = _rng(4)
    n = 200
    gentle = np.linspace(2.0, 0.5, n) * (1 + rng.normal(0, 0.01, n))      # 2.0 -> 0.5 over the run
    assert not diagnose({"entropy": _c(gentle)}, INFOS).by_detector("entropy_collapse")
    cliff = np.full(n, 2.0) * (1 + rng.normal(0, 0.01, n))
    cliff[100:] = 0.5 * (1 + rng.normal(0, 0.01, n - 100))                 # 2.0 -> 0.5 in one step
    f = diagnose({"entropy": _c(cliff)}, INFOS).by_detector("entropy_collapse")
    assert len(f) == 1 and 99 <= f[0].start <= 101 and f[0].end == n
    assert f[0].evidence["level_before"] == pytest.approx(2.0, rel=0.05)
    assert f[0].evidence["level_after"] == pytest.approx(0.5, rel=0.05)


def test_a_steady_narrowing_is_entropy_collapse_only_beside_a_flat_reward():
    rng = _rng(41)
    n = 60
    narrowing = np.geomspace(1.09, 0.08, n) * (1 + rng.normal(0, 0.01, n))   # no cliff anywhere
    stuck = np.full(n, -500.0)
    learning = np.concatenate([np.full(20, -500.0), np.linspace(-500, -90, 20), np.full(20, -88.0)])
    curves = lambda ret, ent: {"episode_return_mean": _c(ret, 1024), "entropy": _c(ent, 1024)}  # noqa: E731

    d = diagnose(curves(stuck, narrowing), INFOS)
    f = d.by_detector("entropy_collapse")
    assert len(f) == 1 and f[0].severity == "warning" and f[0].evidence["gradual"] == 1.0
    assert f[0].end == n * 1024 and f[0].start < f[0].detected_at < n * 1024 / 2
    assert f[0].evidence["ratio"] < 0.15       # the medians of its first and last points
    assert f"fell steadily {f[0].evidence['level_before']:.3g} -> {f[0].evidence['level_after']:.3g}" in f[0].title
    assert "reward stayed flat (-500 -> -500)" in f[0].title
    assert f[0].cause == "sparse_reward"          # the return never changed from -500
    # The flat reward keeps its own cause: a narrowing found beside it does not explain it.
    assert d.by_detector("reward_flat")[0].cause == "sparse_reward"
    joint = [j for j in d.joint_readings if j.kind == "converging_without_learning"]
    assert joint and "the entropy fell steadily from" in joint[0].interpretation

    # The same narrowing while the return rises is a policy that learned: nothing to report.
    assert not diagnose(curves(learning, narrowing), INFOS).at_least("warning")
    # A flat reward whose policy keeps exploring (entropy at 90% of its start) is flat, not collapsed.
    kept = np.linspace(1.09, 0.98, n)
    assert not diagnose(curves(stuck, kept), INFOS).by_detector("entropy_collapse")
    # A Gaussian policy's entropy crossing zero gives no ratio: nothing is said.
    gaussian = np.linspace(1.4, -0.6, n)
    found = diagnose(curves(stuck, gaussian), INFOS).by_detector("entropy_collapse")
    assert not [f for f in found if f.evidence.get("gradual")]
    # The threshold is a setting.
    loose = DiagnosisSettings(narrowing_entropy_frac=0.05)
    assert not diagnose(curves(stuck, narrowing), INFOS, settings=loose).by_detector("entropy_collapse")
    # A narrowing that ends in a cliff is the cliff detector's; beside the same flat reward it names the
    # same cause, not a large update that nothing in the run shows.
    cliff = np.concatenate([np.linspace(1.09, 0.4, 50), np.full(10, 0.15)])
    f = diagnose(curves(stuck, cliff), INFOS).by_detector("entropy_collapse")
    assert len(f) == 1 and "off a cliff" in f[0].title and f[0].cause == "sparse_reward"


def test_a_reward_that_climbs_and_slides_back_is_a_drop():
    rng = _rng(42)
    pendulum = default_metric_infos("Pendulum-v1")
    climb = np.linspace(-1250, -420, 10)
    slide = np.concatenate([climb, np.linspace(-430, -770, 8), np.full(7, -700.0)]) + rng.normal(0, 15, 25)
    f = diagnose({"episode_return_mean": _c(slide, 4096)}, pendulum).by_detector("reward_drop")
    assert len(f) == 1 and f[0].evidence["gradual"] == 1.0 and f[0].severity == "warning"
    assert f[0].evidence["fraction_lost"] > 0.3 and "slid back from its best" in f[0].title
    assert 8 * 4096 <= f[0].start <= 11 * 4096
    # A healthy run's late dip (a few percent of what it gained) is no drop.
    dip = np.concatenate([np.linspace(-1250, -230, 17), [-240, -255, -262, -270, -290, -275, -265, -261]])
    assert not diagnose({"episode_return_mean": _c(dip + rng.normal(0, 5, 25), 4096)}, pendulum).at_least("warning")
    # Without a task range the reward's own magnitude is the yardstick, and the loss must still stand at
    # the last point: the same slide is found, a dip the run climbed out of is not.
    f = diagnose({"episode_return_mean": _c(slide, 4096)}, INFOS).by_detector("reward_drop")
    assert len(f) == 1 and "no task range" in f[0].title and f[0].evidence["magnitude_fraction_lost"] > 0.05
    recovered = np.concatenate([slide[:18], np.linspace(-700, -300, 7)])
    assert not diagnose({"episode_return_mean": _c(recovered, 4096)}, INFOS).by_detector("reward_drop")
    # A noisy batch reward's lucky batches are not a level it slid back from.
    batches = -0.5 + rng.normal(0, 0.12, 30)
    batches[8:10] = [-0.19, -0.27]
    assert not diagnose({"reward_sequence_mean": _c(batches)}, INFOS).by_detector("reward_drop")
    # A slide below where the run started says so instead of a share above 100%.
    under = np.concatenate([np.linspace(-500, -400, 6), np.linspace(-420, -520, 8), np.full(11, -520.0)])
    f = diagnose({"episode_return_mean": _c(under + rng.normal(0, 2, 25), 4096)}, INFOS).by_detector("reward_drop")
    assert len(f) == 1 and "below its early level" in f[0].title and "%" not in f[0].title.split("points,")[1][:30]


def test_a_windowed_episode_mean_is_no_level_until_enough_episodes_have_finished():
    # LunarLander-like: 1024-step rollouts, ~90-step episodes, so the first point averages ~11 episodes.
    rng = _rng(3)
    ret = np.concatenate([[-85.0, -106.0], np.full(10, -160.0), np.linspace(-160, 50, 86)]) + rng.normal(0, 1, 98)
    run = {"episode_return_mean": _c(ret, 1024), "episode_length_mean": _c(np.full(98, 90.0), 1024)}
    assert not diagnose(run, INFOS).by_detector("reward_drop")
    # The same fall from a level of ~80 short episodes (CartPole-like, 26-step episodes) is a drop.
    cart = {"episode_return_mean": _c(np.concatenate([[25.7, 25.5], np.full(48, 9.5)]) + rng.normal(0, 0.1, 50), 2048),
            "episode_length_mean": _c(np.concatenate([[26.0, 26.0], np.full(48, 9.5)]), 2048)}
    assert diagnose(cart, INFOS).by_detector("reward_drop")
    # Steps that are not environment steps (one per update) leave the episodes uncounted: judged as before.
    per_update = {"episode_return_mean": _c(ret), "episode_length_mean": _c(np.full(98, 90.0))}
    assert diagnose(per_update, INFOS).by_detector("reward_drop")


def test_reward_drop_to_zero_and_constant():
    rng = _rng(5)
    n = 300
    r = np.clip(np.linspace(0.2, 0.7, n) + rng.normal(0, 0.02, n), 0, 1)
    infos = dict(INFOS, reward_sequence_mean=MetricInfo("reward_sequence_mean", "objective", 0, 1, 50, True))
    assert not diagnose({"reward_sequence_mean": _c(r)}, infos).by_detector("reward_zero")
    z = r.copy()
    z[200:] = 0.0
    f = diagnose({"reward_sequence_mean": _c(z)}, infos).by_detector("reward_zero")
    assert f and f[0].start == 201 and f[0].severity == "critical"
    k = r.copy()
    k[150:] = 0.25
    f = diagnose({"reward_sequence_mean": _c(k)}, infos).by_detector("reward_zero")
    assert f and "constant" in f[0].title and f[0].start == 151


def test_reward_constant_at_the_ceiling_is_saturation_not_breakage():
    r = np.concatenate([np.linspace(20, 500, 80), np.full(20, 500.0)])
    d = diagnose({"episode_return_mean": _c(r, 2048)}, default_metric_infos("CartPole-v1"))
    assert not d.at_least("warning")


def test_reward_std_zero_at_a_plateau_high_is_harmless_but_mid_level_is_not():
    n = 200
    rng = _rng(6)
    infos = dict(INFOS, reward_sequence_mean=MetricInfo("reward_sequence_mean", "objective", 0, 1, 50, True))
    std = np.clip(0.4 + rng.normal(0, 0.02, n), 0, None)
    std[120:] = 0.0
    top = np.clip(np.concatenate([np.linspace(0.3, 1.0, 120), np.ones(80)]), 0, 1)
    d = diagnose({"reward_std": _c(std), "reward_sequence_mean": _c(top)}, infos)
    assert [f.severity for f in d.by_detector("signal_collapse")] == ["info"]
    mid = np.clip(0.45 + rng.normal(0, 0.02, n), 0, 1)
    d = diagnose({"reward_std": _c(std), "reward_sequence_mean": _c(mid)}, infos)
    f = d.by_detector("signal_collapse")
    assert f and f[0].severity == "critical" and 115 <= f[0].start <= 125


def test_length_growing_with_flat_reward_is_hacking_but_with_rising_reward_is_not():
    rng = _rng(7)
    n = 500
    length = 300 * np.linspace(1, 2.5, n) * (1 + rng.normal(0, 0.02, n))
    flat = 0.5 + rng.normal(0, 0.02, n)
    rising = np.linspace(0.2, 0.8, n) + rng.normal(0, 0.02, n)
    infos = dict(INFOS, reward_sequence_mean=MetricInfo("reward_sequence_mean", "objective", 0, 1, 50, True))
    hack = diagnose({"response_length_mean": _c(length), "reward_sequence_mean": _c(flat)}, infos)
    assert hack.by_detector("length_hacking")
    assert [j.kind for j in hack.joint_readings] == ["reward_hacking"]
    ok = diagnose({"response_length_mean": _c(length), "reward_sequence_mean": _c(rising)}, infos)
    assert not ok.by_detector("length_hacking")


def test_value_loss_decreasing_versus_flat():
    rng = _rng(8)
    n = 100
    dec = 50 * np.exp(-np.linspace(0, 4, n)) * np.exp(rng.normal(0, 0.3, n))
    flat = 50 * np.exp(rng.normal(0, 0.3, n))
    assert not diagnose({"value_loss": _c(dec)}, INFOS).by_detector("value_loss_flat")
    f = diagnose({"value_loss": _c(flat)}, INFOS).by_detector("value_loss_flat")
    assert f and f[0].severity == "warning" and f[0].end == n


def test_a_value_loss_that_grows_less_than_the_square_of_the_return_with_a_fitting_critic_is_information():
    rng = _rng(18)
    n = 60
    # The return grows 25 -> 75, falling back and stalling on the way (not a steady rise).
    ret = np.concatenate([np.linspace(25, 65, 12), np.linspace(65, 40, 12), 40 + rng.normal(0, 6, 24),
                          np.linspace(45, 75, 12)]) + rng.normal(0, 2, n)
    loss = np.linspace(60, 95, n) * np.exp(rng.normal(0, 0.05, n))
    curves = {"episode_return_mean": _c(ret), "value_loss": _c(loss)}
    fits = diagnose({**curves, "explained_variance": _c(np.full(n, 0.5))}, INFOS).by_detector("value_loss_flat")[0]
    assert fits.severity == "info" and "while the return grew from" in fits.title and "the critic keeps up" in fits.title
    # A critic that explains nothing is a critic problem, however the return moved.
    blind = diagnose({**curves, "explained_variance": _c(np.full(n, 0.02))}, INFOS).by_detector("value_loss_flat")[0]
    assert blind.severity == "warning"
    # A loss that outgrew the square of the return's growth is no scale effect either.
    worse = diagnose({"episode_return_mean": _c(ret), "value_loss": _c(np.linspace(60, 1200, n)),
                      "explained_variance": _c(np.full(n, 0.5))}, INFOS).by_detector("value_loss_flat")[0]
    assert worse.severity == "warning"


def test_advantage_mean_drift():
    rng = _rng(9)
    n = 400
    std = np.ones(n)
    mean = rng.normal(0, 0.01, n)
    assert not diagnose({"advantage_mean": _c(mean), "advantage_std": _c(std)}, INFOS).at_least("warning")
    mean[200:] += np.linspace(0, 1.0, 200)
    f = diagnose({"advantage_mean": _c(mean), "advantage_std": _c(std)}, INFOS).by_detector("advantage_drift")
    assert f and 200 <= f[0].start <= 300


def test_grad_norm_spikes_frequent_versus_one_off():
    rng = _rng(10)
    n = 1000
    g = np.exp(rng.normal(0, 0.15, n))
    one = g.copy()
    one[500] *= 20
    assert not diagnose({"grad_norm": _c(one)}, INFOS).by_detector("grad_norm_spikes")
    many = g.copy()
    many[600::25] *= 20
    f = diagnose({"grad_norm": _c(many)}, INFOS).by_detector("grad_norm_spikes")
    assert f and f[0].start == 601 and f[0].evidence["n_spikes"] >= 10


def test_nan_and_inf_are_reported_from_their_first_step():
    v = np.linspace(1, 2, 100)
    v[70] = np.nan
    v[80:] = np.inf
    f = diagnose({"policy_loss": _c(v)}, INFOS).by_detector("nan_inf")
    assert len(f) == 1 and f[0].start == 71 and f[0].end == 100 and f[0].severity == "critical"
    assert f[0].evidence["n_nan"] == 1 and f[0].evidence["n_inf"] == 20


def test_policy_loss_growing_versus_converging():
    rng = _rng(11)
    n = 400
    conv = -0.02 * np.exp(-np.linspace(0, 3, n)) + rng.normal(0, 0.002, n)     # |loss| shrinks
    assert not diagnose({"policy_loss": _c(conv)}, INFOS).by_detector("policy_loss_growing")
    grow = rng.normal(0, 0.01, n)
    grow[150:] += np.linspace(0, 0.5, n - 150)
    f = diagnose({"policy_loss": _c(grow)}, INFOS).by_detector("policy_loss_growing")
    assert f and f[0].severity == "warning" and f[0].end == n


def test_reward_flat_uses_the_task_range():
    rng = _rng(12)
    r = -1150 + np.linspace(0, 80, 48) + rng.normal(0, 20, 48)
    pendulum = default_metric_infos("Pendulum-v1")
    assert diagnose({"episode_return_mean": _c(r, 2048)}, pendulum).by_detector("reward_flat")
    r2 = -1150 + np.linspace(0, 900, 48) + rng.normal(0, 20, 48)
    assert not diagnose({"episode_return_mean": _c(r2, 2048)}, default_metric_infos("Pendulum-v1")).at_least("warning")


def test_a_control_reward_rising_slowly_is_flat_only_when_the_policy_stays_as_random_as_it_started():
    rng = _rng(13)
    n = 48
    ret = -500 + np.linspace(0, 70, n) + rng.normal(0, 5, n)      # +14% relative, no task range
    uniform = 1.0986 - np.linspace(0, 0.01, n)                     # ln 3: the policy never sharpens
    sharpening = np.linspace(1.0986, 0.4, n)
    curves = lambda ent: {"episode_return_mean": _c(ret, 1024), "entropy": _c(ent, 1024)}  # noqa: E731
    flat = diagnose(curves(uniform), INFOS).by_detector("reward_flat")
    assert flat and flat[0].severity == "warning"
    assert "as random as it started (entropy 1.1 -> 1.09)" in flat[0].title
    assert flat[0].evidence["entropy_late"] / flat[0].evidence["entropy_early"] > 0.9
    # a policy that sharpened has learned something, however slowly its return moves
    assert not diagnose(curves(sharpening), INFOS).by_detector("reward_flat")
    # an LLM's token entropy staying level says nothing of the kind
    llm = dict(curves(uniform), response_length_mean=_c(np.full(n, 300.0), 1024))
    assert not diagnose(llm, INFOS).by_detector("reward_flat")


# ---------------------------------------------------------------------------------------
# Settings, NaN robustness, partial and long runs
# ---------------------------------------------------------------------------------------
def test_thresholds_come_from_settings_and_metric_info():
    kl = np.full(100, 0.01)
    kl[60] = 0.08
    assert diagnose({"kl_old_mean": _c(kl)}, INFOS).by_detector("kl_spike")
    strict = DiagnosisSettings(spike_ratio=20.0)
    assert not diagnose({"kl_old_mean": _c(kl)}, INFOS, settings=strict).by_detector("kl_spike")
    wide = dict(INFOS, kl_old_mean=MetricInfo("kl_old_mean", "constraint", None, 0.5, 15, None))
    assert not diagnose({"kl_old_mean": _c(kl)}, wide).by_detector("kl_spike")


def test_roles_table_names_only_dictionary_metrics():
    names = set(INFOS)
    for role, cands in METRIC_ROLES.items():
        assert cands and all(c in names for c in cands), (role, [c for c in cands if c not in names])


def test_partial_run_and_missing_metrics_do_not_crash():
    run = generate_run("healthy", seed=3, algorithm="grpo", n_steps=2000)
    cut = {k: Curve(c.steps[:30], c.values[:30]) for k, c in run.curves.items()}
    d = diagnose(cut, run.metric_infos(INFOS))
    assert not [f for f in d.at_least("warning") if f.detector != "reward_flat"]
    assert diagnose({}, {}).findings == []
    d = diagnose({"entropy": _c([np.nan, np.nan, 1.0])}, INFOS)
    assert [f.detector for f in d.findings] == ["nan_inf"]


def test_long_run_is_fast_and_vectorised():
    import time
    run = generate_run("entropy_collapse", seed=5, algorithm="grpo", n_steps=100_000, n_extra_metrics=15)
    assert len(run.curves) >= 30
    infos = run.metric_infos(INFOS)
    diagnose(run.curves, infos)
    t0 = time.perf_counter()
    d = diagnose(run.curves, infos)
    assert time.perf_counter() - t0 < 1.0
    assert d.by_detector("entropy_collapse")


# ---------------------------------------------------------------------------------------
# Output: JSON, summary, triage, rollback
# ---------------------------------------------------------------------------------------
def test_to_dict_is_json_ready_and_triage_is_ordered_with_rollback():
    run = generate_run("kl_blowup", seed=2, algorithm="ppo", n_steps=1000)
    d = _diag(run, checkpoints=run.checkpoints)
    text = json.dumps(d.to_dict(), allow_nan=False)
    back = json.loads(text)
    assert back["findings"] and back["triage"][-1]["layer"] == "rollback"
    order = {"diagnostic": 0, "constraint": 1, "objective": 2, "comparison": 3, "rollback": 4}
    ranks = [order[t["layer"]] for t in back["triage"]]
    assert ranks == sorted(ranks)
    first = min((f for f in d.at_least("warning")), key=lambda f: f.start)
    assert d.rollback_step == max(c for c in run.checkpoints if c < first.start)
    assert f"roll back to checkpoint at step {d.rollback_step}" in back["triage"][-1]["text"]
    for f in d.at_least("warning"):
        assert f.summary().startswith(f"[{f.severity.upper()}] {f.detector} {f.metric}")
        assert f.likely_causes and f.check_next and f.suggested_action
        if f.rollback_step is not None:
            assert f.rollback_step < f.start and f"step {f.rollback_step}" in f.suggested_action


# ---------------------------------------------------------------------------------------
# Real stable-baselines3 runs
# ---------------------------------------------------------------------------------------
def _real(name, task="CartPole-v1"):
    return diagnose(load_sb3_run(SB3 / name), default_metric_infos(task), checkpoints=[20480, 51200])


@needs_sb3
def test_real_healthy_cartpole_has_no_warning():
    d = _real("cartpole_healthy_s0")
    assert d.healthy, [f.summary() for f in d.at_least("warning")]
    # its reward std does reach exactly 0 at the 500 cap: reported only as harmless saturation
    sat = d.by_detector("signal_collapse")
    assert sat and sat[0].severity == "info" and "saturated" in sat[0].title


@needs_sb3
def test_real_lr_too_high_kl_spike_clip_high_entropy_collapse_reward_drop():
    d = _real("cartpole_lr_too_high_5e-2")
    kl = d.by_detector("kl_spike")
    assert kl and kl[0].start == 4096 and kl[0].severity == "critical"
    assert kl[0].evidence["peak"] == pytest.approx(5.98, rel=0.01)
    clip = d.by_detector("clip_high")
    assert clip and clip[0].start == 4096 and clip[0].at_least("warning")
    ent = d.by_detector("entropy_collapse")
    assert ent and ent[0].severity == "critical" and 4096 <= ent[0].start <= 6144
    drop = d.by_detector("reward_drop")
    assert drop and drop[0].start <= 6144 and drop[0].evidence["level_after"] < 10
    kinds = {j.kind for j in d.joint_readings}
    assert "trust_region" in kinds
    tr = next(j for j in d.joint_readings if j.kind == "trust_region")
    assert {kl[0].id, clip[0].id} <= set(tr.finding_ids)


@needs_sb3
def test_real_tiny_lr_is_too_conservative():
    d = _real("cartpole_tiny_lr_1e-6")
    low = d.by_detector("clip_low")
    assert low and low[0].severity == "warning" and low[0].start == 4096 and low[0].end == 100352
    assert low[0].evidence["kl_median"] < 1e-5
    assert not d.by_detector("kl_spike") and not d.by_detector("entropy_collapse")


@needs_sb3
def test_real_pendulum_is_stagnant():
    d = _real("pendulum_default_s0", "Pendulum-v1")
    flat = d.by_detector("reward_flat")
    assert flat and flat[0].severity == "warning" and flat[0].layer == "objective"
    assert [f.detector for f in d.at_least("warning")] == ["reward_flat"]
    assert any(j.kind == "converging_without_learning" for j in d.joint_readings)


def test_a_dip_the_return_climbed_out_of_does_not_hide_a_later_slide_that_stays():
    """CartPole: a dip 300 -> 200 that the run climbs out of, to 450, then a slide to 310 that lasts to the end
    (a third of its gain): the dip is information, the slide a warning."""
    rng = _rng(11)
    y = np.concatenate([np.linspace(20, 300, 30), np.linspace(300, 200, 15), np.linspace(200, 450, 35),
                        np.linspace(450, 310, 20), np.full(20, 310.0)]) + rng.normal(0, 2, 120)
    d = diagnose({"episode_return_mean": _c(y)}, default_metric_infos("CartPole-v1"))
    drops = d.by_detector("reward_drop")
    assert any(f.severity == "info" and f.evidence.get("recovered") for f in drops), [f.summary() for f in drops]
    late = [f for f in drops if f.at_least("warning")]
    assert late and late[0].start >= 70, [f.summary() for f in drops]
    # Without the slide the run ends at its best: the dip alone is information.
    healthy = np.concatenate([y[:80], np.linspace(450, 480, 40) + rng.normal(0, 2, 40)])
    assert diagnose({"episode_return_mean": _c(healthy)}, default_metric_infos("CartPole-v1")).healthy
