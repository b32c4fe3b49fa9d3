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

from registry.analysis.diagnosis.dictionary import metric_infos_from_definitions
from registry.analysis.diagnosis.types import Curve, MetricInfo
from registry.dictionary.definitions import default_dictionary_text, parse_document
from registry.importers import open_source

@lru_cache(maxsize=1)
def _default_definitions() -> tuple:
    return tuple(parse_document(default_dictionary_text(), "default_dictionary.yaml"))


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
        infos[name] = MetricInfo(name, base.layer, lo, hi, base.smoothing_window, base.higher_is_better,
                                 base.quantity)
    return infos


def framework_keys(framework: str) -> dict[str, tuple[str, float]]:
    """raw key -> (canonical name, sign) from the shipped dictionary's aliases of ``framework``."""
    return {a["key"]: (d["name"], a["sign"]) for d in _default_definitions() for a in d["aliases"]
            if a["framework"] == framework}


def load_sb3_run(run_dir: str | Path) -> dict[str, Curve]:
    """Canonical curves of one SB3 TensorBoard run directory, read by the real importer and
    mapped (entropy's sign flipped) by the dictionary's stable-baselines3 aliases."""

    keys = framework_keys("stable-baselines3")
    points: dict[str, list[tuple[int, float]]] = {}
    for p in open_source(Path(run_dir), "tensorboard").points():
        if p.key in keys:
            points.setdefault(p.key, []).append((p.step, p.value))
    out = {}
    for key, pts in points.items():
        name, sign = keys[key]
        out[name] = Curve(np.array([s for s, _ in pts]), sign * np.array([v for _, v in pts]))
    return out
