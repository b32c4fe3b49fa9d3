"""Health baselines: build, JSON round trip, check a run against one; joint readings grouping."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from registry.analysis.diagnosis import BaselineProfile, Curve, MetricInfo, build_baseline, diagnose
from registry.analysis.diagnosis.fixtures import default_metric_infos, load_sb3_run
from registry.demo.synthetic import generate_run

SB3 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sb3_ppo"
needs_sb3 = pytest.mark.skipif(not SB3.is_dir(), reason="shared/data/sb3_ppo not present")
INFOS = default_metric_infos()


def _runs(kind, seeds, **kw):
    return [generate_run(kind, seed=s, algorithm="grpo", n_steps=800, task="synthetic-math", step_stride=1, **kw)
            for s in seeds]


def test_build_baseline_phases_bands_and_json_round_trip():
    healthy = _runs("healthy", range(6))
    prof = build_baseline("synthetic-math", [r.curves for r in healthy])
    assert prof.n_runs == 6
    assert prof.early_end_step == 120          # min(150, 15% of 800) points, stride 1
    assert (prof.mid_start_step, prof.mid_end_step) == (281, 520)
    kl = prof.metrics["kl_ref_mean"]
    assert kl.early.low <= kl.early.median <= kl.early.high
    assert kl.mid.median > kl.early.median     # KL to the reference grows during training
    assert "healthy synthetic-math" in kl.warning
    text = json.dumps(prof.to_dict(), allow_nan=False)
    back = BaselineProfile.from_dict(json.loads(text))
    assert back.to_dict() == prof.to_dict()


def test_baseline_rule_for_short_runs_is_fifteen_percent():
    c = {"entropy": Curve(np.arange(1, 49) * 2048, np.linspace(0.7, 0.3, 48))}
    prof = build_baseline("CartPole-v1", [c])
    assert prof.early_end_step == 8 * 2048     # ceil(0.15 * 48) = 8 points
    with pytest.raises(ValueError):
        build_baseline("x", [])


def test_healthy_run_passes_its_baseline_and_an_anomalous_one_deviates():
    healthy = _runs("healthy", range(6))
    prof = build_baseline("synthetic-math", [r.curves for r in healthy])
    fresh = _runs("healthy", [40])[0]
    d = diagnose(fresh.curves, fresh.metric_infos(INFOS), baseline=prof)
    assert d.baseline_task == "synthetic-math"
    assert not [f for f in d.at_least("warning") if f.detector == "baseline_deviation"]
    bad = _runs("clip_high", [41], anomaly_at=0.3)[0]
    # still training (60% of the way): no late phase yet, so nothing says it will end level
    training = {k: Curve(c.steps[c.steps <= 480], c.values[c.steps <= 480]) for k, c in bad.curves.items()}
    d = diagnose(training, bad.metric_infos(INFOS), baseline=prof)
    dev = [f for f in d.at_least("warning") if f.detector == "baseline_deviation" and f.metric == "clip_fraction"]
    assert dev and dev[0].layer == "comparison" and dev[0].evidence["median"] > dev[0].evidence["band_high"]
    # comparison comes after the diagnostic, constraint and objective layers in triage
    layers = [t.layer for t in d.triage]
    assert layers.index("comparison") > max(i for i, l in enumerate(layers) if l in ("diagnostic", "constraint"))


def _control_run(seed, delay=0, ceiling=500.0, kl=0.005):
    """A CartPole-like run: return rising to ``ceiling`` after ``delay`` steps, its KL to the old policy."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 60) * 1024
    t = np.clip(steps - delay, 0, None)
    ret = 20 + (ceiling - 20) * (1 - np.exp(-t / 12000)) + rng.normal(0, 4, steps.size)
    return {"episode_return_mean": Curve(steps, ret),
            "kl_old_mean": Curve(steps, kl * np.exp(rng.normal(0, 0.1, steps.size)))}


def test_a_late_band_is_learned_and_read_back():
    prof = build_baseline("CartPole-v1", [_control_run(s) for s in range(4)])
    late = prof.metrics["episode_return_mean"].late
    assert prof.late_start_step == 51 * 1024 and late.low > 450   # point floor(0.85 * 59) = 50, 0-based
    back = BaselineProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back.late_start_step == prof.late_start_step and back.metrics["episode_return_mean"].late == late
    # a profile stored before the late phase existed reads back without one, and is used without one
    old = prof.to_dict()
    del old["late_start_step"]
    for m in old["metrics"].values():
        del m["late"]
    assert BaselineProfile.from_dict(old).phase_bounds("late") is None


