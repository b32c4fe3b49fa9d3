"""Write actions in the web UI: upload a log with its registration report, edit a run's outcome and
tags, delete a run, and read a run's history.

Every view here needs a login (or a token) and, for a session login, the CSRF token
(:func:`~registry.web.security.write_access_required`; deleting needs ``admin`` scope, which a
session login has). The upload form posts to ``/upload``, which runs the JSON API's upload
(``write_api.upload``: the same checks, limits and history record) and renders its report;
``upload.js`` sends the form with XMLHttpRequest to show the transfer's progress and puts the
report (an HTML fragment, ``X-Requested-With: XMLHttpRequest``) under the form. Without
JavaScript the same form posts normally and the report is a page.
"""
from __future__ import annotations

import math
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_wtf import FlaskForm
from wtforms import HiddenField, SelectField, StringField, TextAreaField
from wtforms.validators import Length, Optional, ValidationError

from registry.core.errors import InputError, NotFoundError, RegistryError
from registry.core.run_fields import VERDICTS
from registry.store.run_history import CheckpointEntry, RunEdit, edit_run, history, delete_run as delete_recorded
from registry.web import write_api
from registry.web.context import get_registry
from registry.web.forms import choice
from registry.web.security import admin_access_required, current_user, write_access_required
from registry.web.error_pages import status_for

bp = Blueprint("edit", __name__)


# --- text formats of the edit form ------------------------------------------------------


def parse_scores(text: str) -> dict[str, float]:
    """``name = value`` per line (blank lines and ``#`` comments skipped)."""
    out: dict[str, float] = {}
    for n, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, raw = line.rpartition("=")
        if not sep or not name.strip():
            raise ValueError(f"line {n}: write 'name = value'")
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(f"line {n}: {raw.strip()[:40]!r} is not a number") from None
        if math.isnan(value):
            raise ValueError(f"line {n}: a score must be a number, not NaN")
        if name.strip() in out:
            raise ValueError(f"line {n}: score {name.strip()!r} is given twice")
        out[name.strip()] = value
    return out


def format_scores(scores: dict[str, float]) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in sorted(scores.items()))


def parse_checkpoints(text: str) -> list[CheckpointEntry]:
    """``step reference [note ...]`` per line: a whole-number step, a reference without spaces, a free note."""
    out = []
    for n, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 2:
            raise ValueError(f"line {n}: write 'step reference [note]', e.g. '4000 s3://bucket/ckpt-4000'")
        try:
            step = int(parts[0].replace(",", "").replace("_", ""))
        except ValueError:
            raise ValueError(f"line {n}: step {parts[0][:20]!r} is not a whole number") from None
        out.append(CheckpointEntry(step, parts[1], parts[2].strip() if len(parts) > 2 else None))
    return out


def format_checkpoints(checkpoints: list[dict[str, Any]]) -> str:
    return "\n".join(" ".join(str(p) for p in (c["step"], c["uri"], c.get("note")) if p) for c in checkpoints)


def parse_tags(text: str) -> list[str]:
    return list(dict.fromkeys(t.strip() for t in (text or "").replace("\n", ",").split(",") if t.strip()))


class RunEditForm(FlaskForm):
    verdict = SelectField("Verdict", choices=[choice("", "none")] + [choice(v, v) for v in VERDICTS])
    tags = StringField("Tags", validators=[Optional(), Length(max=5000)], description="comma-separated")
    scores = TextAreaField("Final scores", validators=[Optional(), Length(max=100000)],
                           description="one per line: name = value")
    checkpoints = TextAreaField("Checkpoints", validators=[Optional(), Length(max=500000)],
                                description="one per line: step reference [note]")
    notes = TextAreaField("Notes", validators=[Optional(), Length(max=100000)])
    note = StringField("Why this change", validators=[Optional(), Length(max=2000)],
                       description="kept in the run's history")
    version = HiddenField()

    def validate_scores(self, field: TextAreaField) -> None:
        try:
            parse_scores(field.data or "")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def validate_checkpoints(self, field: TextAreaField) -> None:
        try:
            parse_checkpoints(field.data or "")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def edit(self) -> RunEdit:
        notes = (self.notes.data or "").replace("\r\n", "\n").strip()
        return RunEdit(verdict=self.verdict.data or None, scores=parse_scores(self.scores.data or ""),
                       tags=parse_tags(self.tags.data or ""), notes=notes or None,
                       checkpoints=parse_checkpoints(self.checkpoints.data or ""))


