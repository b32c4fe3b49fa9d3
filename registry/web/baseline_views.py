"""Health baseline pages: list, show, build from chosen runs, and edit one metric's bands.

Blueprint ``baselines`` (endpoints ``baselines.baselines``, ``baselines.baseline``, ...).
"""
from __future__ import annotations

import math
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import BooleanField, FloatField, SelectMultipleField, StringField, TextAreaField, widgets
from wtforms.validators import Length, Optional, ValidationError

from registry.core.errors import InputError, NotFoundError
from registry.core.semantics import LAYERS
from registry.web.context import get_registry
from registry.web import queries
from registry.web.security import admin_access_required, current_user
from registry.web.forms import choice
from registry.analysis.baselines import (baseline_history, build_task_baseline, edit_baseline_metric, edited_metrics,
                                         healthy_runs, list_baselines, require_baseline)
from registry.analysis.diagnosis.baseline import PHASES
from registry.store.filters import quote_string
from registry.db.models import Run

bp = Blueprint("baselines", __name__)


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
    late_low = FloatField("Late: low", validators=[Optional()])
    late_high = FloatField("Late: high", validators=[Optional()])
    warning = TextAreaField("Warning signal", validators=[Optional(), Length(max=2000)],
                            description="What it means when a run leaves the band")
    author = StringField("Your name", validators=[Optional(), Length(max=200)],
                         description="Recorded in the baseline's history")
    note = StringField("Why this change", validators=[Optional(), Length(max=2000)])

    def validate(self, extra_validators: Any = None) -> bool:
        ok = super().validate(extra_validators)
        for phase in PHASES:
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
    return current_user() or ((form.author.data or "").strip() or None)


def _task_runs(reg: Any, task: str) -> tuple[list[dict[str, Any]], set[str]]:
    rows, _ = reg.list_runs(where=f'task="{quote_string(task)}"', order_by="name", limit=500)
    healthy = {r["id"] for r in healthy_runs(reg, task)}
    return rows, healthy


def _build_form(reg: Any, task: str, formdata: Any = None) -> tuple[BaselineBuildForm, list[dict[str, Any]], set[str]]:
    rows, healthy = _task_runs(reg, task)
    current = None
    try:
        _, meta = require_baseline(reg, task)
        current = set(meta["source_runs"] or [])
    except NotFoundError:
        pass
    form = BaselineBuildForm(formdata=formdata) if formdata is not None else BaselineBuildForm(
        runs=[r["id"] for r in rows if r["id"] in (current if current else healthy)])
    form.runs.choices = [choice(r["id"], r["name"]) for r in rows]
    return form, rows, healthy


def _baseline_page(task: str, build_form: BaselineBuildForm | None = None, status: int = 200,
                   error: str | None = None):
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
            metrics.append({"name": name, "early": mb.early, "mid": mb.mid, "late": mb.late, "warning": mb.warning,
                            "n_runs": mb.n_runs, "definition": defs.get(name), "edited": edited.get(name)})
    return render_template(
        "baseline.html", task=task, profile=profile, meta=meta, metrics=metrics, sources=sources, form=form,
        rows=rows, rows_by_id=names, healthy=healthy, history=list(reversed(history))[:30], error=error,
        user=current_user(),
    ), status


@bp.get("/baselines")
def baselines():
    """Every task with its baseline (or the lack of one)."""
    return render_template("baselines.html", tasks=list_baselines(get_registry()))


@bp.get("/baselines/<path:task>")
def baseline(task: str):
    """A task's health baseline: metric, early, mid and late bands, warning signal; sources; build form."""
    return _baseline_page(task)


@bp.post("/baselines/<path:task>/build")
@admin_access_required
def baseline_build(task: str):
    """Learn (or re-learn) the task's baseline from the ticked runs."""
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
    return redirect(url_for("baselines.baseline", task=task))


@bp.route("/baselines/<path:task>/metrics/<metric>/edit", methods=["GET", "POST"])
@admin_access_required
def baseline_edit(task: str, metric: str):
    """Tune one metric's early, mid and late bands (and its warning text) by hand."""
    reg = get_registry()
    profile, meta = require_baseline(reg, task)
    mb = profile.metrics.get(metric)
    if mb is None:
        raise NotFoundError(f"the {task} baseline has no metric {metric!r}")
    if request.method == "POST":
        form = BandEditForm()
    else:
        form = BandEditForm(**{f"{p}_{end}": getattr(b, end) if (b := mb.band(p)) else None
                               for p in PHASES for end in ("low", "high")}, warning=mb.warning)
    error = None
    if form.validate_on_submit():
        author = _author(form)
        if author is None:
            form.author.errors = ["say who changes it (recorded in the history)"]
        else:
            try:
                entry = edit_baseline_metric(reg, task, metric, author=author, note=(form.note.data or "").strip(),
                                             early=form.band("early"), mid=form.band("mid"), late=form.band("late"),
                                             warning=(form.warning.data or "").replace("\r\n", "\n"))
            except InputError as exc:
                error = str(exc)
            else:
                if entry is None:
                    flash(f"Nothing changed for {metric}.", "info")
                else:
                    flash(f"Saved {metric}: {', '.join(entry['changes'])} changed by {author}.", "success")
                return redirect(url_for("baselines.baseline", task=task) + f"#metric-{metric}")
    status = 400 if request.method == "POST" else 200
    definition = queries.definition_summaries(reg, [metric]).get(metric)
    return render_template("baseline_edit.html", task=task, metric=metric, mb=mb, profile=profile, meta=meta,
                           form=form, error=error, definition=definition, user=current_user()), status