def test_a_slow_start_that_caught_up_is_information_and_one_that_did_not_is_a_warning():
    prof = build_baseline("CartPole-v1", [_control_run(s) for s in range(4)])
    infos = default_metric_infos("CartPole-v1")

    def deviations(run):
        return {(f.evidence and f.title.split()[0], f.metric): f for f in diagnose(run, infos, baseline=prof).findings
                if f.detector == "baseline_deviation"}

    caught_up = deviations(_control_run(10, delay=15000))
    mid = caught_up[("mid", "episode_return_mean")]
    assert mid.severity == "info" and "ended level with the healthy runs" in mid.notes[-1]
    stalled = deviations(_control_run(11, delay=15000, ceiling=250))
    assert stalled[("mid", "episode_return_mean")].severity == "warning"
    assert stalled[("late", "episode_return_mean")].severity == "warning"
    # a reward that ended above the healthy runs is not "level": a KL far off stays a warning
    hacked = deviations(_control_run(12, ceiling=900, kl=0.05))
    assert hacked[("mid", "kl_old_mean")].severity == "warning"
    assert hacked[("late", "kl_old_mean")].severity == "warning"
    # a run that ended level is judged in the late phase by its objective: other late deviations inform
    level_kl = deviations(_control_run(13, kl=0.05))[("late", "kl_old_mean")]
    assert level_kl.severity == "info" and "only its objective is judged" in level_kl.notes[0]


def test_a_reward_ending_below_many_healthy_runs_by_less_than_a_band_width_ended_below_them():
    infos = default_metric_infos("CartPole-v1")
    many = build_baseline("CartPole-v1", [_control_run(s, ceiling=c) for s, c in enumerate(np.linspace(430, 490, 10))])
    few = build_baseline("CartPole-v1", [_control_run(s, ceiling=c) for s, c in enumerate((430, 450, 470, 490))])
    slow = _control_run(20, ceiling=388)          # about 0.7 band widths below the healthy runs' late band

    def late_reward(prof):
        (f,) = [f for f in diagnose(slow, infos, baseline=prof).findings
                if f.detector == "baseline_deviation" and f.metric == "episode_return_mean" and f.title.startswith("late")]
        return f

    assert 0.5 < late_reward(many).evidence["band_widths"] < 1.0
    assert late_reward(many).severity == "warning"
    # Four runs estimate the band roughly: there a run must end a whole band width below them.
    assert late_reward(few).severity == "info" and late_reward(few).evidence["band_widths"] < 1.0


def test_without_a_baseline_the_summary_says_the_rewards_pace_was_not_judged():
    infos = default_metric_infos("CartPole-v1")
    slow = _control_run(21, ceiling=300)
    alone = diagnose(slow, infos)
    pace = [n for n in alone.not_judged if n["role"] == "reward_pace"]
    assert pace and pace[0]["metric"] == "episode_return_mean"
    assert "could not judge: whether episode_return_mean rose as fast as healthy runs" in alone.summary()
    assert alone.enough_data                      # the rest of the run was judged as usual
    weak = build_baseline("CartPole-v1", [_control_run(s) for s in range(2)])
    assert any(n["role"] == "reward_pace" for n in diagnose(slow, infos, baseline=weak).not_judged)
    full = build_baseline("CartPole-v1", [_control_run(s) for s in range(3)])
    assert not any(n["role"] == "reward_pace" for n in diagnose(slow, infos, baseline=full).not_judged)


def test_a_deviation_names_a_differing_setting_by_the_cause_rules_own_key():
    infos = default_metric_infos("CartPole-v1")
    prof = build_baseline("CartPole-v1", [_control_run(s) for s in range(3)],
                          hyperparams={"vf_coef": [0.5, 0.5, 0.5], "learning_rate": [3e-4] * 3})
    stalled = _control_run(30, ceiling=150)
    for params, key in (({"vf_coef": 0.02, "learning_rate": 3e-4}, "vf_coef_small"),
                        ({"vf_coef": 0.5, "learning_rate": 3e-5}, "learning_rate_low")):
        d = diagnose(stalled, infos, baseline=prof, params=params, framework="stable-baselines3")
        late = [f for f in d.findings if f.detector == "baseline_deviation" and f.metric == "episode_return_mean"
                and f.title.startswith("late")]
        assert late and late[0].causes[0].key == key, [c.key for c in late[0].causes]


