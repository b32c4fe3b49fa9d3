"""The synthetic run generator: determinism, shapes, labels, outcomes."""
from __future__ import annotations

import numpy as np
import pytest

from registry.demo.synthetic import (ANOMALY_KINDS, KIND_ALGORITHMS, KINDS, TASKS, generate_run, generate_suite,
                                run_outcome)


def test_same_seed_same_run_different_seed_different_run():
    a = generate_run("entropy_collapse", seed=3, algorithm="grpo", n_steps=500)
    b = generate_run("entropy_collapse", seed=3, algorithm="grpo", n_steps=500)
    c = generate_run("entropy_collapse", seed=4, algorithm="grpo", n_steps=500)
    assert a.curves.keys() == b.curves.keys()
    for k in a.curves:
        np.testing.assert_array_equal(a.curves[k].values, b.curves[k].values)
    assert a.labels == b.labels
    assert not np.array_equal(a.curves["entropy"].values, c.curves["entropy"].values)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_generates_with_a_label_at_a_real_step(kind):
    for alg in KIND_ALGORITHMS[kind]:
        run = generate_run(kind, seed=1, algorithm=alg, n_steps=300)
        steps = run.curves[run.reward_metric].steps
        assert all(np.array_equal(c.steps, steps) for c in run.curves.values())
        assert np.all(np.diff(steps) > 0)
        if kind == "healthy":
            assert run.labels == []
        else:
            (label,) = run.labels
            assert label.kind == kind and label.start in set(steps.tolist()) and label.metrics
        finite = all(np.isfinite(c.values).all() for c in run.curves.values())
        assert finite == (kind != "nan")
        assert run.outcome.verdict in ("success", "failed", "diverged", "inconclusive")


def test_lengths_and_step_scales_vary():
    runs = [generate_run("healthy", seed=s) for s in range(30)]
    lengths = [r.n_steps for r in runs]
    strides = {r.params["step_stride"] for r in runs}
    assert 200 <= min(lengths) and max(lengths) <= 20000 and max(lengths) > 5 * min(lengths)
    assert len(strides) >= 3
    assert {r.algorithm for r in runs} == {"grpo", "ppo"}


def test_healthy_runs_look_like_training():
    for s in range(5):
        run = generate_run("healthy", seed=s, algorithm="grpo", n_steps=2000)
        r = run.curves["reward_sequence_mean"].values
        assert np.median(r[-100:]) > np.median(r[:100]) + 0.2
        e = run.curves["entropy"].values
        assert np.median(e[-100:]) < np.median(e[:100])
        assert run.curves["kl_ref_mean"].values.max() < 0.1
        assert run.outcome.verdict in ("success", "inconclusive")


def test_outcome_is_read_off_the_curves():
    div = [generate_run("nan", seed=s, algorithm="ppo", n_steps=400) for s in range(6)]
    assert any(r.outcome.verdict == "diverged" for r in div)
    for r in div:   # diverged exactly when some curve is still non-finite in its last 10%
        tail_bad = any(not np.isfinite(c.values[int(0.9 * len(c)):]).all() for c in r.curves.values())
        assert (r.outcome.verdict == "diverged") == tail_bad
    for s in range(4):
        o = generate_run("stagnant", seed=s, algorithm="grpo", n_steps=400).outcome
        assert o.verdict in ("failed", "inconclusive") and o.normalized_score < 0.5
    blow = [generate_run("kl_blowup", seed=s, algorithm="ppo", n_steps=600).outcome for s in range(4)]
    assert all(o.verdict in ("diverged", "failed") for o in blow)
    zero = generate_run("reward_zero", seed=0, algorithm="grpo", n_steps=400)
    assert zero.outcome.verdict == "failed" and zero.outcome.final_score < 0.3
    cap = generate_run("healthy", seed=2, algorithm="ppo", task="synthetic-cartpole", n_steps=400)
    o = run_outcome(cap.curves, "episode_return_mean", TASKS["synthetic-cartpole"][2])
    assert o == cap.outcome and o.verdict == "success" and o.final_score == pytest.approx(500, rel=0.05)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        generate_run("value_loss_flat", algorithm="grpo")
    with pytest.raises(ValueError):
        generate_run("length_hacking", algorithm="ppo")
    with pytest.raises(ValueError):
        generate_run("no_such_kind")
    with pytest.raises(ValueError):
        generate_run("healthy", algorithm="ppo", task="synthetic-math")


def test_suite_and_extra_metrics():
    suite = generate_suite(per_kind=1, seed=0, n_healthy=2)
    assert len(suite) == len(ANOMALY_KINDS) + 2
    big = generate_run("healthy", seed=0, algorithm="grpo", n_steps=1000, n_extra_metrics=15)
    assert len(big.curves) >= 30
    infos = big.metric_infos()
    assert infos["reward_sequence_mean"].healthy_high == 1.0
