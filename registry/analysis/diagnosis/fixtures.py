"""Loaders used by the evaluation bench and the tests (not by :func:`diagnose` itself).

* :func:`default_metric_infos` reads the shipped metric dictionary and resolves a task.
* :func:`load_tensorboard_run` reads a TensorBoard run (SB3, CleanRL, ...) into canonical curves,
  its tags mapped (and signs flipped) as the dictionary's aliases of its framework say, with the
  hyperparameters the importer found; :func:`load_sb3_run` is its SB3 shorthand.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Mapping

import numpy as np

from registry.analysis.diagnosis.dictionary import metric_infos_from_definitions
from registry.analysis.diagnosis.types import Curve, MetricInfo
from registry.core.series import SeriesData
from registry.dictionary.binding import layout_variants
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


def load_tensorboard_run(run_dir: str | Path, framework: str | None = None
                         ) -> tuple[dict[str, Curve], dict, str | None, str | None]:
    """Canonical curves, hyperparameters, framework and task of one TensorBoard run directory, read
    by the real importer (the framework as it detects it unless given) and mapped by the shipped
    dictionary's aliases of that framework (with their signs: SB3's entropy loss is flipped)."""
    source = open_source(Path(run_dir), "tensorboard")
    framework = framework or source.framework
    keys = framework_keys(framework or "custom")
    points: dict[str, list[tuple[int, float]]] = {}
    logical: dict[str, str | None] = {}
    for p in source.points():
        if p.key not in logical:
            # As the binder tries a key: as logged, then without a logger's training prefix (transformers'
            # TensorBoard callback writes TRL's "reward" as "train/reward"); eval series are not training curves.
            logical[p.key] = next((k for k, _, split in layout_variants(p.key) if split is None and k in keys), None)
        if logical[p.key] is not None:
            points.setdefault(logical[p.key], []).append((p.step, p.value))
    out: dict[str, Curve] = {}
    # As the registry reads a run (Registry.canonical_curves): one point per step (the mean of a step's
    # repeats), and of two keys bound to one definition, the one with more points, then the first by name.
    for key, pts in sorted(points.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        name, sign = keys[key]
        if name not in out:
            data = SeriesData(np.array([s for s, _ in pts]), np.array([v for _, v in pts], dtype=float)).per_step()
            out[name] = Curve(data.steps, sign * data.values)
    return out, source.params, framework, source.task


def load_sb3_run(run_dir: str | Path) -> dict[str, Curve]:
    """Canonical curves of one SB3 TensorBoard run directory (see :func:`load_tensorboard_run`)."""
    return load_tensorboard_run(run_dir, "stable-baselines3")[0]
