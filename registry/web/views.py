"""Pages: the runs table, a run's dashboard, the comparison of several runs, and health baselines.

Write views (building a task's baseline, editing one metric's bands) are plain Flask-WTF
form views (CSRF token required); each is one function, so a login guard is one decorator
line on it.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from flask import Blueprint, current_app, render_template, request, url_for

from registry.dictionary.definitions import healthy_range_for
from registry.core.errors import FilterSyntaxError, InputError, LimitExceededError
from registry.store.filters import ORDERABLE
from registry.analysis.health import findings_for_runs
from registry.core.run_fields import RUN_STATUSES, VERDICTS
from registry.dictionary.provenance_text import binding_summary, provenance_caption, provenance_lines
from registry.core.semantics import LAYERS, QUANTITIES
from registry.web.context import get_registry
from registry.web import panels, queries
from registry.web.curves import MAX_COMPARE_RUNS, NORMALIZATION_LABELS, SmoothOptions, describe_semantics
from registry.web.compare_curves import CompareOptions, build_units, compare_metrics, hyperparameter_diff
from registry.web.smoothing import METHOD_LABELS, describe
from registry.store.table_columns import pick_metric_columns, pick_param_columns
from registry.web.runs_views import known_metrics, known_params
from registry.web.run_columns import MetricColumn, metric_summaries
from registry.web.iplot import COUNTER_HINTS, COUNTER_PREFIX
from registry.web.vendor import inline_style_guards, plotly_available
from registry.web.plots import span_memo

bp = Blueprint("ui", __name__)

MAX_PAGE_SIZE = 500
SORT_COLUMNS = ("name", "project", "algorithm", "framework", "task", "verdict", "status", "created_at")


def _page_args() -> tuple[int, int]:
    from flask import current_app

    default_size = int(current_app.config.get("RUNS_PAGE_SIZE", 50))
    try:
        page = max(1, int(request.args.get("page", 1)))
        size = max(1, min(MAX_PAGE_SIZE, int(request.args.get("size", default_size))))
    except ValueError:
        raise InputError("page and size must be whole numbers") from None
    max_page = current_app.config["LIMITS"].max_page
    if page > max_page:
        raise LimitExceededError(f"page {str(page)[:30]} is beyond the last possible page ({max_page}, RLREG_MAX_PAGE)")
    return page, size


def _csv_arg(name: str) -> list[str] | None:
    """Comma-separated values of a query argument; repeated arguments (the column picker's
    checkboxes) add up. None when the argument is absent."""
    raws = request.args.getlist(name)
    if not raws:
        return None
    return list(dict.fromkeys(p.strip() for raw in raws for p in raw.split(",") if p.strip()))


def column_choices(reg: Any, rows: Sequence[Mapping[str, Any]], defs: Mapping[str, Any]) -> dict[str, list[str]]:
    """What the column picker offers: every hyperparameter and every mapped metric of the registry."""
    return {"params": known_params(reg), "metrics": [m for m in known_metrics(reg) if m in defs]}


def health(value: float | None, definition: Mapping[str, Any] | None, task: str | None) -> str | None:
    """``ok`` / ``low`` / ``high`` against the healthy range, None when there is no range or value."""
    if value is None or definition is None or not math.isfinite(value):
        return None
    low, high = healthy_range_for(definition, task)
    return health_in(value, low, high)


def health_in(value: float | None, low: float | None, high: float | None) -> str | None:
    """``ok`` / ``low`` / ``high`` against (low, high), None when there is no range or value."""
    if value is None or not math.isfinite(value) or (low is None and high is None):
        return None
    if low is not None and value < low:
        return "low"
    if high is not None and value > high:
        return "high"
    return "ok"


@bp.get("/")
@bp.get("/runs")
def runs():
    """The runs table: filter expression, quick filters, sortable columns, pagination, selection."""
    reg = get_registry()
    q = (request.args.get("q") or "").strip()
    quick = {f: (request.args.get(f) or "").strip() or None for f in ("project", "verdict", "status", "tag")}
    order = request.args.get("order") or "-created_at"
    page, size = _page_args()
    error = None
    error_column = None
    status_code = 200
    rows: list[dict[str, Any]] = []
    total = 0
    try:
        rows, total = reg.list_runs(where=q or None, order_by=order, limit=size, offset=(page - 1) * size, **quick)
    except FilterSyntaxError as exc:
        error, status_code = str(exc), 400
        if exc.column and exc.expression == q and 0 < exc.column <= len(q) + 1:
            error_column = exc.column
    except InputError as exc:
        error, status_code = str(exc), 400
    ids = [r["id"] for r in rows]
    last = queries.last_values(reg, ids)
    defs = queries.definition_summaries(reg)
    metric_cols = _csv_arg("metrics")
    if metric_cols is None:
        metric_cols = pick_metric_columns(last, defs)
    param_cols = _csv_arg("params")
    if param_cols is None:
        param_cols = pick_param_columns(rows)

    try:
        metric_columns = [MetricColumn.parse(m) for m in metric_cols]
    except InputError as exc:
        error, status_code, metric_columns = str(exc), 400, []
    summaries = metric_summaries(reg, ids, [c for c in metric_columns if c.stat != "last"])
    for r in rows:
        per = last.get(r["id"], {})
        r["metric_cells"] = []
        for col in metric_columns:
            cell = per.get(col.name)
            value = (cell["value"] if cell else None) if col.stat == "last" else summaries[r["id"]].get(col.spec)
            # Only a last value is judged against the healthy range (it describes the run's end).
            r["metric_cells"].append({"value": value, "health": health(value, defs.get(col.name), r.get("task"))
                                      if col.stat == "last" else None})
    findings = findings_for_runs(
        reg, rows, refresh=int(current_app.config.get("FINDINGS_REFRESH_PER_REQUEST", 3)),
        budget_s=float(current_app.config.get("FINDINGS_REFRESH_BUDGET_MS", 60)) / 1000.0)
    for r in rows:
        r["findings"] = findings_cell(findings.get(r["id"]), r)
    pages = max(1, math.ceil(total / size))
    return render_template(
        "runs.html", rows=rows, total=total, page=page, pages=pages, size=size, q=q, quick=quick, order=order,
        error=error, error_column=error_column, metric_cols=metric_cols, param_cols=param_cols, defs=defs,
        metric_columns=metric_columns, picker=column_choices(reg, rows, defs),
        projects=queries.distinct_values(reg, "project"), verdicts=VERDICTS, statuses=RUN_STATUSES,
        sort_columns=SORT_COLUMNS, orderable=set(ORDERABLE), first=(page - 1) * size + 1 if total else 0,
        last_index=min(total, page * size), metric_names=sorted(defs),
    ), status_code


def findings_cell(found: Any, run: Mapping[str, Any]) -> dict[str, Any]:
    """What the runs table's Findings column shows for one run (``health.StoredFindings``)."""
    if found is None or found.state == "missing":
        return {"state": "missing", "label": "not yet diagnosed", "title": "This run has not been diagnosed yet; "
                "opening its dashboard diagnoses it (the table diagnoses a few runs per page view)."}
    if found.state == "error":
        return {"state": "error", "label": "diagnosis failed", "title": found.error or ""}
    n = found.n_problems
    lines = found.lines
    if n:
        parts = [f"{c} {sev}" for c, sev in ((found.n_critical, "critical"), (found.n_warning, "warning")) if c]
        head = f"{n} problem{'s' if n != 1 else ''} ({', '.join(parts)})"
        severity, label = found.worst_severity, f"{found.worst_severity} \u00b7 {n}"
    elif not (found.summary.get("metrics_checked") or 0):
        head, severity, label = "no mapped metrics to diagnose", "none", "no metrics"
    else:
        head = "no problems found" + (f" ({found.n_info} informational)" if found.n_info else "")
        severity, label = "ok", "ok"
    stale = found.state == "stale"
    if stale:
        why = ("new points or an outcome arrived since" if found.data_version != run.get("data_version")
               else "the dictionary or the task baseline changed since")
        head = f"as diagnosed earlier ({why}; open the run for the current diagnosis): " + head
    return {"state": found.state, "severity": severity, "label": label, "count": n, "stale": stale,
            "title": "\n".join([head, *lines])}


