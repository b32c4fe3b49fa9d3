"""The JSON API under /api/ (documented in ``openapi.yaml``, served at /api/openapi.yaml).

Errors are ``{"error": message}``: 400 for a malformed filter or parameter, 404 for an
unknown run, series or definition.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from flask import Blueprint, Response, abort, jsonify, request

from registry.core.errors import InputError
from registry.core.jsonsafe import json_safe
from registry.store.reader import reduce_points
from registry.web.context import get_registry
from registry.web import queries
from registry.web.curves import int_arg
from registry.core.downsample import MAX_POINTS
from registry.web.iplot import step_arg
from registry.analysis.health import current_findings
from registry.analysis.similarity import find_similar_for_run
from registry.analysis.baselines import baseline_history, list_baselines, require_baseline

bp = Blueprint("api", __name__, url_prefix="/api")

OPENAPI_PATH = Path(__file__).with_name("openapi.yaml")
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


clean = json_safe


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    return int_arg(request.args, name, default, low, high)


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return Response(OPENAPI_PATH.read_text(encoding="utf-8"), mimetype="application/yaml")


@bp.get("/runs")
def runs() -> Response:
    limit = _int_arg("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = _int_arg("offset", 0, 0, 10**9)
    where = request.args.get("filter") or request.args.get("q") or None
    rows, total = get_registry().list_runs(
        where=where, project=request.args.get("project") or None, tag=request.args.get("tag") or None,
        verdict=request.args.get("verdict") or None, status=request.args.get("status") or None,
        order_by=request.args.get("order") or "-created_at", limit=limit, offset=offset,
    )
    return jsonify({"runs": clean(rows), "total": total, "limit": limit, "offset": offset})


@bp.get("/runs/<ref>")
def run(ref: str) -> Response:
    return jsonify(clean(get_registry().run_detail(ref)))


@bp.get("/runs/<ref>/series")
def series(ref: str) -> Response:
    """One series' points; ``canonical=1`` applies the alias sign, ``points=N`` downsamples (MinMaxLTTB);
    ``from_step``/``to_step`` keep only that step range (inclusive), before any downsampling."""
    key = request.args.get("key")
    if not key:
        raise InputError("query parameter 'key' is required")
    canonical = _bool_arg("canonical")
    per_step = _bool_arg("per_step")
    points = _int_arg("points", 0, 0, MAX_POINTS)
    if points and points < 10:
        raise InputError("points must be at least 10 (or 0 for every point)")
    reg = get_registry()
    sref = queries.series_ref(reg, ref, key)
    lo, hi = step_arg(request.args, "from_step"), step_arg(request.args, "to_step")
    if lo is not None and hi is not None and hi < lo:
        raise InputError(f"to_step ({hi:g}) must not be below from_step ({lo:g})")
    data = reg.read_series(sref.run_id, sref.key, canonical=canonical, from_step=lo, to_step=hi)
    repeated = data.has_repeats
    if per_step:
        data = data.per_step()
    nonfinite = int((~np.isfinite(np.asarray(data.values, dtype=np.float64))).sum())
    data, downsampled = reduce_points(data, points)
    counts = data.counts
    steps = np.asarray(data.steps)
    values = np.asarray(data.values, dtype=np.float64)
    value_list = values.tolist()
    if not np.isfinite(values).all():
        value_list = [v if math.isfinite(v) else None for v in value_list]
    return jsonify({
        "run_id": sref.run_id, "key": sref.key,
        "definition": sref.definition_name,
        "canonical": canonical, "sign": sref.sign, "semantics": clean(sref.semantics),
        "count": sref.count, "nonfinite": nonfinite, "returned": len(value_list), "downsampled": downsampled,
        "repeated_steps": repeated, "steps": steps.tolist(), "values": value_list,
        **({"counts": counts.tolist()} if per_step and counts is not None else {}),
    })



@bp.get("/definitions")
def definitions() -> Response:
    layer = request.args.get("layer") or None
    defs = get_registry().definitions_by_name()
    versions = queries.definition_versions(get_registry())
    items = [dict(d, version=versions.get(name)) for name, d in defs.items() if not layer or d["layer"] == layer]
    return jsonify({"definitions": clean(items)})


@bp.get("/definitions/<name>")
def definition(name: str) -> Response:
    current, versions = queries.definition_history(get_registry(), name)
    out = dict(current)
    out["versions"] = [
        {"version": v["version"], "author": v["author"], "note": v["note"], "created_at": v["created_at"],
         "changed_fields": v["changed_fields"]}
        for v in versions
    ]
    return jsonify(clean(out))


@bp.get("/runs/<ref>/diagnosis")
def run_diagnosis(ref: str) -> Response:
    """The run's diagnosis on its data as it is now (the stored one when current, else computed)."""
    reg = get_registry()
    with reg.read() as session:
        run = reg.resolve_run(session, ref)
        run_id, name, status, data_version, task = run.id, run.name, run.status, run.data_version, run.task
    found = current_findings(reg, run_id, data_version=data_version, task=task)
    body = {
        "run_id": run_id, "name": name, "status": status, "task": task, "data_version": data_version,
        "computed_at": found.computed_at.isoformat() if found.computed_at else None,
        "n_info": found.n_info, "n_warning": found.n_warning, "n_critical": found.n_critical,
        **(found.diagnosis or {}),
    }
    return jsonify(clean(body))