class DeleteForm(FlaskForm):
    confirm_name = StringField("Type the run's name to confirm", validators=[Length(max=200)])
    note = StringField("Why (kept in the history)", validators=[Optional(), Length(max=2000)])


class UploadForm(FlaskForm):
    """Only the CSRF token and the text fields; the file part is read by ``write_api.upload``."""


# --- views -------------------------------------------------------------------------------


@bp.route("/runs/<ref>/edit", methods=["GET", "POST"])
@write_access_required
def edit(ref: str):
    reg = get_registry()
    run = reg.run_detail(ref)
    form = RunEditForm()
    error = None
    status = 200
    if request.method == "GET":
        form = RunEditForm(formdata=None, verdict=run["verdict"] or "", tags=", ".join(run["tags"]),
                           scores=format_scores(run["scores"]), checkpoints=format_checkpoints(run["checkpoints"]),
                           notes=run.get("notes") or "", version=str(run["data_version"]))
    elif form.validate_on_submit():
        try:
            version = int(form.version.data) if (form.version.data or "").strip() else None
        except ValueError:
            version = None
        try:
            changes = edit_run(reg, run["id"], form.edit(), current_user(), form.note.data, expected_version=version)
        except InputError as exc:
            error, status = str(exc), 400
        else:
            flash(f"Saved: {', '.join(changes)} changed." if changes else "Nothing changed.",
                  "success" if changes else "info")
            return redirect(url_for("ui.run_dashboard", ref=run["id"]) + "#outcome")
    else:
        status = 400
    return render_template("run_edit.html", run=run, form=form, error=error), status


@bp.route("/runs/<ref>/delete", methods=["GET", "POST"])
@admin_access_required
def delete(ref: str):
    reg = get_registry()
    run = reg.run_detail(ref)
    form = DeleteForm()
    error = None
    status = 200
    if request.method == "POST":
        status = 400
        if form.validate_on_submit():
            if (form.confirm_name.data or "").strip() != run["name"]:
                error = f"the name typed does not match {run['name']!r}; nothing was deleted"
            else:
                run_id, name = delete_recorded(reg, run["id"], current_user(), form.note.data)
                flash(f"Deleted run {name} ({run_id}). Its history stays at /runs/{run_id}/history.", "success")
                return redirect(url_for("ui.runs"))
    points = sum(int(s.get("count") or 0) for s in run["series"])
    return render_template("run_delete.html", run=run, form=form, error=error, points=points), status


@bp.get("/runs/<ref>/history")
def run_history(ref: str):
    """The run's changes, newest first; a deleted run's id still shows its record."""
    reg = get_registry()
    run = None
    try:
        run = reg.run_detail(ref)
        run_id = run["id"]
    except NotFoundError:
        run_id = ref
    events = history(reg, run_id)
    if run is None and not events:
        raise NotFoundError(f"no run and no history for {ref!r}")
    return render_template("run_history.html", run=run, run_id=run_id, events=events,
                           name=run["name"] if run else events[0]["run_name"])


def _wants_fragment() -> bool:
    return request.headers.get("X-Requested-With") == "XMLHttpRequest"


@bp.route("/upload", methods=["GET", "POST"])
@write_access_required
def upload():
    """The upload form; a POST registers the file through the upload API and shows its report."""
    form = UploadForm()
    if request.method == "GET":
        return render_template("upload.html", form=form, report=None, error=None)
    report, error, status = None, None, 201
    try:
        response, status = write_api.upload()
        report = response.get_json()
    except RegistryError as exc:

        error, status = str(exc), status_for(exc)
    if _wants_fragment():
        return render_template("partials/upload_report.html", report=report, error=error), status
    return render_template("upload.html", form=form, report=report, error=error), status


__all__ = ["bp", "format_checkpoints", "format_scores", "parse_checkpoints", "parse_scores", "parse_tags"]
