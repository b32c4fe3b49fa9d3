"""Turn metric-dictionary definitions into :class:`MetricInfo` (task range resolved).

Accepts definition mappings in the dictionary document's schema (``name``, ``layer``,
``healthy_range {low, high}``, ``task_ranges {task: {low, high}}``, ``smoothing_window``,
``higher_is_better``), as parsed from ``registry/dictionary/data/default_dictionary.yaml``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from registry.dictionary.definitions import healthy_range_for, task_range_for
from registry.analysis.diagnosis.types import MetricInfo


def metric_infos_from_definitions(definitions: Iterable[Mapping[str, Any]], task: str | None = None
                                  ) -> dict[str, MetricInfo]:
    out = {}
    for d in definitions:
        lo, hi = healthy_range_for(d, task)
        own = task_range_for(d, task)
        source = None
        if lo is not None or hi is not None:
            source = "dictionary: healthy range"
            if own:
                source = f"dictionary: task range for {task}" + (f" ({own['source']})" if own.get("source") else "")
        out[str(d["name"])] = MetricInfo(
            name=str(d["name"]), layer=str(d.get("layer") or "diagnostic"), healthy_low=lo, healthy_high=hi,
            smoothing_window=int(d.get("smoothing_window") or 10), higher_is_better=d.get("higher_is_better"),
            quantity=d.get("quantity"), range_source=source)
    return out
