"""Rendered plots (PNG, or SVG with ``?format=svg``) and the data behind each plot (CSV, JSON).

Every image is cached under a content key: the runs' ids and ``data_version``, the
metric, the current version of its definition (healthy range and smoothing default come
from there), and every display option. The key's digest is the ETag, so a browser that
already has the image gets ``304 Not Modified`` before anything is read or drawn.

A run's plot also shades the step ranges of the diagnosis' findings on that metric
(warning amber, critical red); the spans are part of its key, so a new diagnosis (new
points, a dictionary edit, a rebuilt baseline) is a new picture. The dashboard hands the
spans it just read to the image requests that follow (:class:`SpanMemo`).
"""
from __future__ import annotations

import csv
import io
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
from flask import Blueprint, Response, abort, current_app, request

from registry.core.errors import InputError, NotFoundError
from registry.web.context import get_plot_cache, get_registry
from registry.web import queries
from registry.web.cache import digest
from registry.web.curves import MAX_COMPARE_RUNS, SmoothOptions, export_rows, prepare, run_plot_spec
from registry.web.compare_curves import CompareOptions, build_units, compare_metrics, overlay_spec
from registry.web.plotting import FORMATS, render
from registry.web.smoothing import describe
from registry.dictionary.definitions import healthy_range_for
from registry.analysis.health import current_findings

bp = Blueprint("plots", __name__, url_prefix="/plots")

# Bump when rendering changes, so persistent (disk) caches do not serve old pictures.
RENDER_VERSION = 5


def _format() -> str:
    fmt = (request.args.get("format") or "png").lower()
    if fmt not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return fmt


def _conditional(tag: str, mimetype: str, make: Callable[[], bytes], cache: bool = True) -> Response:
    """304 when the client has this version, else the (cached) bytes with an ETag."""
    if request.if_none_match.contains(tag):
        response = Response(status=304)
    else:
        if cache:
            data, hit = get_plot_cache().get_or_create(tag, make)
        else:
            data, hit = make(), False
        response = Response(data, mimetype=mimetype)
        response.headers["X-Plot-Cache"] = "hit" if hit else "miss"
    response.set_etag(tag)
    if mimetype == FORMATS["svg"]:
        # Opened on its own, an SVG is a document: allow matplotlib's inline <style>, nothing else.
        response.headers["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
    # The URL does not change when the run gets new points: always revalidate (cheap, see above).
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def _required(name: str) -> str:
    value = request.args.get(name)
    if not value:
        raise InputError(f"query parameter {name!r} is required")
    return value


# --- one run -----------------------------------------------------------------------


def _run_key(sref: queries.SeriesRef, opts: SmoothOptions, what: str) -> tuple:
    return (what, RENDER_VERSION, sref.run_id, sref.data_version, sref.key, sref.definition_name,
            sref.definition_version, sref.task, opts.key())


Span = tuple[int, int, str, str]  # start step, end step, severity, detector


class SpanMemo:
    """Findings spans and healthy ranges per metric of the runs the dashboard just showed, for a
    couple of seconds (both come from the run's current diagnosis)."""

    def __init__(self, ttl: float = 2.0, max_entries: int = 1024):
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, int, DiagnosisMarks]] = {}
        self._lock = threading.Lock()

    def put(self, run_id: str, data_version: int, spans: dict[str, list[Span]],
            ranges: dict[str, dict[str, Any]] | None = None) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[run_id] = (time.monotonic(), data_version, DiagnosisMarks(spans, ranges))

    def get(self, run_id: str, data_version: int) -> "DiagnosisMarks | None":
        with self._lock:
            hit = self._entries.get(run_id)
        if hit is None or hit[1] != data_version or time.monotonic() - hit[0] >= self.ttl:
            return None
        return hit[2]


class DiagnosisMarks:
    """What a run's plots take from its diagnosis: findings spans and healthy ranges per metric.

    ``ranges`` is None when the diagnosis failed (the plot then draws the dictionary's range)."""

    def __init__(self, spans: dict[str, list[Span]], ranges: dict[str, dict[str, Any]] | None):
        self.spans = spans
        self.ranges = ranges

    def spans_of(self, metric: str | None) -> list[Span]:
        return [tuple(s) for s in self.spans.get(metric, [])] if metric else []  # type: ignore[misc]

    def range_of(self, metric: str | None) -> dict[str, Any] | None:
        if metric is None or self.ranges is None:
            return None
        return self.ranges.get(metric)


