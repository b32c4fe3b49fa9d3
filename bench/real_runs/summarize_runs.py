"""Print the numbers a label is read from, per run of the real SB3 or CleanRL sweep.

For each run directory under ``tests/data/real/sb3_sweep`` (or the directories given, SB3 or CleanRL runs):
the episode return early / late / best (for CleanRL, the mean of the last 100 episodes at each update, as SB3
logs it and the diagnosis judges it), and the per-update metrics the framework logs (approx_kl, clip_fraction,
entropy, value loss, explained variance) as first-10% median, overall median, max and last-10% median. Labels
in ``labels.yaml`` are written from this output and the curves, not from the sweep's intent.

Run: .venv/bin/python bench/real_runs/summarize_runs.py [RUN_DIR ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from registry.analysis.diagnosis.episodes import with_windowed_episode_means  # noqa: E402
from registry.analysis.diagnosis.fixtures import load_tensorboard_run  # noqa: E402

SWEEP = ROOT / "tests" / "data" / "real" / "sb3_sweep"
SHOW = ("kl_old_mean", "clip_fraction", "entropy", "value_loss", "explained_variance", "policy_loss")


def _parts(v: np.ndarray) -> tuple[float, float, float, float]:
    k = max(1, v.size // 10)
    return float(np.median(v[:k])), float(np.median(v)), float(np.max(v)), float(np.median(v[-k:]))


def summarize(run_dir: Path) -> str:
    if (run_dir / "params.json").exists():
        curves = load_tensorboard_run(run_dir, "stable-baselines3")[0]
    else:                                           # CleanRL's runs/<run name>/ layout
        (inner,) = (run_dir / "runs").iterdir()
        curves, _ = with_windowed_episode_means(load_tensorboard_run(inner)[0])
    lines = [f"== {run_dir.name}"]
    ret = curves.get("episode_return_mean")
    if ret is not None:
        v = ret.values
        k = max(1, v.size // 10)
        lines.append(f"  return: n={v.size} first {np.median(v[:k]):.1f} best {v.max():.1f} "
                     f"last {np.median(v[-k:]):.1f} (steps {ret.steps[0]}-{ret.steps[-1]})")
        lines.append("  return curve: " + " ".join(f"{x:.0f}" for x in v[:: max(1, v.size // 15)]))
    for name in SHOW:
        c = curves.get(name)
        if c is None or not len(c):
            continue
        a, m, mx, z = _parts(c.values)
        lines.append(f"  {name:<20} first {a:.4g}  median {m:.4g}  max {mx:.4g}  last {z:.4g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or sorted(
        p for p in SWEEP.iterdir() if p.is_dir())
    for d in dirs:
        print(summarize(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
