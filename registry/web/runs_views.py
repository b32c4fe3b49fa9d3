"""Views over many runs at once: curves grouped by a hyperparameter or tag (mean, standard-error
band, number of runs at each step), pattern panels (``rewards/.*/mean``: every matching key on one
plot) and a parallel-coordinates plot of hyperparameters against an outcome score.

The pages take the runs table's filter (``q`` and the quick filters) and draw with plotly.js
(``runs_views.js``); the numbers come as JSON in a ``<script type="application/json">`` block,
which the CSP does not execute.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from flask import Blueprint, render_template, request
from sqlalchemy import select

from registry.core.errors import InputError, RegistryError
from registry.db.models import MetricDefinition, OutcomeScore, RunParam, Series
from registry.web.context import get_registry
from registry.web.run_columns import (
    MetricColumn,
    group_curves,
    matching_curves,
    metric_summaries,
    nullable,
    parallel_dimensions,
)
from registry.store.table_columns import PREFERRED_METRICS, pick_param_columns
from registry.web.vendor import inline_style_guards, plotly_available

bp = Blueprint("runs_views", __name__)

MAX_RUNS = 200
MAX_PANELS = 8
MAX_LINE_POINTS = 1000


def known_params(reg: Any, limit: int = 300) -> list[str]:
    with reg.read() as session:
        return list(session.scalars(select(RunParam.key).distinct().order_by(RunParam.key).limit(limit)))


def known_metrics(reg: Any) -> list[str]:
    """Definitions some run has a series bound to."""
    with reg.read() as session:
        return list(session.scalars(select(MetricDefinition.name).distinct()
                                    .join(Series, Series.definition_id == MetricDefinition.id)
                                    .order_by(MetricDefinition.name)))


def known_scores(reg: Any) -> list[str]:
    with reg.read() as session:
        return list(session.scalars(select(OutcomeScore.name).distinct().order_by(OutcomeScore.name)))


def _filters() -> dict[str, str | None]:
    return {f: (request.args.get(f) or "").strip() or None for f in ("q", "project", "verdict", "status", "tag")}


def _runs(filters: Mapping[str, str | None]) -> tuple[list[dict[str, Any]], int]:
    quick = {k: v for k, v in filters.items() if k != "q"}
    return get_registry().list_runs(where=filters["q"], limit=MAX_RUNS, **quick)


def _plotly_head() -> dict[str, Any] | None:

    return {"style_guards": inline_style_guards()} if plotly_available() else None


def _thin(steps: Sequence[float], *columns: Sequence[Any]) -> tuple[list, ...]:
    """At most MAX_LINE_POINTS evenly picked points (the grouped grid already has fewer)."""
    n = len(steps)
    if n <= MAX_LINE_POINTS:
        return (list(steps), *[list(c) for c in columns])
    idx = sorted({round(i * (n - 1) / (MAX_LINE_POINTS - 1)) for i in range(MAX_LINE_POINTS)})
    return ([steps[i] for i in idx], *[[c[i] for i in idx] for c in columns])


def panel_spec(reg: Any, runs: Sequence[Mapping[str, Any]], pattern: str, by: str | None,
               units: Mapping[str, str]) -> dict[str, Any]:
    """One plot: every key matching ``pattern`` for every run, or each group's mean and band."""
    curves = matching_curves(reg, runs, pattern)
    traces: list[dict[str, Any]] = []
    keys = sorted({c.key for c in curves})
    if by:
        for g in group_curves(curves, runs, by):
            name = g.group if len(keys) == 1 else f"{g.group} \u00b7 {g.key}"
            x, mean, se, n = _thin(nullable(g.steps), nullable(g.mean), nullable(g.stderr), [int(v) for v in g.n])
            traces.append({"kind": "group", "name": f"{name} ({len(g.runs)} run{'s' if len(g.runs) != 1 else ''})",
                           "x": x, "y": mean, "se": se, "n": n, "runs": g.runs})
    else:
        for c in curves:
            x, y = _thin(nullable(c.data.steps.astype(float)), nullable(c.data.values))
            name = c.run_name if len(keys) == 1 else f"{c.run_name} \u00b7 {c.key}"
            traces.append({"kind": "run", "name": name, "x": x, "y": y})
    unit = units.get(pattern.strip(), "")
    return {"pattern": pattern, "keys": keys, "traces": traces, "unit": unit,
            "title": pattern + (f" ({len(keys)} keys)" if len(keys) > 1 else "")}