def _quantity_rank(definition: Mapping[str, Any] | None) -> int:
    q = (definition or {}).get("quantity")
    return QUANTITIES.index(q) if q in QUANTITIES else len(QUANTITIES)


def card_range(run: Mapping[str, Any], definition: Mapping[str, Any] | None,
               ranges: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The healthy range a card draws: the one the run's diagnosis resolved for the metric
    (``ranges``, from its summary: dictionary, task range, baseline or diagnosis default, with the
    source), or the dictionary's alone when no diagnosis could be made (``ranges`` None)."""
    if definition is None:
        return None
    if ranges is not None:
        r = ranges.get(definition["name"])
        return dict(r) if r else None
    low, high = healthy_range_for(definition, run.get("task"))
    if low is None and high is None:
        return None
    return {"low": low, "high": high, "source": "dictionary (the run's diagnosis failed: only the dictionary's "
                                                "range is known)"}


def plot_card(run: Mapping[str, Any], series: Mapping[str, Any], definition: Mapping[str, Any] | None,
              opts: SmoothOptions, ranges: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything a dashboard plot card shows about one series (``ranges``: see :func:`card_range`)."""
    sign = series.get("sign") or 1.0
    last = series.get("last")
    value = None if last is None else last * sign
    semantics = series.get("semantics") or {}
    caption = describe_semantics(semantics) if definition else "unmapped: raw values as logged"
    window = opts.window_for(definition, series.get("count"))
    resolved = card_range(run, definition, ranges)
    low, high = (resolved["low"], resolved["high"]) if resolved else (None, None)
    params = {"key": series["key"], **opts.query()}
    sem_title = "; ".join(
        f"{label}: {semantics.get(f) or 'unspecified'}" for f, label in (
            ("quantity", "quantity"), ("kl_estimator", "KL estimator"), ("averaging", "averaging"),
            ("normalization_axis", "normalization axis"), ("logging_point", "logging point"))
    ) if definition else "no definition: this key is not in the metric dictionary"
    return {
        "key": series["key"],
        "name": series.get("definition"),
        "title": (definition or {}).get("display_name") or series["key"],
        "definition": definition,
        "semantics": semantics,
        "caption": caption,
        "tooltip": sem_title + f"; smoothing: {describe(opts.method, window)}"
                   + (f"; canonical = raw x {sign:g}" if sign != 1.0 else ""),
        "sign": sign,
        "value": value,
        "count": series.get("count"),
        "nonfinite": (series.get("nan_count") or 0) + (series.get("inf_count") or 0),
        "last_step": series.get("last_step"),
        "healthy": (low, high),
        "healthy_source": resolved.get("source") if resolved else None,
        "healthy_used": bool(resolved and resolved.get("used")),
        "health": health_in(value, low, high) if definition else None,
        "img": url_for("plots.run_plot", ref=run["id"]) + "?" + _q(params),
        "svg": url_for("plots.run_plot", ref=run["id"]) + "?" + _q({**params, "format": "svg"}),
        "csv": url_for("plots.run_data", ref=run["id"], fmt="csv") + "?" + _q(params),
        "json": url_for("plots.run_data", ref=run["id"], fmt="json") + "?" + _q(params),
        "window": window,
        "overridden": sorted((series.get("overrides") or {}).keys()),
        "alias_framework": series.get("alias_framework"),
        "provenance": provenance_caption(series.get("provenance")),
        "provenance_lines": provenance_lines(series.get("provenance")),
        "guessed": (series.get("provenance") or {}).get("how") == "guessed",
        "labels": dict(series.get("labels") or {}),
    }


def _semantics_with_origin(members: list[Any]) -> str:
    """A semantic group's caption, with where its non-default fields came from
    (``from config: kl_loss_type=low_var_kl``) and any guessed binding, per run when they differ."""
    text = describe_semantics(members[0].series.get("semantics"))
    origins = {m.run["name"]: provenance_caption(m.series.get("provenance")) for m in members}
    distinct = {o for o in origins.values() if o}
    if len(distinct) == 1 and all(origins.values()):
        text += f" ({distinct.pop()})"
    elif distinct:
        text += " (" + "; ".join(f"{name}: {o}" for name, o in origins.items() if o) + ")"
    return text


def _q(params: Mapping[str, Any]) -> str:
    from urllib.parse import urlencode

    items = []
    for k, v in params.items():
        if isinstance(v, (list, tuple)):
            items += [(k, x) for x in v]
        elif v is not None and v != "":
            items.append((k, v))
    return urlencode(items)


@bp.get("/runs/<ref>")
def run_dashboard(ref: str):
    """A run's dashboard: objective, constraint, diagnostic layers; hyperparameters; outcome."""
    reg = get_registry()
    run = reg.run_detail(ref)
    opts = SmoothOptions.from_args(request.args)
    names = sorted({s["definition"] for s in run["series"] if s.get("definition")})
    defs = queries.definition_summaries(reg, names)
    current_app.extensions["rlregistry.refs"].put(queries.refs_from_detail(run, defs))
    layers: dict[str, list[dict[str, Any]]] = {layer: [] for layer in LAYERS}
    unmapped = []
    # The diagnosis first: the cards draw the ranges it judged by.
    diagnosis = panels.diagnosis_panel(reg, run)
    ranges = diagnosis.get("ranges") if isinstance(diagnosis, Mapping) else None
    for s in run["series"]:
        definition = defs.get(s["definition"]) if s.get("definition") else None
        card = plot_card(run, s, definition, opts, ranges)
        if definition is None:
            unmapped.append(card)
        else:
            layers.setdefault(definition["layer"], []).append(card)
    for cards in layers.values():
        cards.sort(key=lambda c: (_quantity_rank(c["definition"]), c["name"] or "", c["key"]))
    unmapped.sort(key=lambda c: c["key"])
    marks = diagnosis.get("severity_by_metric", {}) if isinstance(diagnosis, Mapping) else {}
    if isinstance(diagnosis, Mapping) and "spans" in diagnosis:
        span_memo().put(run["id"], run["data_version"], diagnosis["spans"], ranges)
    _anchor_cards(layers, run, marks)
    flagged = [c for cards in layers.values() for c in cards if c["health"] in ("low", "high")]
    in_range = sum(1 for cards in layers.values() for c in cards if c["health"] == "ok")
    nonfinite = [c for cards in (*layers.values(), unmapped) for c in cards if c["nonfinite"]]
    interactive = interactive_plots(run, [c for cards in (*layers.values(), unmapped) for c in cards], diagnosis)
    return render_template(
        "run.html", run=run, layers=layers, unmapped=unmapped, opts=opts, flagged=flagged, in_range=in_range,
        nonfinite=nonfinite, methods=METHOD_LABELS, interactive=interactive,
        binding_lines=[line for line in binding_summary(run.get("binding")) if not line.startswith("WARNING: ")],
        binding_warnings=list((run.get("binding") or {}).get("warnings") or []),
        guessed=[s["key"] for s in run["series"] if (s.get("provenance") or {}).get("how") == "guessed"],
        diagnosis=diagnosis, similar=panels.similar_panel(reg, run),
        compare_with=[run["id"]], open_diagnostic=any(c.get("mark") for c in layers.get("diagnostic", [])),
        sim_args={k: v for k, v in request.args.items() if k.startswith("sim_") or k == "sim"},
    )


def interactive_plots(run: Mapping[str, Any], cards: Sequence[dict[str, Any]], diagnosis: Any) -> dict[str, Any] | None:
    """Turn the dashboard's cards into interactive plots (``?plots=static``: the PNGs only).

    Each card gets what ``iplots.js`` needs (its API URL, unit, findings spans); the page gets
    the x-axes this run offers and, for a running run, what its live status polls.
    """
    if request.args.get("plots") == "static" or not plotly_available():
        return None
    spans = diagnosis.get("spans", {}) if isinstance(diagnosis, Mapping) else {}
    api = url_for("plot_api.run_plot_view", ref=run["id"])
    for c in cards:
        c["iplot"] = {"api": api, "unit": (c.get("definition") or {}).get("unit") or "",
                      "spans": [list(s) for s in spans.get(c.get("name"), [])] if c.get("name") else []}
    x_axes = [("step", "step"), ("fraction", "fraction of training"), ("wall", "wall time")]
    for s in run.get("series") or []:
        # A counter never decreases: its first value is its minimum and its last its maximum (the
        # server checks every point when it is chosen).
        key = s["key"]
        if (s.get("count") or 0) >= 2 and any(h in key.lower() for h in COUNTER_HINTS) and s.get("min") is not None \
                and s.get("first") == s.get("min") and s.get("last") == s.get("max") and s.get("max") > s.get("min"):
            x_axes.append((COUNTER_PREFIX + key, key))
    live = None
    if run.get("status") == "running":
        live = {"stamp_url": url_for("plot_api.run_stamp", ref=run["id"]), "version": run.get("data_version"),
                "updated": run.get("updated_at") or "", "poll_ms": int(current_app.config.get("LIVE_POLL_MS", 5000))}
    window_defaults = [c["window"] for c in cards] or [10]
    return {"x_axes": x_axes, "live": live, "style_guards": inline_style_guards(), "slider_max": max(200, max(window_defaults) * 4),
            "default_window": window_defaults[0],
            "static_url": url_for("ui.run_dashboard", ref=run["id"]) + "?" + _q({**request.args.to_dict(),
                                                                              "plots": "static"})}


def _anchor_cards(layers: Mapping[str, list[dict[str, Any]]], run: Mapping[str, Any],
                  marks: Mapping[str, Mapping[str, Any]]) -> None:
    """Give each metric's card the anchor findings link to, and its findings' severity.

    When two raw keys bind to one definition, the anchor goes to the one with more points
    (the series diagnosis reads, as ``Registry.canonical_curves`` does).
    """
    counts = {}
    for s in run.get("series") or []:
        name = s.get("definition")
        if name and (s.get("count") or 0) > counts.get(name, (-1, ""))[0]:
            counts[name] = (s.get("count") or 0, s["key"])
    i = 0
    for cards in layers.values():
        for c in cards:
            i += 1
            name = c.get("name")
            primary = name is not None and counts.get(name, (0, None))[1] == c["key"]
            c["anchor"] = panels.metric_anchor(name) if primary else f"plot-{i}-{name}"
            c["mark"] = marks.get(name) if name else None


def _selected_runs() -> list[str]:
    ids: list[str] = []
    for value in request.args.getlist("run"):
        ids += [p.strip() for p in value.split(",") if p.strip()]
    return list(dict.fromkeys(ids))


@bp.get("/compare")
def compare():
    """Several runs overlaid per canonical metric, with semantic checks and a hyperparameter diff."""
    reg = get_registry()
    refs = _selected_runs()
    if len(refs) > MAX_COMPARE_RUNS:
        raise InputError(f"compare at most {MAX_COMPARE_RUNS} runs at once; {len(refs)} were selected")
    copts = CompareOptions.from_args(request.args)
    sopts = SmoothOptions.from_args(request.args)
    details = [reg.run_detail(r) for r in refs]
    details = list({d["id"]: d for d in details}.values())
    names = sorted({s["definition"] for d in details for s in d["series"] if s.get("definition")})
    defs = queries.definition_summaries(reg, names)
    units = build_units(details, copts.group)
    unit_of = {r["id"]: u for u in units for r in u.runs}
    comps = compare_metrics(details, defs)
    run_ids = [d["id"] for d in details]
    base = {"run": run_ids, **copts.query(), **sopts.query()}
    sections: dict[str, list[dict[str, Any]]] = {layer: [] for layer in LAYERS}
    for comp in comps:
        params = {**base, "metric": comp.name}
        plots = [{"label": "as logged", "img": url_for("plots.compare_plot") + "?" + _q(params),
                  "api": url_for("plot_api.compare_plot_view") + "?" + _q(params),
                  "svg": url_for("plots.compare_plot") + "?" + _q({**params, "format": "svg"}),
                  "csv": url_for("plots.compare_data", fmt="csv") + "?" + _q(params),
                  "json": url_for("plots.compare_data", fmt="json") + "?" + _q(params)}]
        if comp.normalizable:
            nparams = {**params, "normalized": "1"}
            plots.append({"label": f"normalized ({NORMALIZATION_LABELS[copts.norm]})",
                          "img": url_for("plots.compare_plot") + "?" + _q(nparams),
                          "api": url_for("plot_api.compare_plot_view") + "?" + _q(nparams),
                          "svg": url_for("plots.compare_plot") + "?" + _q({**nparams, "format": "svg"}),
                          "csv": url_for("plots.compare_data", fmt="csv") + "?" + _q(nparams),
                          "json": url_for("plots.compare_data", fmt="json") + "?" + _q(nparams)})
        sections.setdefault(comp.layer, []).append({
            "comp": comp, "plots": plots, "definition": comp.definition,
            "semantics": [(_semantics_with_origin(sem_members), [m.run["name"] for m in sem_members])
                          for _, sem_members in comp.semantic_groups],
        })
    diff_rows, same_keys = hyperparameter_diff(details) if len(details) > 1 else ([], [])
    warnings = [(c.name, w) for c in comps for w in c.warnings]
    return render_template(
        "compare.html", runs=details, units=units, unit_of=unit_of, sections=sections, copts=copts, sopts=sopts,
        diff_rows=diff_rows, same_keys=same_keys, warnings=warnings, methods=METHOD_LABELS,
        normalizations=NORMALIZATION_LABELS, run_ids=run_ids, interactive=compare_interactive(),
    )


def compare_interactive() -> dict[str, Any] | None:
    """The compare page's plots drawn by plotly (``?plots=static``: the PNGs only)."""
    if request.args.get("plots") == "static" or not plotly_available():
        return None
    return {"style_guards": inline_style_guards(),
            "static_url": url_for("ui.compare") + "?" + _q({**request.args.to_dict(flat=False), "plots": "static"})}