def span_memo() -> SpanMemo:
    memo = current_app.extensions.get("rlregistry.spans")
    if memo is None:
        memo = current_app.extensions.setdefault(
            "rlregistry.spans", SpanMemo(ttl=float(current_app.config.get("PLOT_REF_TTL", 2.0))))
    return memo


def diagnosis_marks(reg: Any, sref: queries.SeriesRef) -> DiagnosisMarks:
    """The run's current diagnosis' spans and ranges (memoised for the dashboard's image requests)."""
    if sref.definition_name is None:
        return DiagnosisMarks({}, {})  # unmapped keys are not diagnosed and have no range
    memo = span_memo()
    marks = memo.get(sref.run_id, sref.data_version)
    if marks is None:
        try:
            found = current_findings(reg, sref.run_id, data_version=sref.data_version, task=sref.task)
        except Exception:  # noqa: BLE001 - the plot is still worth drawing without its findings
            current_app.logger.exception("diagnosis of run %s failed; plot drawn without findings", sref.run_id)
            return DiagnosisMarks({}, None)
        spans = {m: [tuple(s) for s in v] for m, v in (found.summary.get("spans") or {}).items()}
        ranges = dict(found.summary.get("ranges") or {})
        memo.put(sref.run_id, sref.data_version, spans, ranges)  # type: ignore[arg-type]
        marks = DiagnosisMarks(spans, ranges)  # type: ignore[arg-type]
    return marks


def finding_spans(reg: Any, sref: queries.SeriesRef) -> list[Span]:
    """The diagnosis' warning and critical findings on this series' metric (its current diagnosis)."""
    return diagnosis_marks(reg, sref).spans_of(sref.definition_name)


def plot_range(reg: Any, sref: queries.SeriesRef, marks: DiagnosisMarks) -> dict[str, Any] | None:
    """The healthy range a run's plot of ``sref`` draws: the one its diagnosis judged by (with its
    source), or the dictionary's when the diagnosis failed."""
    if sref.definition_name is None:
        return None
    if marks.ranges is not None:
        return marks.range_of(sref.definition_name)
    definition = sref.definition(reg)
    low, high = healthy_range_for(definition, sref.task) if definition else (None, None)
    if low is None and high is None:
        return None
    return {"low": low, "high": high, "source": "dictionary (the run's diagnosis failed)"}


def _spans_key(spans: Sequence[Span]) -> str:
    return digest(tuple(tuple(s) for s in spans)) if spans else ""


@bp.get("/run/<ref>")
def run_plot(ref: str) -> Response:
    """One series of one run: raw points light, smoothed line dark, healthy band, findings shaded."""
    key = _required("key")
    opts = SmoothOptions.from_args(request.args)
    fmt = _format()
    reg = get_registry()
    sref = current_app.extensions["rlregistry.refs"].get(ref, key) or queries.series_ref(reg, ref, key)
    marks = diagnosis_marks(reg, sref)
    spans = marks.spans_of(sref.definition_name)
    healthy = plot_range(reg, sref, marks)

    def make() -> bytes:
        data = reg.read_series(sref.run_id, sref.key)
        spec, _ = run_plot_spec(data, sign=sref.sign, definition=sref.definition(reg), task=sref.task, opts=opts,
                                healthy=healthy)
        spec.spans = [(float(a), float(b), sev, det) for a, b, sev, det in spans]
        return render(spec, fmt)

    key_parts = (fmt, _spans_key(spans), digest(tuple(sorted((healthy or {}).items()))))
    return _conditional(digest(_run_key(sref, opts, "run-plot") + key_parts), FORMATS[fmt], make)


@bp.get("/run/<ref>/data.<fmt>")
def run_data(ref: str, fmt: str) -> Response:
    """The plotted series at full resolution: step, value (canonical sign), smoothed."""
    if fmt not in ("csv", "json"):
        abort(404)
    key = _required("key")
    opts = SmoothOptions.from_args(request.args)
    reg = get_registry()
    sref = queries.series_ref(reg, ref, key)

    def make() -> bytes:
        data = reg.read_series(sref.run_id, sref.key)
        window = opts.window_for(sref.definition(reg), len(data.steps))
        p = prepare(data, sref.sign, opts.method, window)
        rows = export_rows(p)
        if fmt == "csv":
            return _csv(["step", "value", "smoothed"], [rows["step"], rows["value"], rows["smoothed"]])
        meta = {
            "run_id": sref.run_id, "run": sref.run_name, "key": sref.key,
            "definition": sref.definition_name, "sign": sref.sign,
            "semantics": sref.semantics, "smoothing": {"method": opts.method, "window": window,
                                                     "description": describe(opts.method, window)},
            "count": len(rows["step"]), **rows,
        }
        return _json_bytes(meta)

    mimetype = "text/csv" if fmt == "csv" else "application/json"
    response = _conditional(digest(_run_key(sref, opts, "run-data-" + fmt)), mimetype, make, cache=False)
    _attachment(response, f"{sref.run_name}-{sref.key}.{fmt}")
    return response


