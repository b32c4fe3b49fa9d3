"""Pages: the runs table, a run's dashboard, the comparison of several runs, and health baselines.

Write views (building a task's baseline, editing one metric's bands) are plain Flask-WTF
form views (CSRF token required); each is one function, so a login guard is one decorator
line on it.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Sequence

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask_wtf import FlaskForm
from wtforms import BooleanField, FloatField, SelectMultipleField, StringField, TextAreaField, widgets
from wtforms.validators import Length, Optional, ValidationError

from registry.dictionary import healthy_range_for
from registry.errors import FilterSyntaxError, InputError, LimitExceededError, NotFoundError
from registry.filters import ORDERABLE
from registry.health import findings_for_runs
from registry.models import RUN_STATUSES, VERDICTS
from registry.binding import binding_summary, provenance_caption, provenance_lines
from registry.semantics import LAYERS, QUANTITIES
from registry.web import get_registry, panels, queries
from registry.web.security import admin_access_required
from registry.web.curves import (
    MAX_COMPARE_RUNS,
    NORMALIZATION_LABELS,
    CompareOptions,
    SmoothOptions,
    build_units,
    compare_metrics,
    describe_semantics,
    hyperparameter_diff,
)
from registry.web.smoothing import METHOD_LABELS, describe

bp = Blueprint("ui", __name__)

MAX_PAGE_SIZE = 500
KEY_PARAM_HINTS = (
    "learning_rate", "lr", "actor_lr", "kl_coef", "kl_loss_coef", "init_kl_coef", "beta", "clip_range",
    "clip_ratio", "cliprange", "ent_coef", "entropy_coeff", "batch_size", "train_batch_size", "n_steps",
    "n_epochs", "ppo_epochs", "rollout_n", "n", "num_generations", "gamma", "gae_lambda", "seed",
)
# Which metric of a kind makes the best column, when runs have several.
PREFERRED_METRICS = (
    "reward_sequence_mean", "episode_return_mean", "reward_total_mean", "return_mean", "eval_reward_mean",
    "success_rate", "kl_ref_mean", "kl_old_mean", "entropy", "clip_fraction",
)
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
    raw = request.args.get(name)
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def pick_param_columns(rows: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """Hyperparameters worth a column: those that vary on this page, well-known ones first."""
    counts = Counter(k for r in rows for k in r["params"])
    if not counts:
        return []

    def varies(key: str) -> bool:
        return len({repr(r["params"].get(key, "<missing>")) for r in rows}) > 1

    def hint(key: str) -> int:
        last = key.rsplit(".", 1)[-1].lower()
        return KEY_PARAM_HINTS.index(last) if last in KEY_PARAM_HINTS else len(KEY_PARAM_HINTS)

    ranked = sorted(counts, key=lambda k: (not varies(k), hint(k), -counts[k], k))
    chosen = [k for k in ranked if varies(k) or hint(k) < len(KEY_PARAM_HINTS)]
    return chosen[:limit]


def pick_metric_columns(last: Mapping[str, Mapping[str, Any]], defs: Mapping[str, Mapping[str, Any]],
                        limit: int = 4) -> list[str]:
    """The metrics most runs on the page have: a reward/return, a KL, the entropy, the clip fraction."""
    counts = Counter(name for per in last.values() for name in per)
    wanted = ((("reward", "return"), 2), (("kl",), 2), (("entropy",), 1), (("clip_fraction",), 1))
    chosen: list[str] = []
    for quantities, most in wanted:
        pool = [n for n in counts if (defs.get(n) or {}).get("quantity") in quantities and n not in chosen]
        if quantities[0] == "reward":
            pool = [n for n in pool if (defs.get(n) or {}).get("layer") == "objective"] or pool
        picked: list[str] = []
        # Greedy cover: the most common one, then one for the runs that lack it (SB3 and verl on one page).
        while pool and len(picked) < most:
            uncovered = [per for per in last.values() if not any(n in per for n in picked)]
            if not uncovered:
                break
            best = max(pool, key=lambda n: (
                sum(n in per for per in uncovered),
                -PREFERRED_METRICS.index(n) if n in PREFERRED_METRICS else -len(PREFERRED_METRICS),
                n.endswith("_mean"), -len(n)))
            if not any(best in per for per in uncovered):
                break
            picked.append(best)
            pool.remove(best)
        chosen += picked
    return chosen[:limit]


def health(value: float | None, definition: Mapping[str, Any] | None, task: str | None) -> str | None:
    """``ok`` / ``low`` / ``high`` against the healthy range, None when there is no range or value."""
    if value is None or definition is None or not math.isfinite(value):
        return None
    low, high = healthy_range_for(definition, task)
    if low is None and high is None:
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
    for r in rows:
        per = last.get(r["id"], {})
        r["metric_cells"] = []
        for name in metric_cols:
            cell = per.get(name)
            value = cell["value"] if cell else None
            r["metric_cells"].append({"value": value, "health": health(value, defs.get(name), r.get("task"))})
    findings = findings_for_runs(
        reg, rows, refresh=int(current_app.config.get("FINDINGS_REFRESH_PER_REQUEST", 3)),
        budget_s=float(current_app.config.get("FINDINGS_REFRESH_BUDGET_MS", 60)) / 1000.0)
    for r in rows:
        r["findings"] = findings_cell(findings.get(r["id"]), r)
    pages = max(1, math.ceil(total / size))
    return render_template(
        "runs.html", rows=rows, total=total, page=page, pages=pages, size=size, q=q, quick=quick, order=order,
        error=error, error_column=error_column, metric_cols=metric_cols, param_cols=param_cols, defs=defs,
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


def plot_card(run: Mapping[str, Any], series: Mapping[str, Any], definition: Mapping[str, Any] | None,
              opts: SmoothOptions) -> dict[str, Any]:
    """Everything a dashboard plot card shows about one series."""
    sign = series.get("sign") or 1.0
    last = series.get("last")
    value = None if last is None else last * sign
    semantics = series.get("semantics") or {}
    caption = describe_semantics(semantics) if definition else "unmapped: raw values as logged"
    window = opts.window_for(definition, series.get("count"))
    low, high = healthy_range_for(definition, run.get("task")) if definition else (None, None)
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
        "health": health(value, definition, run.get("task")),
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
    for s in run["series"]:
        definition = defs.get(s["definition"]) if s.get("definition") else None
        card = plot_card(run, s, definition, opts)
        if definition is None:
            unmapped.append(card)
        else:
            layers.setdefault(definition["layer"], []).append(card)
    for cards in layers.values():
        cards.sort(key=lambda c: (_quantity_rank(c["definition"]), c["name"] or "", c["key"]))
    unmapped.sort(key=lambda c: c["key"])
    diagnosis = panels.diagnosis_panel(reg, run)
    marks = diagnosis.get("severity_by_metric", {}) if isinstance(diagnosis, Mapping) else {}
    if isinstance(diagnosis, Mapping) and "spans" in diagnosis:
        from registry.web.plots import span_memo

        span_memo().put(run["id"], run["data_version"], diagnosis["spans"])
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
    from registry.web.iplot import COUNTER_HINTS, COUNTER_PREFIX
    from registry.web.vendor import inline_style_guards, plotly_available

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
    from registry.web.vendor import inline_style_guards, plotly_available

    if request.args.get("plots") == "static" or not plotly_available():
        return None
    return {"style_guards": inline_style_guards(),
            "static_url": url_for("ui.compare") + "?" + _q({**request.args.to_dict(flat=False), "plots": "static"})}


# --- health baselines --------------------------------------------------------------------

try:  # WTForms >= 3.3 deprecates (value, label) tuples
    from wtforms.fields.choices import SelectChoice
except ImportError:  # pragma: no cover - older WTForms
    SelectChoice = None


def _choice(value: str, label: str) -> Any:
    return SelectChoice(value, label) if SelectChoice is not None else (value, label)


def acting_user() -> str | None:
    """The logged-in user once the app has logins (``registry.web.security``); None until then."""
    try:
        from registry.web.security import current_user
    except ImportError:
        return None
    try:
        return current_user()
    except Exception:  # noqa: BLE001 - no login machinery, no user
        return None


class _Checkboxes(SelectMultipleField):
    widget = widgets.ListWidget(prefix_label=False)
    option_widget = widgets.CheckboxInput()


class BaselineBuildForm(FlaskForm):
    runs = _Checkboxes("Learn from these runs", choices=[], validate_choice=True)
    keep_edits = BooleanField("Keep the bands the team edited by hand", default=True)
    allow_weak = BooleanField("Accept a weak baseline (fewer than 3 healthy runs; labelled so wherever it is used)",
                              default=False)
    author = StringField("Your name", validators=[Optional(), Length(max=200)],
                         description="Recorded with the baseline")
    note = StringField("Why (optional)", validators=[Optional(), Length(max=2000)])

    def validate_runs(self, field: SelectMultipleField) -> None:
        if not field.data:
            raise ValidationError("tick at least one run to learn from")


def _finite(field: FloatField) -> None:
    if field.data is not None and not math.isfinite(field.data):
        raise ValidationError("must be a finite number")


class BandEditForm(FlaskForm):
    early_low = FloatField("Early: low", validators=[Optional()])
    early_high = FloatField("Early: high", validators=[Optional()])
    mid_low = FloatField("Mid: low", validators=[Optional()])
    mid_high = FloatField("Mid: high", validators=[Optional()])
    warning = TextAreaField("Warning signal", validators=[Optional(), Length(max=2000)],
                            description="What it means when a run leaves the band")
    author = StringField("Your name", validators=[Optional(), Length(max=200)],
                         description="Recorded in the baseline's history")
    note = StringField("Why this change", validators=[Optional(), Length(max=2000)])

    def validate(self, extra_validators: Any = None) -> bool:
        ok = super().validate(extra_validators)
        for phase in ("early", "mid"):
            low, high = getattr(self, f"{phase}_low"), getattr(self, f"{phase}_high")
            for f in (low, high):
                try:
                    _finite(f)
                except ValidationError as exc:
                    f.errors = [*f.errors, str(exc)]
                    ok = False
            if (low.data is None) != (high.data is None):
                (low if low.data is None else high).errors = [
                    "give both bounds, or leave both empty to drop this phase's band"]
                ok = False
            elif low.data is not None and high.data is not None and low.data > high.data:
                high.errors = [*high.errors, "must not be below the low bound"]
                ok = False
        return ok

    def band(self, phase: str) -> tuple[float, float] | None:
        low, high = getattr(self, f"{phase}_low").data, getattr(self, f"{phase}_high").data
        return None if low is None or high is None else (float(low), float(high))


def _author(form: FlaskForm) -> str | None:
    return acting_user() or ((form.author.data or "").strip() or None)


def _task_runs(reg: Any, task: str) -> tuple[list[dict[str, Any]], set[str]]:
    from registry.health import _quote, healthy_runs

    rows, _ = reg.list_runs(where=f'task="{_quote(task)}"', order_by="name", limit=500)
    healthy = {r["id"] for r in healthy_runs(reg, task)}
    return rows, healthy


def _build_form(reg: Any, task: str, formdata: Any = None) -> tuple[BaselineBuildForm, list[dict[str, Any]], set[str]]:
    rows, healthy = _task_runs(reg, task)
    current = None
    try:
        from registry.health import require_baseline

        _, meta = require_baseline(reg, task)
        current = set(meta["source_runs"] or [])
    except NotFoundError:
        pass
    form = BaselineBuildForm(formdata=formdata) if formdata is not None else BaselineBuildForm(
        runs=[r["id"] for r in rows if r["id"] in (current if current else healthy)])
    form.runs.choices = [_choice(r["id"], r["name"]) for r in rows]
    return form, rows, healthy


def _baseline_page(task: str, build_form: BaselineBuildForm | None = None, status: int = 200,
                   error: str | None = None):
    from registry.health import baseline_history, edited_metrics, require_baseline

    reg = get_registry()
    try:
        profile, meta = require_baseline(reg, task)
    except NotFoundError:
        profile, meta = None, None
    form, rows, healthy = _build_form(reg, task)
    if build_form is not None:
        build_form.runs.choices = form.runs.choices
        form = build_form
    history = baseline_history(reg, task)
    edited = edited_metrics(history)
    names = {r["id"]: r for r in rows}
    sources = []
    if meta:
        missing = [rid for rid in meta["source_runs"] if rid not in names]
        extra = {}
        if missing:
            with reg.read() as session:
                from sqlalchemy import select

                from registry.models import Run

                extra = {rid: {"id": rid, "name": name, "verdict": verdict} for rid, name, verdict in session.execute(
                    select(Run.id, Run.name, Run.verdict).where(Run.id.in_(missing)))}
        sources = [names.get(rid) or extra.get(rid) or {"id": rid, "name": rid[:12], "verdict": None, "gone": True}
                   for rid in meta["source_runs"]]
    defs = queries.definition_summaries(reg, sorted(profile.metrics) if profile else [])
    metrics = []
    if profile:
        for name, mb in sorted(profile.metrics.items(), key=lambda kv: (
                LAYERS.index(defs[kv[0]]["layer"]) if kv[0] in defs and defs[kv[0]]["layer"] in LAYERS else 9,
                kv[0])):
            metrics.append({"name": name, "early": mb.early, "mid": mb.mid, "warning": mb.warning,
                            "n_runs": mb.n_runs, "definition": defs.get(name), "edited": edited.get(name)})
    return render_template(
        "baseline.html", task=task, profile=profile, meta=meta, metrics=metrics, sources=sources, form=form,
        rows=rows, rows_by_id=names, healthy=healthy, history=list(reversed(history))[:30], error=error,
        user=acting_user(),
    ), status


@bp.get("/baselines")
def baselines():
    """Every task with its baseline (or the lack of one)."""
    from registry.health import list_baselines

    return render_template("baselines.html", tasks=list_baselines(get_registry()))


@bp.get("/baselines/<path:task>")
def baseline(task: str):
    """A task's health baseline: metric, early band, mid band, warning signal; sources; build form."""
    return _baseline_page(task)