def test_a_return_that_never_changed_is_named_a_sparse_reward_beside_the_healthy_runs():
    """acrobot_default_s11 and s26: default settings, a return of exactly -500 at every update while the
    healthy seeds reach -85. No setting differs; the return itself says no episode reached the goal."""
    infos = default_metric_infos("Acrobot-v1")
    steps = np.arange(1, 59) * 1024
    rng = np.random.default_rng(3)

    def healthy(seed: int) -> dict:
        r = np.random.default_rng(seed)
        ret = np.concatenate([np.full(10, -500.0), np.linspace(-500, -90, 25), np.full(23, -88.0)])
        return {"episode_return_mean": Curve(steps, ret + r.normal(0, 2, 58)),
                "entropy": Curve(steps, np.geomspace(1.09, 0.15, 58) * (1 + r.normal(0, 0.01, 58)))}

    prof = build_baseline("Acrobot-v1", [healthy(s) for s in range(4)], infos=infos,
                          hyperparams={"learning_rate": [3e-4] * 4})
    stuck = {"episode_return_mean": Curve(steps, np.full(58, -500.0)),
             "entropy": Curve(steps, np.geomspace(1.09, 0.25, 58) * (1 + rng.normal(0, 0.01, 58)))}
    d = diagnose(stuck, infos, baseline=prof, params={"learning_rate": 3e-4}, framework="stable-baselines3")
    dev = [f for f in d.findings if f.detector == "baseline_deviation" and f.at_least("warning")]
    assert dev and all(f.causes[0].key == "sparse_reward" for f in dev)
    assert all(f.suggested_action.startswith("explore more") for f in dev)
    # A run that moved is not called one that never found another outcome.
    moved = healthy(9)
    moved["episode_return_mean"] = Curve(steps, np.linspace(-500, -200, 58) + rng.normal(0, 2, 58))
    d = diagnose(moved, infos, baseline=prof, params={"learning_rate": 3e-4}, framework="stable-baselines3")
    assert all(c.key != "sparse_reward" for f in d.by_detector("baseline_deviation") for c in f.causes)


def test_edited_warning_text_is_used():
    healthy = _runs("healthy", range(4))
    data = build_baseline("synthetic-math", [r.curves for r in healthy]).to_dict()
    data["metrics"]["clip_fraction"]["warning"] = "clip fraction off: ask the on-call"
    prof = BaselineProfile.from_dict(data)
    bad = _runs("clip_high", [42], anomaly_at=0.3)[0]
    d = diagnose(bad.curves, bad.metric_infos(INFOS), baseline=prof)
    dev = [f for f in d.findings if f.detector == "baseline_deviation" and f.metric == "clip_fraction"]
    assert dev and dev[0].likely_causes == ["clip fraction off: ask the on-call"]


def test_higher_reward_than_history_is_not_a_warning():
    c = {"reward_sequence_mean": Curve(np.arange(100), np.linspace(0.1, 0.3, 100))}
    prof = build_baseline("t", [c])
    better = {"reward_sequence_mean": Curve(np.arange(100), np.linspace(0.6, 0.9, 100))}
    infos = dict(INFOS, reward_sequence_mean=MetricInfo("reward_sequence_mean", "objective", 0, 1, 50, True))
    d = diagnose(better, infos, baseline=prof)
    dev = [f for f in d.findings if f.detector == "baseline_deviation"]
    assert dev and all(f.severity == "info" for f in dev)


@needs_sb3
def test_real_cartpole_baseline():
    healthy = load_sb3_run(SB3 / "cartpole_healthy_s0")
    prof = build_baseline("CartPole-v1", [healthy])
    infos = default_metric_infos("CartPole-v1")
    assert diagnose(healthy, infos, baseline=prof).healthy
    bad = diagnose(load_sb3_run(SB3 / "cartpole_lr_too_high_5e-2"), infos, baseline=prof)
    devs = {(f.metric, f.severity) for f in bad.findings if f.detector == "baseline_deviation"}
    # One healthy run is a weak baseline: its deviations are information, and say so.
    assert ("entropy", "info") in devs and not any(sev != "info" for _, sev in devs)
    assert bad.baseline_note == "weak baseline (n=1)"
    assert all("weak baseline (n=1)" in f.title for f in bad.findings if f.detector == "baseline_deviation")
    assert any(m == "episode_return_mean" for m, _ in devs)


# ---------------------------------------------------------------------------------------
# Joint readings
# ---------------------------------------------------------------------------------------
def test_joint_reading_reward_up_with_kl_up():
    n = 300
    rng = np.random.default_rng(0)
    steps = np.arange(1, n + 1)
    kl = 0.01 * np.exp(rng.normal(0, 0.1, n))
    kl[150:] *= np.exp(np.linspace(0, np.log(30), n - 150))
    reward = np.clip(np.linspace(0.2, 0.8, n) + rng.normal(0, 0.01, n), 0, 1)
    infos = dict(INFOS, reward_sequence_mean=MetricInfo("reward_sequence_mean", "objective", 0, 1, 50, True))
    d = diagnose({"kl_old_mean": Curve(steps, kl), "reward_sequence_mean": Curve(steps, reward)}, infos)
    tr = [j for j in d.joint_readings if j.kind == "trust_region"]
    assert tr and "reward up" in tr[0].title and "learning rate" in tr[0].suggested_action
    assert set(tr[0].finding_ids) == {f.id for f in d.findings if f.detector == "kl_climb"}


