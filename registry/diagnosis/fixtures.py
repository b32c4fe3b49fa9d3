"""Loaders used by the evaluation bench and the tests (not by :func:`diagnose` itself).

* :func:`default_metric_infos` reads the shipped metric dictionary and resolves a task.
* :func:`load_sb3_run` reads a stable-baselines3 TensorBoard run into canonical curves,
  with SB3's tags mapped (and entropy's sign flipped) as the dictionary's aliases say.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Mapping

import numpy as np

from .dictionary import metric_infos_from_definitions
from .types import Curve, MetricInfo

#: SB3 tag -> (canonical name, sign), as in the dictionary's stable-baselines3 aliases.
SB3_TAGS: dict[str, tuple[str, float]] = {
    "rollout/ep_rew_mean": ("episode_return_mean", 1.0),
    "rollout/ep_rew_std": ("episode_return_std", 1.0),
    "rollout/ep_len_mean": ("episode_length_mean", 1.0),
    "train/approx_kl": ("kl_old_mean", 1.0),
    "train/clip_fraction": ("clip_fraction", 1.0),
    "train/clip_range": ("clip_range", 1.0),
    "train/entropy_loss": ("entropy", -1.0),
    "train/value_loss": ("value_loss", 1.0),
    "train/policy_gradient_loss": ("policy_loss", 1.0),
    "train/loss": ("total_loss", 1.0),
    "train/explained_variance": ("explained_variance", 1.0),
    "train/learning_rate": ("learning_rate", 1.0),
    "train/std": ("policy_std", 1.0),
    "time/fps": ("throughput_steps_per_s", 1.0),
}


@lru_cache(maxsize=1)
def _default_definitions() -> tuple:
    import yaml
    path = Path(__file__).resolve().parents[1] / "data" / "default_dictionary.yaml"
    if not path.exists():
        return []
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return tuple(doc.get("definitions") or []) if isinstance(doc, Mapping) else tuple(doc or [])


def default_definitions() -> list[dict]:
    """The shipped dictionary's definitions (empty when the file is absent)."""
    return [dict(d) for d in _default_definitions()]


def default_metric_infos(task: str | None = None,
                         overrides: Mapping[str, tuple[float | None, float | None]] | None = None
                         ) -> dict[str, MetricInfo]:
    """MetricInfo per canonical metric of the shipped dictionary, ``task``'s ranges resolved;
    ``overrides`` replaces (low, high) of given metrics (e.g. a synthetic task's reward range)."""
    infos = metric_infos_from_definitions(default_definitions(), task)
    for name, (lo, hi) in (overrides or {}).items():
        base = infos.get(name) or MetricInfo(name=name)
        infos[name] = MetricInfo(name, base.layer, lo, hi, base.smoothing_window, base.higher_is_better)
    return infos


def load_sb3_run(run_dir: str | Path) -> dict[str, Curve]:
    """Canonical curves of one SB3 TensorBoard run directory (scalars stored as tensors)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    points: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                if v.tag not in SB3_TAGS:
                    continue
                if v.HasField("tensor"):
                    val = float(np.asarray(tensor_util.make_ndarray(v.tensor)).reshape(-1)[0])
                elif v.HasField("simple_value"):
                    val = float(v.simple_value)
                else:
                    continue
                points.setdefault(v.tag, []).append((int(ev.step), val))
    out = {}
    for tag, pts in points.items():
        name, sign = SB3_TAGS[tag]
        pts.sort()
        out[name] = Curve(np.array([p[0] for p in pts]), sign * np.array([p[1] for p in pts]))
    return out