@bp.post("/baselines/<path:task>/build")
@admin_access_required
def baseline_build(task: str):
    """Learn (or re-learn) the task's baseline from the ticked runs."""
    from registry.health import build_task_baseline

    reg = get_registry()
    form, _, _ = _build_form(reg, task, formdata=request.form)
    author = _author(form)
    if not form.validate_on_submit() or author is None:
        if author is None and not form.author.errors:
            form.author.errors = [*form.author.errors, "say who builds it (recorded with the baseline)"]
        return _baseline_page(task, form, 400)
    try:
        profile = build_task_baseline(reg, task, form.runs.data, author=author, keep_edits=form.keep_edits.data,
                                      note=(form.note.data or "").strip(), allow_weak=form.allow_weak.data)
    except InputError as exc:
        return _baseline_page(task, form, 400, error=str(exc))
    flash(f"Built the {task} baseline: {len(profile.metrics)} metrics from {len(form.runs.data)} run(s).", "success")
    return redirect(url_for("ui.baseline", task=task))


@bp.route("/baselines/<path:task>/metrics/<metric>/edit", methods=["GET", "POST"])
@admin_access_required
def baseline_edit(task: str, metric: str):
    """Tune one metric's early and mid bands (and its warning text) by hand."""
    from registry.health import edit_baseline_metric, require_baseline

    reg = get_registry()
    profile, meta = require_baseline(reg, task)
    mb = profile.metrics.get(metric)
    if mb is None:
        raise NotFoundError(f"the {task} baseline has no metric {metric!r}")
    if request.method == "POST":
        form = BandEditForm()
    else:
        form = BandEditForm(early_low=mb.early.low if mb.early else None,
                            early_high=mb.early.high if mb.early else None,
                            mid_low=mb.mid.low if mb.mid else None, mid_high=mb.mid.high if mb.mid else None,
                            warning=mb.warning)
    error = None
    if form.validate_on_submit():
        author = _author(form)
        if author is None:
            form.author.errors = ["say who changes it (recorded in the history)"]
        else:
            try:
                entry = edit_baseline_metric(reg, task, metric, author=author, note=(form.note.data or "").strip(),
                                             early=form.band("early"), mid=form.band("mid"),
                                             warning=(form.warning.data or "").replace("\r\n", "\n"))
            except InputError as exc:
                error = str(exc)
            else:
                if entry is None:
                    flash(f"Nothing changed for {metric}.", "info")
                else:
                    flash(f"Saved {metric}: {', '.join(entry['changes'])} changed by {author}.", "success")
                return redirect(url_for("ui.baseline", task=task) + f"#metric-{metric}")
    status = 400 if request.method == "POST" else 200
    definition = queries.definition_summaries(reg, [metric]).get(metric)
    return render_template("baseline_edit.html", task=task, metric=metric, mb=mb, profile=profile, meta=meta,
                           form=form, error=error, definition=definition, user=acting_user()), status