def test_joint_readings_do_not_group_findings_far_apart_in_time():
    n = 1000
    rng = np.random.default_rng(1)
    steps = np.arange(1, n + 1)
    kl = 0.01 * np.exp(rng.normal(0, 0.1, n))
    kl[100] = 0.2                                   # KL spike early ...
    clip = np.clip(0.1 + rng.normal(0, 0.01, n), 0, 1)
    clip[800:900] = 0.45                            # ... clip fraction high much later
    reward = np.clip(0.5 + rng.normal(0, 0.01, n), 0, 1)
    d = diagnose({"kl_old_mean": Curve(steps, kl), "clip_fraction": Curve(steps, clip),
                  "reward_sequence_mean": Curve(steps, reward)}, INFOS)
    assert d.by_detector("kl_spike") and d.by_detector("clip_high")
    assert not [j for j in d.joint_readings if j.kind == "trust_region"]


def test_joint_reading_reward_hacking_and_converging_without_learning():
    run = generate_run("length_hacking", seed=4, algorithm="grpo", n_steps=1500)
    d = diagnose(run.curves, run.metric_infos(INFOS))
    hack = [j for j in d.joint_readings if j.kind == "reward_hacking"]
    assert hack and "reward decomposition" in hack[0].suggested_action
    assert any(k.endswith("_change") for k in hack[0].evidence)
    run = generate_run("entropy_collapse", seed=5, algorithm="grpo", n_steps=1500, anomaly_at=0.25)
    d = diagnose(run.curves, run.metric_infos(INFOS))
    conv = [j for j in d.joint_readings if j.kind == "converging_without_learning"]
    assert conv and "advantage std" in conv[0].suggested_action
    ec = d.by_detector("entropy_collapse")[0]
    assert ec.id in conv[0].finding_ids


def test_baseline_supplies_a_range_where_the_definition_has_none():
    rng = np.random.default_rng(3)
    n = 400
    steps = np.arange(1, n + 1)
    healthy = [{"kl_ref_mean": Curve(steps, 0.002 * np.exp(rng.normal(0, 0.1, n)))} for _ in range(3)]
    prof = build_baseline("t", healthy)
    kl = 0.002 * np.exp(rng.normal(0, 0.1, n))
    kl[200:] *= np.exp(np.linspace(0, np.log(20), n - 200))       # -> 0.04, below the 0.1 fallback
    run = {"kl_ref_mean": Curve(steps, kl)}
    assert not diagnose(run, INFOS).by_detector("kl_climb")
    climb = diagnose(run, INFOS, baseline=prof).by_detector("kl_climb")
    assert climb and climb[0].start >= 180


def test_a_reward_judged_against_a_baseline_says_so_instead_of_task_range():
    """A task with no task range (LunarLander): the baseline's band, widened below only, is what
    reward_flat measured the improvement against, and its title names that band, not 'the task range'."""
    steps = np.arange(1, 99) * 1024
    infos = default_metric_infos("LunarLander-v3")

    def run(end, seed):
        rng = np.random.default_rng(seed)
        return {"episode_return_mean": Curve(steps, np.linspace(-170, end, steps.size) + rng.normal(0, 2, steps.size))}

    prof = build_baseline("LunarLander-v3", [run(e, s) for s, e in enumerate((-20, 10, 60, 100))], infos=infos)
    flat = diagnose(run(-150, 9), infos, baseline=prof).by_detector("reward_flat")
    assert flat and "of the range learned from the LunarLander-v3 baseline (4 healthy runs)" in flat[0].title
    assert "task range" not in flat[0].title
    # The range's top is the best healthy band's high. A run that rose by 90 (the healthy runs by 150-270)
    # is slower, which the late band judges; on a range padded above the best it was "barely improving".
    from registry.analysis.diagnosis.ranges import resolve_range
    from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS
    r = resolve_range("episode_return_mean", infos["episode_return_mean"], prof, DEFAULT_SETTINGS)
    top = max(b.high for b in (prof.metrics["episode_return_mean"].band(p) for p in ("early", "mid", "late")) if b)
    assert r["high"] == top and r["low"] < -170
    assert not diagnose(run(-80, 10), infos, baseline=prof).by_detector("reward_flat")
