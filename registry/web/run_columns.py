"""What the runs views compute: metric-summary columns, curves grouped by a hyperparameter or the
tags (mean, standard error and the number of runs at each step), panels of every key matching a
pattern, and the rows of a parallel-coordinates plot.

Everything reads the stored summaries or the stored points; nothing is estimated. A grouped curve
at a step uses only the runs whose logged range covers that step (no extrapolation past a run's
last point), so the count of runs can drop near the end and is reported per step.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from sqlalchemy import select

from registry.core.errors import InputError
from registry.db.models import MetricDefinition, Series
from registry.core.series import SeriesData
from registry.store.reader import read_series_chunks
from registry.store.table_columns import MetricColumn, metric_summaries

GRID_POINTS = 400
MAX_PANEL_KEYS = 24


# --- patterns ---------------------------------------------------------------------------


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A panel pattern as a regular expression matched against whole keys.

    ``rewards/.*/mean`` is a regular expression; ``rewards/{source}/mean`` a template whose
    ``{name}`` stands for one path segment; ``rewards/*/mean`` a glob (``*`` one segment).
    """
    text = pattern.strip()
    if not text:
        raise InputError("a panel pattern is empty")
    if re.search(r"\{[A-Za-z_]\w*\}", text) or ("*" in text and ".*" not in text and not text.startswith("*")):
        parts = re.split(r"(\{[A-Za-z_]\w*\}|\*)", text)
        text = "".join("[^/]+" if p == "*" or (p.startswith("{") and p.endswith("}")) else re.escape(p) for p in parts)
    try:
        return re.compile(text)
    except re.error as exc:
        raise InputError(f"panel pattern {pattern!r}: {exc.msg} at position {exc.pos}") from None


@dataclass
class Curve:
    run_id: str
    run_name: str
    key: str  # the raw key, or the canonical name when matched by name
    data: SeriesData


def matching_curves(registry: Any, runs: Sequence[Mapping[str, Any]], pattern: str) -> list[Curve]:
    """Every series of ``runs`` whose raw key matches ``pattern`` (whole key) or whose definition's name
    is ``pattern``; per-step means, a canonical name's series in canonical sign."""
    regex = compile_pattern(pattern)
    names = {r["id"]: r["name"] for r in runs}
    out: list[Curve] = []
    with registry.read() as session:
        rows = session.execute(
            select(Series.id, Series.run_id, Series.key, Series.sign, MetricDefinition.name)
            .outerjoin(MetricDefinition, Series.definition_id == MetricDefinition.id)
            .where(Series.run_id.in_(list(names)))
            .order_by(Series.run_id, Series.key)).all()
        by_name = [r for r in rows if r[4] == pattern.strip()]
        chosen = [(sid, run_id, name, sign) for sid, run_id, key, sign, name in by_name]
        if chosen:  # one series per run for a canonical name: the longest, as elsewhere
            keep: dict[str, tuple] = {}
            for sid, run_id, name, sign in chosen:
                keep.setdefault(run_id, (sid, run_id, name, sign))
            chosen = list(keep.values())
        else:
            chosen = [(sid, run_id, key, 1.0) for sid, run_id, key, _, _ in rows if regex.fullmatch(key)]
        keys = sorted({c[2] for c in chosen})
        if len(keys) > MAX_PANEL_KEYS:
            raise InputError(f"panel pattern {pattern!r} matches {len(keys)} keys; at most {MAX_PANEL_KEYS} "
                             f"go on one plot (first ones: {', '.join(keys[:5])})")
        for sid, run_id, key, sign in chosen:
            data = read_series_chunks(session, sid).per_step()
            if sign != 1.0:
                data = SeriesData(data.steps, data.values * sign, data.wall_times, data.counts)
            out.append(Curve(run_id, names[run_id], key, data))
    return out


# --- groups -----------------------------------------------------------------------------


def group_label(run: Mapping[str, Any], by: str) -> str:
    """The group a run belongs to: a hyperparameter's value (``by`` its name) or its tags (``by=tags``)."""
    if by == "tags":
        return ", ".join(run.get("tags") or []) or "(no tags)"
    if by.startswith("tag:"):  # runs with that tag against runs without it
        tag = by[4:]
        return tag if tag in (run.get("tags") or []) else f"not {tag}"
    if by in run.get("params", {}):
        value = run["params"][by]
        return f"{by}={_short(value)}"
    return f"{by} unset"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass
