"""What the analysis layer reads of a run and of the dictionary, in the shapes diagnosis takes."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select

from registry.analysis.diagnosis import (
    Curve,
)
from registry.db.models import MetricDefinition
from registry.store.facade import Registry


def run_curves(registry: Registry, run_id: str) -> dict[str, Curve]:
    return {name: Curve(s.steps, s.values) for name, s in registry.canonical_curves(run_id).items()}


def diagnosis_definitions(registry: Registry) -> list[dict[str, Any]]:
    """What diagnosis needs of every definition (no aliases: cheaper than ``definitions_by_name``)."""
    D = MetricDefinition
    with registry.read() as session:
        rows = session.execute(select(D.name, D.layer, D.healthy_low, D.healthy_high, D.task_ranges,
                                      D.smoothing_window, D.higher_is_better, D.quantity)).all()
    return [{"name": r.name, "layer": r.layer, "healthy_range": {"low": r.healthy_low, "high": r.healthy_high},
             "task_ranges": dict(r.task_ranges or {}), "smoothing_window": r.smoothing_window,
             "higher_is_better": r.higher_is_better, "quantity": r.quantity} for r in rows]