# --- comparisons -------------------------------------------------------------------


def compare_request() -> tuple[list[str], str, bool, CompareOptions, SmoothOptions]:
    ids: list[str] = []
    for value in request.args.getlist("run"):
        ids += [p.strip() for p in value.split(",") if p.strip()]
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise InputError("give the runs to compare as run=ID (repeat for several)")
    if len(ids) > MAX_COMPARE_RUNS:
        raise InputError(f"compare at most {MAX_COMPARE_RUNS} runs at once")
    normalized = (request.args.get("normalized") or "") in ("1", "true", "on")
    return ids, _required("metric"), normalized, CompareOptions.from_args(request.args), \
        SmoothOptions.from_args(request.args)


def compare_key(ids: list[str], metric: str, normalized: bool, copts: CompareOptions, sopts: SmoothOptions,
                 what: str) -> tuple:
    reg = get_registry()
    stamps = queries.run_stamps(reg, ids)
    resolved = []
    for ref in ids:
        if ref not in stamps:  # a name or id prefix: resolve it (404 when unknown)
            detail = reg.run_detail(ref)
            stamps[detail["id"]] = detail["data_version"]
            ref = detail["id"]
        resolved.append((ref, stamps[ref]))
    versions = queries.definition_versions(reg, [metric])
    return (what, RENDER_VERSION, tuple(resolved), metric, versions.get(metric), normalized, copts.key(),
            sopts.key())


def build_overlay(ids: list[str], metric: str, normalized: bool, copts: CompareOptions, sopts: SmoothOptions,
                  x_range: tuple[float, float] | None = None):
    """The overlay spec of ``metric`` over the runs ``ids`` (and its export table), optionally cut to ``x_range``."""
    reg = get_registry()
    details = list({d["id"]: d for d in (reg.run_detail(r) for r in ids)}.values())
    defs = queries.definition_summaries(reg, [metric])
    comps = [c for c in compare_metrics(details, defs) if c.name == metric]
    if not comps:
        raise NotFoundError(f"none of the selected runs has the metric {metric!r}")
    comp = comps[0]
    units = build_units(details, copts.group)
    data = {m.run["id"]: reg.read_series(m.run["id"], m.series["key"]) for m in comp.members}
    return overlay_spec(comp, data, units, copts, sopts, normalized=normalized, x_range=x_range)


@bp.get("/compare")
def compare_plot() -> Response:
    """One canonical metric of several runs overlaid; semantic differences drawn as a warning."""
    ids, metric, normalized, copts, sopts = compare_request()
    fmt = _format()
    key = compare_key(ids, metric, normalized, copts, sopts, "compare-plot") + (fmt,)

    def make() -> bytes:
        spec, _ = build_overlay(ids, metric, normalized, copts, sopts)
        return render(spec, fmt)

    return _conditional(digest(key), FORMATS[fmt], make)


@bp.get("/compare/data.<fmt>")
def compare_data(fmt: str) -> Response:
    """The overlay's data at full resolution, one row per run and point."""
    if fmt not in ("csv", "json"):
        abort(404)
    ids, metric, normalized, copts, sopts = compare_request()
    key = compare_key(ids, metric, normalized, copts, sopts, "compare-data-" + fmt)

    def make() -> bytes:
        spec, export = build_overlay(ids, metric, normalized, copts, sopts)
        columns = ["run_id", "run", "step", "x", "value", "smoothed"]
        if fmt == "csv":
            return _csv(columns, [export[c] for c in columns])
        return _json_bytes({"metric": metric, "normalized": normalized, "align": copts.align,
                            "warnings": spec.warnings, "rows": len(export["step"]), **export})

    response = _conditional(digest(key), "text/csv" if fmt == "csv" else "application/json", make, cache=False)
    _attachment(response, f"compare-{metric}.{fmt}")
    return response


# --- helpers -----------------------------------------------------------------------


def _csv(header: list[str], columns: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(zip(*columns))
    return buf.getvalue().encode("utf-8")


def _json_bytes(payload: dict[str, Any]) -> bytes:
    import json

    return json.dumps(payload, allow_nan=False, default=_json_default).encode("utf-8")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _attachment(response: Response, filename: str) -> None:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in filename)[:150]
    response.headers["Content-Disposition"] = f'attachment; filename="{safe}"'
