"""The demo registry: realistic PPO and GRPO projects, healthy seeds and every classic failure.

Curves come from the seeded generator in ``registry.demo.synthetic`` (canonical metrics), and are
registered under the raw keys a real framework would log — stable-baselines3 for the PPO
project, verl for the GRPO project — so the demo exercises alias binding exactly as a real
import does. What a newcomer checks first holds:

- the healthy seeds of a project share one configuration and differ only in ``seed``, so the
  compare view groups them; every run of a project logs on one step scale (GRPO optimizer
  steps, PPO environment steps of 2,048-step rollouts);
- verdicts follow from each run's curves by one rule (``demo_outcome``), the same for all;
- each task gets a health baseline learned from its healthy seeds;
- real runs are added where the project finds them: the stable-baselines3 runs of
  ``../shared/data`` and the framework-written runs under ``tests/data/real`` of a checkout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from registry import open_registry
from registry.core.errors import AlreadyRegisteredError, RegistryError
from registry.importers.params import load_params_file
from registry.core.series import SeriesData
from registry.store.facade import Registry
from registry.analysis.health import current_findings
from registry.analysis.baselines import build_task_baseline
from registry.demo.synthetic import TASKS, generate_run

# Logged points per run: long enough for realistic curves, short enough to build in seconds.
DEMO_POINTS = {"grpo": 1500, "ppo": 600}
# Step units per logged point, one per project: GRPO logs every optimizer step, SB3's PPO once
# per rollout of n_steps=2048 environment steps.
DEMO_STRIDE = {"grpo": 1, "ppo": 2048}
# The project's configuration: every healthy seed runs it; a failing run changes what its name says.
BASE_LR = {"grpo": 1e-6, "ppo": 3e-4}
LR_FACTOR = {"kl_blowup": 10.0}
DEFAULT_REAL_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "real"
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "sb3_ppo"

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


# Framework-written runs under tests/data/real (see its README): glob pattern, project, algorithm,
# and the name of the trainer's own config file beside the run (read as its hyperparameters).
REAL_FRAMEWORK_RUNS: tuple[tuple[str, str, str, str | None], ...] = (
    ("cleanrl_ppo_cartpole/runs/*", "cleanrl-cartpole", "PPO", None),
    ("sb3_ppo_cartpole_logger/events.out.tfevents.*", "sb3-classic-control", "PPO", "params.json"),
    ("trl_grpo_tiny/*/checkpoint-*/trainer_state.json", "trl-tiny", "GRPO", "config.json"),
    ("verl_tracking_grpo/*/*.jsonl", "verl-tiny", "GRPO", "config.json"),
)


# The same task trained with two frameworks whose numbers mean different things: verl with the k1
# KL loss (kl_loss_type=kl) and sequence-averaged losses, TRL with its k3 KL and token-averaged
# dapo loss. The compare view of the pair warns before overlaying them.
PAIR_PROJECT, PAIR_TASK = "math-grpo-frameworks", "synthetic-math"
FRAMEWORK_PAIR: tuple[tuple[str, str, int, dict[str, Any]], ...] = (
    ("math-grpo-verl-k1-s3", "verl", 3, {
        "actor": {"optim": {"lr": 1e-6}, "use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "kl",
                  "loss_agg_mode": "seq-mean-token-mean", "clip_ratio": 0.2, "ppo_epochs": 1},
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True},
        "data": {"train_batch_size": 256, "max_response_length": 1024}, "rollout": {"n": 8}, "seed": 3}),
    ("math-grpo-trl-k3-s4", "trl", 4, {
        "learning_rate": 1e-6, "beta": 0.04, "loss_type": "dapo", "num_iterations": 2, "epsilon": 0.2,
        "scale_rewards": "group", "num_generations": 8, "max_completion_length": 1024, "seed": 4}),
)
# What TRL's GRPOTrainer logs (trl 1.16, the real run in tests/data/real/trl_grpo_tiny): canonical
# name -> (key, sign). It logs no advantage, old-policy KL or policy-loss series of its own.
TRL_GRPO_KEYS: dict[str, tuple[str, float]] = {
    "reward_sequence_mean": ("reward", 1.0), "reward_std": ("reward_std", 1.0),
    "reward_accuracy_mean": ("rewards/accuracy_reward/mean", 1.0),
    "reward_format_mean": ("rewards/format_reward/mean", 1.0),
    "kl_ref_mean": ("kl", 1.0), "clip_fraction": ("clip_ratio/region_mean", 1.0), "entropy": ("entropy", 1.0),
    "response_length_mean": ("completions/mean_length", 1.0), "grad_norm": ("grad_norm", 1.0),
    "learning_rate": ("learning_rate", 1.0), "total_loss": ("loss", 1.0),
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


def demo_outcome(run: Any) -> tuple[str, float, float, str]:
    """(verdict, final score, normalized score, reason) read off a synthetic run's curves.

    ``synthetic.run_outcome`` decides diverged and failed. Its success bar (final reward at 70%
    of the task's range) suits episode returns with a known cap, not a math accuracy that a
    healthy GRPO run lifts from 0.2 to 0.7: a reward that gained at least 30% of the range since
    the start of the run and lost nothing from its peak is a success too, as an engineer
    reading the curve would call it.
    """

    out = run.outcome
    if out.verdict != "inconclusive":
        return out.verdict, out.final_score, out.normalized_score, out.reason
    lo, hi = TASKS[run.task][2]
    reward = run.curves[run.reward_metric].values
    reward = reward[np.isfinite(reward)]
    start = float(np.median(reward[: max(3, reward.size // 20)]))
    gain = (out.final_score - start) / max(hi - lo, 1e-12)
    if gain >= 0.3:
        return ("success", out.final_score, out.normalized_score,
                f"reward rose from {start:.3g} to {out.final_score:.3g} ({gain:.0%} of the task range)")
    return out.verdict, out.final_score, out.normalized_score, out.reason


def _checked_verdict(reg: Registry, run_id: str, verdict: str, reason: str) -> tuple[str, str]:
    """A reward that rose is no success when the run's own diagnosis found a critical problem:
    an engineer reading the dashboard would call that run inconclusive, not a success."""
    if verdict != "success":
        return verdict, reason

    found = current_findings(reg, run_id)
    if not found.n_critical:
        return verdict, reason
    first = found.lines[0] if found.lines else "a critical finding"
    return "inconclusive", f"{reason}, but the diagnosis found: {first}"


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


def _raw_series(curves: Mapping[str, Any], keys: Mapping[str, tuple[str, float]],
                only_keyed: bool = False) -> dict[str, SeriesData]:
    """The curves under the framework's keys (``only_keyed``: a metric without a key is not logged)."""
    data = {}
    for name, curve in curves.items():
        if only_keyed and name not in keys:
            continue
        key, sign = keys.get(name, (name, 1.0))
        # Store what the framework would have logged: canonical value / sign (SB3's -entropy).
        data[key] = SeriesData(np.asarray(curve.steps, np.int64), np.asarray(curve.values, np.float64) / sign)
    return data


def _add_synthetic(reg: Registry, run: Any, name: str, project: str, framework: str,
                   keys: Mapping[str, tuple[str, float]], params: Mapping[str, Any], tags: list[str],
                   echo: Callable[[str], None], only_keyed: bool = False) -> None:
    """Register one synthetic run under ``framework``'s keys, then judge it by ``demo_outcome``."""
    verdict, final, normalized, reason = demo_outcome(run)
    result = reg.register_arrays(
        name, _raw_series(run.curves, keys, only_keyed), project=project, algorithm=run.algorithm.upper(),
        framework=framework, task=run.task, params=dict(params), tags=tags,
        outcome={"scores": {"final_reward": final, "normalized_score": normalized},
                 "checkpoints": [(step, f"ckpt/{name}/step_{step}") for step in run.checkpoints]},
    )
    verdict, reason = _checked_verdict(reg, result.run_id, verdict, reason)
    reg.set_outcome(result.run_id, verdict=verdict, notes=reason)
    n_steps = int(max(c.steps[-1] for c in run.curves.values()))
    echo(f"  {name}: {result.series_count} metrics, {n_steps:,} steps, verdict {verdict}")


def build_demo(url: str, shared_data: Path | None = None, echo: Callable[[str], None] = print,
               real_data: Path | None = None) -> str:
    """Fill the registry at ``url``; idempotent (runs already there are left alone).

    Returns the closing message: what was added, how to point the CLI at this registry, and
    three pages to open first.
    """

    reg = open_registry(url)
    definitions = reg.definitions_by_name()
    existing = {r["name"] for r in reg.list_runs(limit=None)[0]}
    added = 0
    for project, algorithm, framework, task, kinds in PROJECTS:
        keys = alias_keys(definitions, framework, algorithm)
        for kind, seed in kinds:
            name = f"{project}-{kind}-s{seed}"
            if name in existing:
                continue
            lr = BASE_LR[algorithm] * LR_FACTOR.get(kind, 1.0)
            _add_synthetic(reg, generate_run(kind, seed=seed, algorithm=algorithm, task=task,
                                             n_steps=DEMO_POINTS[algorithm], step_stride=DEMO_STRIDE[algorithm]),
                           name, project, framework, keys, hyperparameters(algorithm, lr, seed),
                           ["demo", kind] + ([f"seed{seed}"] if kind == "healthy" else []), echo)
            added += 1
    for name, framework, seed, params in FRAMEWORK_PAIR:
        if name in existing:
            continue
        trl = framework == "trl"  # TRL_GRPO_KEYS is all TRL logs: nothing else is registered for it
        keys = TRL_GRPO_KEYS if trl else alias_keys(definitions, framework, "grpo")
        run = generate_run("healthy", seed=seed, algorithm="grpo", task=PAIR_TASK, n_steps=DEMO_POINTS["grpo"],
                           step_stride=DEMO_STRIDE["grpo"])
        _add_synthetic(reg, run, name, PAIR_PROJECT, framework, keys, params, ["demo", "healthy", framework], echo,
                       only_keyed=trl)
        added += 1
    real = _add_shared_runs(reg, shared_data or DEFAULT_SHARED_DATA, echo)
    real += _add_real_framework_runs(reg, real_data or DEFAULT_REAL_DATA, echo)
    baselines = _build_baselines(reg, echo)
    total = reg.list_runs(limit=0)[1]
    pages = _first_pages(reg)
    reg.close()
    lines = [f"demo registry ready: {added} synthetic and {real} real runs added, {total} runs in total; "
             f"baselines for {', '.join(baselines) or 'no task'}",
             f"point the CLI at it: export RLREG_DATABASE_URL={url}"]
    if pages:
        lines.append("open first:")
        lines += [f"  {label}: {path}" for label, path in pages]
    return "\n".join(lines)


def _add_shared_runs(reg: Registry, shared: Path, echo: Callable[[str], None]) -> int:
    """The labelled stable-baselines3 runs of ``../shared/data``, with their verdicts."""
    if not shared.is_dir():
        return 0
    real = 0
    for run_dir in sorted(p for p in shared.iterdir() if p.is_dir()):
        try:
            result = reg.register(run_dir, project="sb3-classic-control", algorithm="PPO", tags=["real", "sb3"])
        except AlreadyRegisteredError:
            continue
        if run_dir.name in REAL_RUN_OUTCOMES:
            verdict, notes = REAL_RUN_OUTCOMES[run_dir.name]
            final = reg.read_series(result.run_id, "rollout/ep_rew_mean").values[-1]
            reg.set_outcome(result.run_id, verdict=verdict, notes=notes, scores={"final_episode_return": final})
        real += 1
        echo(f"  {run_dir.name}: real stable-baselines3 TensorBoard run")
    return real


def _add_real_framework_runs(reg: Registry, root: Path, echo: Callable[[str], None]) -> int:
    """Runs written by the frameworks' own loggers (``tests/data/real``, see its README)."""
    if not root.is_dir():
        return 0
    real = 0
    for pattern, project, algorithm, config_name in REAL_FRAMEWORK_RUNS:
        for source in sorted(root.glob(pattern)):
            config = _nearest(source, root, config_name) if config_name else None
            try:
                params = load_params_file(config) if config else None
                result = reg.register(source, project=project, algorithm=algorithm, params=params, tags=["real"])
            except AlreadyRegisteredError:
                continue
            except RegistryError as exc:  # a demo never stops on one file; say why it was left out
                echo(f"  {source.relative_to(root)}: not added ({exc})")
                continue
            real += 1
            echo(f"  {result.name}: real {result.framework or 'framework'} run ({result.source_format})")
    return real


def _nearest(source: Path, root: Path, name: str) -> Path | None:
    """The file ``name`` in the source's directory or the closest one above it, up to ``root``."""
    for directory in [source.parent, *source.parent.parents]:
        if (directory / name).is_file():
            return directory / name
        if directory == root:
            break
    return None


def _build_baselines(reg: Registry, echo: Callable[[str], None]) -> list[str]:
    """A health baseline for each demo task, learned from its healthy seeds."""

    built = []
    for project, _, _, task, kinds in PROJECTS:
        seeds = [f"{project}-healthy-s{seed}" for kind, seed in kinds if kind == "healthy"]
        try:
            build_task_baseline(reg, task, seeds, author="demo", note="learned from the demo's healthy seeds")
        except RegistryError as exc:
            echo(f"  no baseline for {task}: {exc}")
            continue
        built.append(task)
    return built


def _first_pages(reg: Registry) -> list[tuple[str, str]]:
    """A failing run's dashboard, the two-framework compare view, and a similar-runs answer."""
    rows, _ = reg.list_runs(where="verdict=diverged and tag=demo", limit=1, order_by="name")
    pair, _ = reg.list_runs(where=f"project={PAIR_PROJECT}", limit=None, order_by="name")
    pages = []
    if rows:
        pages.append(("a diverging run's dashboard", f"/runs/{rows[0]['id']}"))
    if len(pair) == 2:
        pages.append(("verl (k1 KL) against TRL (k3 KL) on one task, with the compare view's warnings",
                      "/compare?run=" + ",".join(r["id"] for r in pair)))
    if rows:
        pages.append(("runs that looked like it, and how they ended", f"/runs/{rows[0]['id']}#similar"))
    return pages