@bp.get("/runs/curves")
def curves():
    """Grouped curves and pattern panels for the runs matching the table's filter."""
    reg = get_registry()
    filters = _filters()
    by = (request.args.get("by") or "").strip() or None
    panels = [p for p in request.args.getlist("panel") if p.strip()][:MAX_PANELS]
    error = None
    status = 200
    runs: list[dict[str, Any]] = []
    total = 0
    specs: list[dict[str, Any]] = []
    metrics = known_metrics(reg)
    if not panels:

        panels = [m for m in PREFERRED_METRICS if m in metrics][:2] or metrics[:1]
    try:
        runs, total = _runs(filters)
        defs = reg.definitions_by_name(panels)
        units = {name: (d.get("unit") or "") for name, d in defs.items()}
        specs = [panel_spec(reg, runs, p, by, units) for p in panels]
    except RegistryError as exc:
        error, status = str(exc), 400
    groups = sorted({t["name"] for s in specs for t in s["traces"]}) if by else []
    return render_template(
        "runs_curves.html", filters=filters, by=by, panels=panels, runs=runs, total=total, error=error,
        specs=specs, groups=groups,
        params=known_params(reg), metrics=metrics, max_runs=MAX_RUNS, interactive=_plotly_head(),
    ), status


@bp.get("/runs/parallel")
def parallel():
    """Hyperparameters against an outcome: a score (``score.NAME``) or a metric summary (``NAME:last``)."""
    reg = get_registry()
    filters = _filters()
    error = None
    status = 200
    runs: list[dict[str, Any]] = []
    total = 0
    data: dict[str, Any] = {"dimensions": [], "runs": [], "ids": [], "left_out": 0}
    scores = known_scores(reg)
    metrics = known_metrics(reg)
    params = [p.strip() for raw in request.args.getlist("params") for p in raw.split(",") if p.strip()]
    outcome = (request.args.get("outcome") or "").strip()
    try:
        runs, total = _runs(filters)
        if not outcome:
            outcome = _default_outcome(runs, scores, metrics)
        values = outcome_values(reg, runs, outcome) if outcome else {}
        if not params:  # those that vary among the runs with an outcome and that all of them have

            scored = [r for r in runs if values.get(r["id"]) is not None]
            shared = [p for p in pick_param_columns(scored, limit=50) if all(p in r["params"] for r in scored)]
            params = shared[:6]
        if outcome:
            data = parallel_dimensions(runs, params, outcome, values)
    except RegistryError as exc:
        error, status = str(exc), 400
    return render_template(
        "runs_parallel.html", filters=filters, params=params, outcome=outcome, runs=runs, total=total,
        error=error, data=data, all_params=known_params(reg),
        scores=scores, metrics=metrics, interactive=_plotly_head(),
    ), status


def _default_outcome(runs: Sequence[Mapping[str, Any]], scores: Sequence[str], metrics: Sequence[str]) -> str:
    """The score most of these runs have; else the last value of their reward metric."""
    counts = {s: sum(s in r["scores"] for r in runs) for s in scores}
    best = max(counts, key=lambda s: (counts[s], s), default=None)
    if best and counts[best]:
        return f"score.{best}"

    for m in PREFERRED_METRICS:
        if m in metrics:
            return f"{m}:last"
    return ""


def outcome_values(reg: Any, runs: Sequence[Mapping[str, Any]], outcome: str) -> dict[str, float | None]:
    if outcome.startswith("score."):
        name = outcome[len("score."):]
        return {r["id"]: r["scores"].get(name) for r in runs}
    column = MetricColumn.parse(outcome)
    if column.name not in known_metrics(reg):
        raise InputError(f"outcome {outcome!r}: no run has the metric {column.name!r}; write score.NAME for a "
                         "final score or METRIC:last|min|max|mean for a metric summary")
    found = metric_summaries(reg, [r["id"] for r in runs], [column])
    return {rid: v.get(column.spec) for rid, v in found.items()}


__all__ = ["bp", "known_metrics", "known_params", "known_scores", "outcome_values", "panel_spec"]
