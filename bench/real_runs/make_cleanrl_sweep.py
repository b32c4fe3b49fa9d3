"""Train the labelled real CleanRL run set: CleanRL's own ``ppo.py``, unmodified, over a sweep.

CleanRL is a set of single-file scripts, not a package, so the script is run as a file: pass the
path of ``cleanrl/ppo.py`` from a CleanRL checkout (vwxyzjn/cleanrl); its sha256 is checked
against :data:`PPO_SHA256` so every run in the set comes from the same file. The file is not part
of this repository. Each run writes CleanRL's own layout, ``runs/{env_id}__ppo__{seed}__{time}/``
(one event file with the ``hyperparameters`` text summary, per-episode ``charts/episodic_return``
and per-iteration losses), into ``tests/data/real/cleanrl_sweep/<run>/``; the script's console
output is not kept. A run whose directory already holds an event file is skipped.

The sweep is in :data:`SWEEP`. Labels are *not* written here: they come from looking at the
curves afterwards (``labels.yaml`` beside the runs, with the observation per run).

Needs a separate environment (CleanRL's pyproject pins gymnasium 0.29.1; its ``ppo.py`` reads
``infos["final_info"]``, which gymnasium 1.x no longer produces):

    python3 -m venv /tmp/crlvenv && /tmp/crlvenv/bin/pip install torch gymnasium==0.29.1 tyro tensorboard
    /tmp/crlvenv/bin/python bench/real_runs/make_cleanrl_sweep.py --ppo PATH/cleanrl/ppo.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "real" / "cleanrl_sweep"

#: cleanrl/ppo.py at vwxyzjn/cleanrl fe8d8a03c41a7ef5b523e2e354bd01c363e786bb (2026-04-20).
PPO_SHA256 = "d8dfbb7ac0b21e747b77d6e6673e566db4d6cdacc83bcebcd19cf87ad0e459ae"

#: name -> (environment, seed, total timesteps, ppo.py flags on top of its defaults)
SWEEP: dict[str, tuple[str, int, int, dict]] = {
    # CartPole-v1: CleanRL's defaults (4 envs x 128 steps, learning rate 2.5e-4 annealed to 0).
    "cartpole_default_s1": ("CartPole-v1", 1, 200_000, {}),
    "cartpole_default_s2": ("CartPole-v1", 2, 200_000, {}),
    "cartpole_default_s3": ("CartPole-v1", 3, 200_000, {}),
    "cartpole_default_s4": ("CartPole-v1", 4, 200_000, {}),
    "cartpole_lr_2.5e-2_s5": ("CartPole-v1", 5, 200_000, {"learning-rate": 2.5e-2}),
    "cartpole_lr_2.5e-6_s6": ("CartPole-v1", 6, 200_000, {"learning-rate": 2.5e-6}),
    "cartpole_clip_0.01_s7": ("CartPole-v1", 7, 200_000, {"clip-coef": 0.01}),
    "cartpole_ent_-0.1_s8": ("CartPole-v1", 8, 200_000, {"ent-coef": -0.1}),
    "cartpole_ent_0.5_s9": ("CartPole-v1", 9, 200_000, {"ent-coef": 0.5}),
    "cartpole_epochs_50_s10": ("CartPole-v1", 10, 200_000, {"update-epochs": 50}),
    "cartpole_gamma_0.5_s11": ("CartPole-v1", 11, 200_000, {"gamma": 0.5}),
    # Acrobot-v1: the same defaults; episodes last up to 500 steps.
    "acrobot_default_s1": ("Acrobot-v1", 1, 300_000, {}),
    "acrobot_default_s2": ("Acrobot-v1", 2, 300_000, {}),
    "acrobot_default_s3": ("Acrobot-v1", 3, 300_000, {}),
    "acrobot_lr_2.5e-2_s4": ("Acrobot-v1", 4, 300_000, {"learning-rate": 2.5e-2}),
    "acrobot_clip_0.01_s5": ("Acrobot-v1", 5, 300_000, {"clip-coef": 0.01}),
    # Batch 29: fresh seeds and settings near CleanRL's defaults, a sparse-reward task.
    "cartpole_default_s12": ("CartPole-v1", 12, 200_000, {}),
    "cartpole_default_s13": ("CartPole-v1", 13, 200_000, {}),
    "cartpole_noanneal_s14": ("CartPole-v1", 14, 200_000, {"anneal-lr": False}),
    "cartpole_lr_2.5e-5_s15": ("CartPole-v1", 15, 200_000, {"learning-rate": 2.5e-5}),
    "cartpole_lr_1e-3_s16": ("CartPole-v1", 16, 200_000, {"learning-rate": 1e-3}),
    "cartpole_epochs_1_s17": ("CartPole-v1", 17, 200_000, {"update-epochs": 1}),
    "cartpole_ent_0.2_s18": ("CartPole-v1", 18, 200_000, {"ent-coef": 0.2}),
    "acrobot_default_s6": ("Acrobot-v1", 6, 300_000, {}),
    "acrobot_default_s7": ("Acrobot-v1", 7, 300_000, {}),
    "acrobot_lr_2.5e-5_s8": ("Acrobot-v1", 8, 300_000, {"learning-rate": 2.5e-5}),
    "acrobot_ent_-0.05_s9": ("Acrobot-v1", 9, 300_000, {"ent-coef": -0.05}),
    "mountaincar_default_s1": ("MountainCar-v0", 1, 200_000, {}),
    # Batch 30: fresh seeds, settings a little off the defaults, a learning rate high enough to reach the cap.
    "cartpole_default_s19": ("CartPole-v1", 19, 200_000, {}),
    "cartpole_default_s20": ("CartPole-v1", 20, 200_000, {}),
    "cartpole_lr_5e-4_s21": ("CartPole-v1", 21, 200_000, {"learning-rate": 5e-4}),
    "cartpole_lr_2e-3_s22": ("CartPole-v1", 22, 200_000, {"learning-rate": 2e-3}),
    "cartpole_noanneal_lr_1e-3_s23": ("CartPole-v1", 23, 200_000, {"anneal-lr": False, "learning-rate": 1e-3}),
    "cartpole_ent_0.05_s24": ("CartPole-v1", 24, 200_000, {"ent-coef": 0.05}),
    "cartpole_clip_0.1_s25": ("CartPole-v1", 25, 200_000, {"clip-coef": 0.1}),
    "cartpole_minibatches_32_s26": ("CartPole-v1", 26, 200_000, {"num-minibatches": 32}),
    "cartpole_gamma_0.9_s27": ("CartPole-v1", 27, 200_000, {"gamma": 0.9}),
    "acrobot_default_s10": ("Acrobot-v1", 10, 300_000, {}),
    "acrobot_default_s11": ("Acrobot-v1", 11, 300_000, {}),
    "acrobot_lr_1e-3_s12": ("Acrobot-v1", 12, 300_000, {"learning-rate": 1e-3}),
    # Batch 31: fresh seeds, learning rates 4x-20x, more epochs and a larger clip on CartPole, Acrobot at 8x the
    # learning rate and with more epochs, MountainCar with a learning rate 4x.
    "cartpole_default_s31": ("CartPole-v1", 31, 200_000, {}),
    "cartpole_default_s32": ("CartPole-v1", 32, 200_000, {}),
    "cartpole_lr_1e-3_s33": ("CartPole-v1", 33, 200_000, {"learning-rate": 1e-3}),
    "cartpole_noanneal_lr_1.5e-3_s34": ("CartPole-v1", 34, 200_000, {"anneal-lr": False, "learning-rate": 1.5e-3}),
    "cartpole_lr_5e-3_s35": ("CartPole-v1", 35, 200_000, {"learning-rate": 5e-3}),
    "cartpole_clip_0.3_s36": ("CartPole-v1", 36, 200_000, {"clip-coef": 0.3}),
    "cartpole_epochs_10_s37": ("CartPole-v1", 37, 200_000, {"update-epochs": 10}),
    "cartpole_minibatches_8_s38": ("CartPole-v1", 38, 200_000, {"num-minibatches": 8}),
    "acrobot_default_s13": ("Acrobot-v1", 13, 300_000, {}),
    "acrobot_lr_2e-3_s14": ("Acrobot-v1", 14, 300_000, {"learning-rate": 2e-3}),
    "acrobot_epochs_10_s15": ("Acrobot-v1", 15, 300_000, {"update-epochs": 10}),
    "mountaincar_lr_1e-3_s2": ("MountainCar-v0", 2, 200_000, {"learning-rate": 1e-3}),
    # Batch 32: learning rates 8x-40x on both tasks, a default seed, a negative entropy coefficient.
    "cartpole_lr_5e-3_s39": ("CartPole-v1", 39, 200_000, {"learning-rate": 5e-3}),
    "cartpole_lr_1e-2_s40": ("CartPole-v1", 40, 200_000, {"learning-rate": 1e-2}),
    "cartpole_noanneal_lr_2.5e-3_s41": ("CartPole-v1", 41, 200_000, {"anneal-lr": False, "learning-rate": 2.5e-3}),
    "cartpole_default_s42": ("CartPole-v1", 42, 200_000, {}),
    "cartpole_ent_-0.05_s43": ("CartPole-v1", 43, 200_000, {"ent-coef": -0.05}),
    "acrobot_lr_2e-3_s16": ("Acrobot-v1", 16, 300_000, {"learning-rate": 2e-3}),
    "acrobot_lr_4e-3_s17": ("Acrobot-v1", 17, 300_000, {"learning-rate": 4e-3}),
    "acrobot_noanneal_lr_1e-3_s18": ("Acrobot-v1", 18, 300_000, {"anneal-lr": False, "learning-rate": 1e-3}),
    # Batch 33: fresh default seeds, a clip coefficient 0.3, a negative entropy coefficient and a learning rate 80x on
    # CartPole; a default seed and learning rates 8x and 16x on Acrobot.
    "cartpole_default_s44": ("CartPole-v1", 44, 200_000, {}),
    "cartpole_default_s45": ("CartPole-v1", 45, 200_000, {}),
    "cartpole_default_s46": ("CartPole-v1", 46, 200_000, {}),
    "cartpole_clip_0.3_s47": ("CartPole-v1", 47, 200_000, {"clip-coef": 0.3}),
    "cartpole_ent_-0.2_s48": ("CartPole-v1", 48, 200_000, {"ent-coef": -0.2}),
    "cartpole_lr_2e-2_s49": ("CartPole-v1", 49, 200_000, {"learning-rate": 2e-2}),
    "acrobot_default_s19": ("Acrobot-v1", 19, 300_000, {}),
    "acrobot_lr_2e-3_s20": ("Acrobot-v1", 20, 300_000, {"learning-rate": 2e-3}),
    "acrobot_lr_4e-3_s21": ("Acrobot-v1", 21, 300_000, {"learning-rate": 4e-3}),
    # Batch 34: fresh default seeds, negative entropy coefficients -0.1 and -0.3 and a learning rate 80x on CartPole;
    # a default seed, a negative entropy coefficient and learning rates 16x and 32x on Acrobot.
    "cartpole_default_s50": ("CartPole-v1", 50, 200_000, {}),
    "cartpole_default_s51": ("CartPole-v1", 51, 200_000, {}),
    "cartpole_ent_-0.1_s52": ("CartPole-v1", 52, 200_000, {"ent-coef": -0.1}),
    "cartpole_ent_-0.3_s53": ("CartPole-v1", 53, 200_000, {"ent-coef": -0.3}),
    "cartpole_lr_2e-2_s54": ("CartPole-v1", 54, 200_000, {"learning-rate": 2e-2}),
    "acrobot_default_s22": ("Acrobot-v1", 22, 300_000, {}),
    "acrobot_ent_-0.1_s23": ("Acrobot-v1", 23, 300_000, {"ent-coef": -0.1}),
    "acrobot_lr_4e-3_s24": ("Acrobot-v1", 24, 300_000, {"learning-rate": 4e-3}),
    "acrobot_lr_8e-3_s25": ("Acrobot-v1", 25, 300_000, {"learning-rate": 8e-3}),
    # Batch 35: fresh default seeds and negative entropy coefficients -0.15, -0.2 and -0.4 on CartPole; a negative
    # entropy coefficient -0.3 on Acrobot.
    "cartpole_default_s55": ("CartPole-v1", 55, 200_000, {}),
    "cartpole_default_s56": ("CartPole-v1", 56, 200_000, {}),
    "cartpole_ent_-0.15_s57": ("CartPole-v1", 57, 200_000, {"ent-coef": -0.15}),
    "cartpole_ent_-0.2_s58": ("CartPole-v1", 58, 200_000, {"ent-coef": -0.2}),
    "cartpole_ent_-0.4_s59": ("CartPole-v1", 59, 200_000, {"ent-coef": -0.4}),
    "acrobot_ent_-0.3_s26": ("Acrobot-v1", 26, 300_000, {"ent-coef": -0.3}),
}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command(ppo: Path, env_id: str, seed: int, steps: int, flags: dict) -> list[str]:
    args = [sys.executable, str(ppo), "--no-track", "--env-id", env_id, "--seed", str(seed),
            "--total-timesteps", str(steps)]
    for flag, value in flags.items():
        # tyro's booleans are flags: --anneal-lr / --no-anneal-lr.
        args += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return args


def train(ppo: Path, name: str, env_id: str, seed: int, steps: int, flags: dict) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        # One torch thread per run: two runs share the machine's two cores.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command(ppo, env_id, seed, steps, flags), cwd=tmp, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise RuntimeError(f"{name}: ppo.py exited with {done.returncode}:\n{done.stderr[-2000:]}")
        made = [p for p in (Path(tmp) / "runs").iterdir() if p.is_dir()]
        if len(made) != 1:
            raise RuntimeError(f"{name}: expected one run directory, found {len(made)}")
        dest = OUT / name / "runs" / made[0].name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(made[0], dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ppo", type=Path, help="path of cleanrl/ppo.py")
    ap.add_argument("--only", nargs="*", help="train only these runs")
    ap.add_argument("--list", action="store_true", help="list the sweep and exit")
    args = ap.parse_args(argv)
    names = args.only or list(SWEEP)
    if args.list:
        for name in names:
            env_id, seed, steps, flags = SWEEP[name]
            print(f"{name:<26} {env_id:<15} seed {seed} {steps:>7} steps {flags}")
        return 0
    if args.ppo is None or file_sha256(args.ppo) != PPO_SHA256:
        raise SystemExit(f"--ppo must be cleanrl/ppo.py with sha256 {PPO_SHA256}")
    for name in names:
        env_id, seed, steps, flags = SWEEP[name]
        if any((OUT / name).rglob("events.out.tfevents.*")):
            print(f"{name}: already trained, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        train(args.ppo, name, env_id, seed, steps, flags)
        print(f"{name}: trained in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
