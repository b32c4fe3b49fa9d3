"""Shared fixture data for the web tests, plus unit tests of smoothing and downsampling.

``fill_registry`` registers a small, realistic set of runs through ``register_arrays``:
two SB3 PPO seeds of one configuration (``train/approx_kl`` is k3), a CleanRL PPO run
(``losses/old_approx_kl`` is k1: the same canonical metric, a different estimator), and two
verl GRPO runs with different learning rates, one with NaN points.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from registry.web import smoothing
from registry.core.downsample import downsample_indices


def check_response(openapi, response, path: str, method: str = "GET", query_string=None) -> None:
    """Raise when ``response`` (to ``method path?query``) does not match the OpenAPI document."""
    builder = EnvironBuilder(path=path, method=method, query_string=query_string, base_url="http://localhost/")
    openapi.validate_response(WerkzeugOpenAPIRequest(Request(builder.get_environ())), WerkzeugOpenAPIResponse(response))


def _curve(n: int, start: float, end: float, noise: float, seed: int, shape: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, n)
    return start + (end - start) * (1 - np.exp(-shape * t)) / (1 - math.exp(-shape)) + rng.normal(0, noise, n)


def fill_registry(reg, n: int = 60) -> dict[str, str]:
    """Register the fixture runs; returns ``{short name: run id}``."""
    steps = np.arange(1, n + 1) * 2048
    ids = {}
    for seed in (0, 1):
        res = reg.register_arrays(
            f"sb3-cartpole-s{seed}",
            {
                "rollout/ep_rew_mean": (steps, _curve(n, 22, 480, 12, seed)),
                "rollout/ep_len_mean": (steps, _curve(n, 22, 480, 12, seed + 10)),
                "train/approx_kl": (steps, np.abs(_curve(n, 0.02, 0.006, 0.002, seed + 20))),
                "train/clip_fraction": (steps, np.abs(_curve(n, 0.12, 0.05, 0.01, seed + 30))),
                "train/entropy_loss": (steps, -_curve(n, 0.69, 0.3, 0.01, seed + 40)),
                "train/value_loss": (steps, np.abs(_curve(n, 50, 5, 3, seed + 50))),
                "train/policy_gradient_loss": (steps, _curve(n, -0.01, -0.005, 0.002, seed + 60)),
                "train/explained_variance": (steps, _curve(n, 0.1, 0.9, 0.05, seed + 70)),
                "train/learning_rate": (steps, np.full(n, 3e-4)),
                "time/fps": (steps, _curve(n, 900, 1000, 20, seed + 80)),
                "custom/my_probe": (steps, _curve(n, 1, 2, 0.1, seed + 90)),
            },
            framework="stable-baselines3", algorithm="PPO", project="cartpole", task="CartPole-v1",
            params={"learning_rate": 3e-4, "n_steps": 2048, "batch_size": 64, "gamma": 0.99, "seed": seed},
            tags=["baseline", f"seed{seed}"],
            outcome={"verdict": "success", "scores": {"final_return": 480.0 + seed},
                     "notes": "healthy baseline <b>not bold</b>", "checkpoints": [(n * 2048, f"s3://ckpt/sb3-{seed}")]},
        )
        ids[f"sb3-s{seed}"] = res.run_id
    res = reg.register_arrays(
        "cleanrl-cartpole",
        {
            "charts/avg_episodic_return": (steps, _curve(n, 20, 300, 15, 5)),
            "losses/old_approx_kl": (steps, np.abs(_curve(n, 0.03, 0.01, 0.003, 6))),
            "losses/entropy": (steps, _curve(n, 0.69, 0.4, 0.01, 7)),
            "losses/clipfrac": (steps, np.abs(_curve(n, 0.2, 0.1, 0.02, 8))),
        },
        framework="cleanrl", algorithm="PPO", project="cartpole", task="CartPole-v1",
        params={"learning_rate": 2.5e-4, "n_steps": 128, "batch_size": 512, "gamma": 0.99, "seed": 1},
        tags=["cleanrl"], outcome={"verdict": "inconclusive"},
    )
    ids["cleanrl"] = res.run_id
    for name, lr, kl_end in (("grpo-lr1e-6", 1e-6, 0.002), ("grpo-lr5e-5", 5e-5, 0.4)):
        score = _curve(n, 0.1, 0.7 if lr < 1e-5 else 0.3, 0.03, 11)
        kl = np.abs(_curve(n, 0.0005, kl_end, 0.0002, 12, shape=-2))
        if lr > 1e-5:
            kl[n // 2] = math.nan
        res = reg.register_arrays(
            name,
            {
                "critic/score/mean": (steps // 2048, score),
                "actor/kl_loss": (steps // 2048, kl),
                "actor/pg_clipfrac": (steps // 2048, np.abs(_curve(n, 0.001, 0.01, 0.001, 13))),
                "actor/entropy": (steps // 2048, _curve(n, 1.2, 0.6, 0.02, 14)),
                "actor/grad_norm": (steps // 2048, np.abs(_curve(n, 0.5, 0.3, 0.1, 15))),
                "response_length/mean": (steps // 2048, _curve(n, 300, 500, 20, 16)),
            },
            framework="verl", algorithm="GRPO", project="math", task="gsm8k",
            params={"learning_rate": lr, "kl_loss_coef": 0.001, "rollout": {"n": 8}, "seed": 0},
            tags=["grpo"], outcome={"verdict": "success" if lr < 1e-5 else "diverged"},
        )
        ids[name] = res.run_id
    return ids


# --- smoothing ---------------------------------------------------------------------


def _ema_reference(values, weight):
    last, out = 0.0, []
    for i, v in enumerate(values, 1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight ** i))
    return np.array(out)


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.6, 0.818, 0.95, 0.999])
def test_ema_matches_tensorboard_debiased_loop(weight):
    x = np.random.default_rng(0).normal(size=3000).cumsum()
    assert np.allclose(smoothing.ema_debiased(x, weight), _ema_reference(x, weight), rtol=1e-9, atol=1e-9)


def test_ema_starts_at_the_first_value_not_zero():
    out = smoothing.smooth(np.array([10.0, 10.0, 10.0]), "ema", 50)
    assert np.allclose(out, 10.0)


@pytest.mark.parametrize("n", [1, 2, 5, 17, 200])
@pytest.mark.parametrize("window", [1, 2, 3, 4, 9, 500])
def test_moving_averages_against_a_loop(n, window):
    x = np.random.default_rng(n).normal(size=n)
    before, after = (window - 1) // 2, window // 2
    centred = [x[max(0, i - before):min(n, i + after + 1)].mean() for i in range(n)]
    trailing = [x[max(0, i - window + 1):i + 1].mean() for i in range(n)]
    assert np.allclose(smoothing.centred_mean(x, window), centred)
    assert np.allclose(smoothing.trailing_mean(x, window), trailing)


def test_unknown_smoothing_is_refused():
    with pytest.raises(ValueError, match="smoothing must be one of"):
        smoothing.smooth(np.ones(3), "gaussian", 3)


def test_downsampling_keeps_a_single_spike_in_a_million_points():
    x = np.arange(1_000_000, dtype=np.int64)
    y = np.sin(x / 5000.0)
    y[654_321] = 40.0
    idx = downsample_indices(x, y, 2000)
    assert idx is not None and len(idx) == 2000
    assert 654_321 in set(idx.tolist())
    assert downsample_indices(x[:100], y[:100], 2000) is None


def test_rendering_is_safe_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    from registry.web.plotting import PlotSpec, Trace, render

    def draw(i: int) -> bytes:
        x = np.arange(500)
        y = np.sin(x / (10 + i))
        spec = PlotSpec([Trace(f"run {i}", "#1f5fa8", x, y, x, y)], healthy=(-0.5, 0.5), ylim=(-1, 1),
                        notes=[f"plot {i}"], warnings=["not comparable: KL estimator: k3 vs k1"] if i % 2 else [],
                        legend=True)
        return render(spec, "svg" if i % 3 == 0 else "png")

    with ThreadPoolExecutor(max_workers=8) as pool:
        images = list(pool.map(draw, range(32)))
    assert all(img.startswith(b"\x89PNG") or b"<svg" in img[:400] for img in images)
    assert images[1] == draw(1)  # deterministic bytes: the same content gives the same image (and ETag)


def test_user_text_on_plots_is_drawn_literally():
    from registry.web.plotting import PlotSpec, Trace, plain, render

    assert plain("cost $5$ run") == r"cost \$5\$ run"
    x = np.arange(10)
    spec = PlotSpec([Trace("lr=$1e-3$ {x}_^", "#1f5fa8", x, x * 1.0, x, x * 1.0)],
                    warnings=["not comparable: $\\frac{a}{$"], notes=["$unbalanced"], legend=True, title="$$")
    assert render(spec).startswith(b"\x89PNG")
    assert b"<svg" in render(spec, "svg")[:400]