class GroupCurve:
    """Mean and standard error of a group's runs at each grid step, with the number of runs there."""

    group: str
    key: str
    steps: np.ndarray
    mean: np.ndarray
    stderr: np.ndarray  # NaN where fewer than two runs
    n: np.ndarray
    runs: list[str] = field(default_factory=list)


def grid_for(curves: Sequence[SeriesData], points: int = GRID_POINTS) -> np.ndarray:
    """The steps to evaluate a group at: every logged step when there are few, else an even grid."""
    steps = np.unique(np.concatenate([c.steps for c in curves if len(c)])) if curves else np.empty(0, np.int64)
    if len(steps) <= points:
        return steps.astype(np.float64)
    return np.linspace(float(steps[0]), float(steps[-1]), points)


def aggregate(curves: Sequence[SeriesData], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, standard error, n) over the curves at ``grid``; a curve counts at a step only inside its
    own logged range (linear interpolation between its points, never past its ends) and only where
    its value is finite."""
    values = np.full((len(curves), len(grid)), np.nan)
    for i, c in enumerate(curves):
        ok = np.isfinite(c.values)
        if ok.sum() == 0:
            continue
        x, y = c.steps[ok].astype(np.float64), c.values[ok]
        inside = (grid >= x[0]) & (grid <= x[-1])
        values[i, inside] = np.interp(grid[inside], x, y)
    n = np.isfinite(values).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
        dev = np.where(np.isfinite(values), values - mean, 0.0)
        var = np.where(n > 1, (dev ** 2).sum(axis=0) / np.maximum(n - 1, 1), np.nan)
        stderr = np.sqrt(var) / np.sqrt(np.maximum(n, 1))
    return mean, np.where(n > 1, stderr, np.nan), n


def group_curves(curves: Sequence[Curve], runs: Sequence[Mapping[str, Any]], by: str) -> list[GroupCurve]:
    labels = {r["id"]: group_label(r, by) for r in runs}
    buckets: dict[tuple[str, str], list[Curve]] = {}
    for c in curves:
        buckets.setdefault((labels[c.run_id], c.key), []).append(c)
    out = []
    for (group, key), members in sorted(buckets.items()):
        grid = grid_for([m.data for m in members])
        mean, stderr, n = aggregate([m.data for m in members], grid)
        out.append(GroupCurve(group, key, grid, mean, stderr, n, [m.run_name for m in members]))
    return out


# --- parallel coordinates -----------------------------------------------------------------


def parallel_dimensions(runs: Sequence[Mapping[str, Any]], params: Sequence[str], outcome: str,
                        outcome_values: Mapping[str, float | None]) -> dict[str, Any]:
    """The parcoords dimensions for ``runs`` that have the outcome and every chosen hyperparameter.

    A numeric hyperparameter spanning two decades or more (all positive) is drawn as log10, named so;
    text and booleans become categories with their values as tick labels.
    """
    kept = [r for r in runs if _finite(outcome_values.get(r["id"])) and all(p in r["params"] for p in params)]
    dims = []
    for p in params:
        values = [r["params"][p] for r in kept]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        if numeric:
            vals = [float(v) for v in values]
            if vals and min(vals) > 0 and max(vals) / min(vals) >= 100:
                dims.append({"label": f"log10({p})", "values": [math.log10(v) for v in vals]})
            else:
                dims.append({"label": p, "values": vals})
        else:
            cats = sorted({str(v) for v in values})
            dims.append({"label": p, "values": [cats.index(str(v)) for v in values],
                         "tickvals": list(range(len(cats))), "ticktext": cats})
    dims.append({"label": outcome, "values": [float(outcome_values[r["id"]]) for r in kept]})
    return {"dimensions": dims, "runs": [r["name"] for r in kept], "ids": [r["id"] for r in kept],
            "left_out": len(runs) - len(kept)}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def nullable(a: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(a, dtype=np.float64)]


__all__ = ["MetricColumn", "GroupCurve", "aggregate", "compile_pattern", "group_curves", "group_label",
           "matching_curves", "metric_summaries", "parallel_dimensions"]
