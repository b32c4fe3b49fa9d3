"""Turn metric-dictionary definitions into :class:`MetricInfo` (task range resolved).

Accepts definition mappings in the dictionary document's schema (``name``, ``layer``,
``healthy_range {low, high}``, ``task_ranges {task: {low, high}}``, ``smoothing_window``,
``higher_is_better``), as parsed from ``registry/data/default_dictionary.yaml``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .types import MetricInfo


def _bounds(r: Any) -> tuple[float | None, float | None]:
    if not isinstance(r, Mapping):
        return None, None
    lo, hi = r.get("low"), r.get("high")
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def resolve_range(definition: Mapping[str, Any], task: str | None) -> tuple[float | None, float | None]:
    """The task's range when the definition has one for ``task`` (exact, then case-insensitive,
    then ignoring a ``-vN`` suffix), else the general healthy range."""
    tr = definition.get("task_ranges") or {}
    if task:
        cands = [task, task.lower()]
        base = task.rsplit("-v", 1)[0] if "-v" in task else task
        for key, r in tr.items():
            k = str(key)
            if k in cands or k.lower() == task.lower() or k.lower().rsplit("-v", 1)[0] == base.lower():
                lo, hi = _bounds(r)
                if lo is not None or hi is not None:
                    return lo, hi
    return _bounds(definition.get("healthy_range"))


def metric_infos_from_definitions(definitions: Iterable[Mapping[str, Any]], task: str | None = None
                                  ) -> dict[str, MetricInfo]:
    out = {}
    for d in definitions:
        lo, hi = resolve_range(d, task)
        out[str(d["name"])] = MetricInfo(
            name=str(d["name"]), layer=str(d.get("layer") or "diagnostic"), healthy_low=lo, healthy_high=hi,
            smoothing_window=int(d.get("smoothing_window") or 10), higher_is_better=d.get("higher_is_better"))
    return out
