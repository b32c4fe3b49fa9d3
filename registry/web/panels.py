"""Hooks for the run dashboard's "Diagnosis" and "Similar runs" panels.

The dashboard calls both with the registry and the run (``Registry.run_detail`` dict) and
renders ``templates/panels/diagnosis.html`` / ``similar.html`` with whatever they return
as ``panel``; ``None`` shows the empty placeholder.
"""
from __future__ import annotations

from typing import Any

from ..store import Registry


def diagnosis_panel(registry: Registry, run: dict[str, Any]) -> Any | None:
    return None


def similar_panel(registry: Registry, run: dict[str, Any]) -> Any | None:
    return None
