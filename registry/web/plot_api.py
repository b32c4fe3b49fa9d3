"""JSON for the interactive plots: one series over a step range at the plot's width, and a run's stamp.

``GET /api/runs/<ref>/plot`` answers with an ETag from the run's ``data_version`` and the
request, so a live page polling an unchanged run gets ``304 Not Modified`` before any point is
read. ``GET /api/runs/<ref>/stamp`` is what a live page polls: the run's ``data_version``,
status and last update, also with an ETag.
"""
from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import func, select

from registry.core.errors import InputError
from registry.core.jsonsafe import json_safe
from registry.db.models import Series
from registry.web.context import get_registry
from registry.web import queries
from registry.web.cache import digest
from registry.web.curves import DEFAULT_WINDOW
from registry.web.iplot import COUNTER_PREFIX, ViewRequest, counter_curve, step_arg, view_data
from registry.web.plots import build_overlay, compare_key, compare_request, diagnosis_marks, plot_range

bp = Blueprint("plot_api", __name__, url_prefix="/api")

# Bump when the body changes shape, so a browser's cached ETag is not taken for the new body.
VIEW_VERSION = 1


def _not_modified(tag: str) -> Response | None:
    if request.if_none_match.contains(tag):
        response = Response(status=304)
        response.set_etag(tag)
        return response
    return None


def _run_length(run_id: str) -> float:
    """The last step over the run's series (fraction-of-training axis, as ``compare_curves.run_length``)."""
    with get_registry().read() as session:
        last = session.scalar(select(func.max(Series.last_step)).where(Series.run_id == run_id))
    return float(last) if last else 1.0


@bp.get("/runs/<ref>/plot")
def run_plot_view(ref: str) -> Response:
    """One series of one run as an interactive plot draws it (see ``registry.web.iplot``)."""
    key = request.args.get("key")
    if not key:
        raise InputError("query parameter 'key' is required")
    view = ViewRequest.from_args(request.args)
    reg = get_registry()
    # Not the dashboard's short-lived memo of series refs: a live page asks right after new points.
    sref = queries.series_ref(reg, ref, key)
    # The range the run's diagnosis judged this metric by (it changes with a rebuilt baseline too).
    healthy = plot_range(reg, sref, diagnosis_marks(reg, sref))
    tag = digest(("plot-view", VIEW_VERSION, sref.run_id, sref.data_version, sref.key, sref.definition_name,
                  sref.definition_version, sref.task, view.key(), tuple(sorted((healthy or {}).items()))))
    cached = _not_modified(tag)
    if cached is not None:
        return cached
    definition = sref.definition(reg)
    window = view.window or int((definition or {}).get("smoothing_window") or DEFAULT_WINDOW)
    counter = None
    if view.x_axis.startswith(COUNTER_PREFIX):
        ckey = view.x_axis[len(COUNTER_PREFIX):]
        counter = counter_curve(reg.read_series(sref.run_id, ckey), ckey)
    data = reg.read_series(sref.run_id, sref.key)
    body = view_data(data, sref.sign, view, window,
                     run_length=_run_length(sref.run_id) if view.x_axis == "fraction" else 1.0, counter=counter)
    low, high = (healthy["low"], healthy["high"]) if healthy else (None, None)
    body = {"run_id": sref.run_id, "run": sref.run_name, "key": sref.key, "definition": sref.definition_name,
            "sign": sref.sign, "data_version": sref.data_version, "healthy": [low, high],
            "healthy_source": healthy.get("source") if healthy else None, **body}
    response = jsonify(json_safe(body))
    response.set_etag(tag)
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def _iso_utc(when: datetime | None) -> str | None:
    """ISO 8601 with the zone (SQLite hands back naive datetimes; the registry writes UTC)."""
    if when is None:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()


@bp.get("/runs/<ref>/stamp")
def run_stamp(ref: str) -> Response:
    """The run's data version, status and last update: what a live dashboard polls."""
    reg = get_registry()
    with reg.read() as session:
        run = reg.resolve_run(session, ref)
        body = {"run_id": run.id, "name": run.name, "status": run.status, "data_version": run.data_version,
                "updated_at": _iso_utc(run.updated_at)}
    tag = digest(("stamp", body["run_id"], body["data_version"], body["status"], body["updated_at"]))
    cached = _not_modified(tag)
    if cached is not None:
        return cached
    response = jsonify(body)
    response.set_etag(tag)
    response.headers["Cache-Control"] = "private, no-cache"
    return response


# --- comparisons -------------------------------------------------------------------


def _array(values) -> list | None:  # noqa: ANN001 - numpy array or None
    if values is None:
        return None
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    return [v if v == v and abs(v) != float("inf") else None for v in arr.tolist()]


@bp.get("/compare/plot")
def compare_plot_view() -> Response:
    """The overlay of one metric over several runs as JSON traces (what the compare page's PNG draws).

    Same parameters as ``/plots/compare``, plus ``x_from``/``x_to`` (in the x-axis' units: steps,
    or fractions) for a zoomed view, and ``points`` (the plot's width) for the reduction.
    """
    ids, metric, normalized, copts, sopts = compare_request()
    lo, hi = step_arg(request.args, "x_from"), step_arg(request.args, "x_to")
    if (lo is None) != (hi is None) or (lo is not None and hi < lo):
        raise InputError("give both x_from and x_to, with x_from <= x_to")
    x_range = None if lo is None else (lo, hi)
    tag = digest(compare_key(ids, metric, normalized, copts, sopts, "compare-view") + (VIEW_VERSION, x_range))
    cached = _not_modified(tag)
    if cached is not None:
        return cached
    spec, _ = build_overlay(ids, metric, normalized, copts, sopts, x_range=x_range)
    unit = queries.definition_summaries(get_registry(), [metric]).get(metric, {}).get("unit")
    body = {
        "metric": metric, "normalized": normalized, "xlabel": spec.xlabel, "unit": unit,
        "healthy": list(spec.healthy) if spec.healthy else [None, None], "notes": spec.notes,
        "warnings": spec.warnings, "x_range": list(x_range) if x_range else None,
        "traces": [{"label": t.label, "color": t.color, "dash": not isinstance(t.linestyle, str) or t.linestyle != "-",
                    "raw_markers": t.raw_markers, "raw_x": _array(t.raw_x), "raw_y": _array(t.raw_y),
                    "smooth_x": _array(t.smooth_x), "smooth_y": _array(t.smooth_y), "band_x": _array(t.band_x),
                    "band_low": _array(t.band_low), "band_high": _array(t.band_high)} for t in spec.traces],
    }
    response = jsonify(body)
    response.set_etag(tag)
    response.headers["Cache-Control"] = "private, no-cache"
    return response
