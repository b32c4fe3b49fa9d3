"""The demo registry: realistic PPO and GRPO projects, healthy seeds and every classic failure.

Curves come from the seeded generator in ``registry.synthetic`` (canonical metrics), and are
registered under the raw keys a real framework would log — stable-baselines3 for the PPO
project, verl for the GRPO project — so the demo exercises alias binding exactly as a real
import does. The real SB3 TensorBoard runs from ``../shared/data`` are added when present.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .errors import AlreadyRegisteredError
from .series import SeriesData
from .store import Registry

# Logged points per run: long enough for realistic curves, short enough to build in seconds.
DEMO_POINTS = {"grpo": 1500, "ppo": 600}
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sb3_ppo"

# (project, algorithm, framework, synthetic task, kinds with seeds)
PROJECTS: tuple[tuple[str, str, str, str, tuple[tuple[str, int], ...]], ...] = (
    ("math-grpo", "grpo", "verl", "synthetic-math", (
        ("healthy", 0), ("healthy", 1), ("healthy", 2),
        ("kl_blowup", 0), ("entropy_collapse", 0), ("reward_std_zero", 0), ("length_hacking", 0),
        ("grad_norm_spikes", 0), ("reward_zero", 0), ("clip_high", 0),
    )),
    ("control-ppo", "ppo", "stable-baselines3", "synthetic-cartpole", (
        ("healthy", 0), ("healthy", 1), ("healthy", 2),
        ("kl_blowup", 0), ("entropy_collapse", 0), ("value_loss_flat", 0), ("clip_low", 0),
        ("grad_norm_spikes", 1),
    )),
)


# Outcomes of the shared real runs, from the labels in their README.
REAL_RUN_OUTCOMES = {
    "cartpole_healthy_s0": ("success", "episode return 26 -> 495; reward std reaches 0 at the 500 cap (harmless)"),
    "cartpole_lr_too_high_5e-2": ("diverged", "lr 5e-2: approx_kl 5.98 on the first update, then entropy collapse"),
    "cartpole_tiny_lr_1e-6": ("failed", "lr 1e-6: too conservative, clip fraction 0 and reward flat ~27"),
    "pendulum_default_s0": ("inconclusive", "default PPO barely learns Pendulum: -1194 -> -1042 (solved ~ -200)"),
}


def hyperparameters(algorithm: str, lr: float, seed: int) -> dict[str, Any]:
    """What the trainer's config would say (the generator's curve-shape parameters stay hidden)."""
    if algorithm == "grpo":
        return {"actor": {"optim": {"lr": lr}, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "clip_ratio": 0.2,
                          "ppo_epochs": 1},
                "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True},
                "data": {"train_batch_size": 256, "max_response_length": 1024}, "rollout": {"n": 8}, "seed": seed}
    return {"learning_rate": lr, "n_steps": 2048, "batch_size": 64, "n_epochs": 10, "gamma": 0.99, "gae_lambda": 0.95,
            "clip_range": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "seed": seed}


def alias_keys(definitions: Mapping[str, Mapping[str, Any]], framework: str,
               algorithm: str) -> dict[str, tuple[str, float]]:
    """canonical name -> (raw key, sign) for one framework, preferring the algorithm-specific alias."""
    out: dict[str, tuple[str, float]] = {}
    for name, definition in definitions.items():
        candidates = [a for a in definition["aliases"] if a["framework"] == framework]
        candidates.sort(key=lambda a: (a["algorithm"] != algorithm, a["algorithm"] != "", a["key"]))
        if candidates:
            out[name] = (candidates[0]["key"], candidates[0]["sign"])
    return out


def _raw_series(curves: Mapping[str, Any], keys: Mapping[str, tuple[str, float]]) -> dict[str, SeriesData]:
    data = {}
    for name, curve in curves.items():
        key, sign = keys.get(name, (name, 1.0))
        # Store what the framework would have logged: canonical value / sign (SB3's -entropy).
        data[key] = SeriesData(np.asarray(curve.steps, np.int64), np.asarray(curve.values, np.float64) / sign)
    return data


def build_demo(url: str, shared_data: Path | None = None, echo: Callable[[str], None] = print) -> str:
    """Fill the registry at ``url``; idempotent (runs already there are left alone)."""
    from .synthetic import generate_run

    reg = Registry(url)
    definitions = reg.definitions_by_name()
    existing = {r["name"] for r in reg.list_runs(limit=None)[0]}
    added = 0
    for project, algorithm, framework, task, kinds in PROJECTS:
        keys = alias_keys(definitions, framework, algorithm)
        for kind, seed in kinds:
            name = f"{project}-{kind}-s{seed}"
            if name in existing:
                continue
            run = generate_run(kind, seed=seed, algorithm=algorithm, task=task, n_steps=DEMO_POINTS[algorithm])
            n_steps = int(max(c.steps[-1] for c in run.curves.values()))
            checkpoints = [(step, f"ckpt/{name}/step_{step}") for step in run.checkpoints]
            reg.register_arrays(
                name, _raw_series(run.curves, keys), project=project, algorithm=algorithm.upper(),
                framework=framework, task=task, params=hyperparameters(algorithm, run.params["lr"], seed),
                tags=["demo", kind] + ([f"seed{seed}"] if kind == "healthy" else []),
                outcome={
                    "verdict": run.outcome.verdict,
                    "scores": {"final_reward": run.outcome.final_score,
                               "normalized_score": run.outcome.normalized_score},
                    "notes": run.outcome.reason,
                    "checkpoints": checkpoints,
                },
            )
            added += 1
            echo(f"  {name}: {len(run.curves)} metrics, {n_steps:,} steps, verdict {run.outcome.verdict}")
    shared = shared_data or DEFAULT_SHARED_DATA
    real = 0
    if shared.is_dir():
        for run_dir in sorted(p for p in shared.iterdir() if p.is_dir()):
            try:
                result = reg.register(run_dir, project="sb3-classic-control", algorithm="PPO", tags=["real", "sb3"])
                if run_dir.name in REAL_RUN_OUTCOMES:
                    verdict, notes = REAL_RUN_OUTCOMES[run_dir.name]
                    final = reg.read_series(result.run_id, "rollout/ep_rew_mean").values[-1]
                    reg.set_outcome(result.run_id, verdict=verdict, notes=notes, scores={"final_episode_return": final})
                real += 1
                echo(f"  {run_dir.name}: real stable-baselines3 TensorBoard run")
            except AlreadyRegisteredError:
                pass
    total = reg.list_runs(limit=0)[1]
    reg.close()
    return f"demo registry ready: {added} synthetic and {real} real runs added, {total} runs in total"