def _bool_arg(name: str) -> bool:
    raw = (request.args.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise InputError(f"{name} must be true or false; got {raw!r}")


def _portion_arg(name: str) -> float | int | None:
    """A fraction of training (``0.25``, ``25%``) or a step count (``2000``)."""
    raw = (request.args.get(name) or "").strip()
    if not raw:
        return None
    percent = raw.endswith("%")
    try:
        value = float(raw.rstrip("%"))
    except ValueError:
        raise InputError(f"{name} must be a fraction (0.25), a percentage (25%) or a step count; got {raw!r}") \
            from None
    if not math.isfinite(value):
        raise InputError(f"{name} must be finite; got {raw!r}")
    if percent:
        value /= 100.0
    return int(value) if value > 1 and value.is_integer() else value


@bp.get("/runs/<ref>/similar")
def run_similar(ref: str) -> Response:
    """The k historical runs whose curves look most like this run's, and how they ended."""
    window = None
    raw_window = (request.args.get("window") or "").strip()
    if raw_window:
        parts = [p.strip() for p in raw_window.split(",")]
        if len(parts) != 2:
            raise InputError(f"window must be START,END; got {raw_window!r}")
        window = tuple(_portion_arg_text(p) for p in parts)
    outcome = [v for v in request.args.getlist("outcome") if v] or None
    reg = get_registry()
    with reg.read() as session:
        run = reg.resolve_run(session, ref)
        run_id, status = run.id, run.status
    result = find_similar_for_run(
        reg, run_id, status=status, metrics=request.args.get("metrics") or None, k=_int_arg("k", 10, 1, 100),
        prefix=_portion_arg("prefix"), window=window, align=request.args.get("align") or "fraction",
        normalize=request.args.get("normalize") or "z", where=request.args.get("where") or None,
        same_task=_bool_arg("same_task"), same_project=_bool_arg("same_project"),
        same_algorithm=_bool_arg("same_algorithm"), outcome=outcome, anywhere=_bool_arg("anywhere"),
    )
    return jsonify(clean(result.to_dict()))


def _portion_arg_text(raw: str) -> float | int:
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"window bounds must be numbers; got {raw!r}") from None
    return int(value) if value > 1 and value.is_integer() else value


@bp.get("/baselines")
def baselines() -> Response:
    """Every task that has runs or a baseline, with who built the baseline and when."""
    return jsonify({"baselines": clean(list_baselines(get_registry()))})


@bp.get("/baselines/<path:task>")
def baseline(task: str) -> Response:
    """A task's health baseline: per metric the early, mid and late bands and the warning signal."""
    reg = get_registry()
    profile, meta = require_baseline(reg, task)
    return jsonify(clean({**profile.to_dict(), **meta, "history": baseline_history(reg, task)}))


@bp.route("/<path:anything>")
def not_found(anything: str) -> Response:
    abort(404, f"no API endpoint /api/{anything}")
