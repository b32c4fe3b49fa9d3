"""The windowed episode mean the detectors judge, derived from a per-episode series when a run has no other.

Frameworks log an episode's return in two forms:

* CleanRL, one point per finished episode: ``writer.add_scalar("charts/episodic_return",
  info["episode"]["r"], global_step)`` (vwxyzjn/cleanrl ``cleanrl/ppo.py``, 020cf0e5 and fe8d8a03), bound to
  ``episode_return`` (averaging ``none``);
* stable-baselines3, once per rollout, the mean over the last ``stats_window_size`` (100) finished
  episodes: ``safe_mean([ep_info["r"] for ep_info in self.ep_info_buffer])`` (stable-baselines3 2.9.2,
  ``common/on_policy_algorithm.py`` ``dump_logs``; ``common/base_class.py`` ``stats_window_size=100``),
  bound to ``episode_return_mean`` (averaging ``episode``).

The reward detectors read the windowed form: one episode's return is too noisy for a drop or a
plateau to be told from luck. A run that has only the per-episode series would otherwise have its
objective left unjudged, so the diagnosis derives what SB3 would have logged: at each update (the
steps of the run's per-update series, else each episode's step), the mean of the last 100 episodes
finished by then. The diagnosis says it did so, and its findings on the derived curve are drawn on
the per-episode series the user has.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from registry.analysis.diagnosis.types import Curve

#: Episodes in the window: SB3's default ``stats_window_size``.
EPISODE_WINDOW = 100
#: per-episode definition -> (the windowed definition derived from it, SB3's key for that windowed mean).
WINDOWED = {"episode_return": ("episode_return_mean", "rollout/ep_rew_mean"),
            "episode_length": ("episode_length_mean", "rollout/ep_len_mean")}
#: Per-update series whose steps say when the run updated (the cadence SB3 logs its mean at).
_UPDATE_SERIES = ("kl_old_mean", "clip_fraction", "entropy", "value_loss", "policy_loss")


def _update_steps(curves: Mapping[str, Curve]) -> np.ndarray | None:
    for name in _UPDATE_SERIES:
        c = curves.get(name)
        if c is not None and len(c) >= 2:
            return np.unique(np.asarray(c.steps, dtype=np.int64))
    return None


def windowed_mean(per_episode: Curve, at: np.ndarray, window: int = EPISODE_WINDOW) -> Curve:
    """The mean of the last ``window`` finite values of ``per_episode`` logged at or before each step of
    ``at`` (steps before the first episode are left out)."""
    steps = np.asarray(per_episode.steps, dtype=np.int64)
    values = np.asarray(per_episode.values, dtype=np.float64)
    ok = np.isfinite(values)
    order = np.argsort(steps[ok], kind="stable")
    steps, values = steps[ok][order], values[ok][order]
    total = np.concatenate([[0.0], np.cumsum(values)])
    done = np.searchsorted(steps, at, side="right")     # episodes finished by each step
    keep = done > 0
    hi = done[keep]
    lo = np.maximum(0, hi - window)
    return Curve(np.asarray(at)[keep], (total[hi] - total[lo]) / (hi - lo))


def plotted_metric(derived: Mapping[str, Mapping[str, str]], metric: str) -> str:
    """The series a finding on ``metric`` is drawn on: for a curve the diagnosis derived (``derived``, as in
    ``Diagnosis.derived`` or its stored dict), the series it was derived from, which the run has."""
    return derived.get(metric, {}).get("from", metric)


def with_windowed_episode_means(curves: Mapping[str, Curve]) -> tuple[dict[str, Curve], dict[str, dict[str, str]]]:
    """``curves`` with each windowed episode mean derived from its per-episode series where the run has
    the latter only, and what was derived: windowed name -> {"from": per-episode name, "text": how}."""
    out = dict(curves)
    derived: dict[str, dict[str, str]] = {}
    grid = _update_steps(curves)
    for per_episode, (windowed, sb3_key) in WINDOWED.items():
        c = curves.get(per_episode)
        if c is None or len(c) == 0 or windowed in curves:
            continue
        at = grid if grid is not None else np.unique(np.asarray(c.steps, dtype=np.int64))
        mean = windowed_mean(c, at)
        if len(mean) == 0:
            continue
        out[windowed] = mean
        derived[windowed] = {
            "from": per_episode,
            "text": f"{windowed} derived from {per_episode} (one value per finished episode): the mean of the last "
                    f"{EPISODE_WINDOW} episodes at each {'update' if grid is not None else 'episode'}, as "
                    f"stable-baselines3 logs {sb3_key}"}
    return out, derived
