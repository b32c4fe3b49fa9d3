"""The metric dictionary: browse by layer, a definition's page with history, and the edit form."""
from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for

from registry.dictionary.definitions import FRAMEWORKS, update_definition
from registry.core.errors import DefinitionError
from registry.core.semantics import LAYERS
from registry.web.context import get_registry
from registry.web import queries
from registry.web.curves import describe_semantics
from registry.web.forms import DefinitionForm
from registry.web.security import admin_access_required, current_user
from registry.analysis.health import definition_ranges

bp = Blueprint("dictionary", __name__, url_prefix="/dictionary")


@bp.get("/")
def index():
    reg = get_registry()
    layer = request.args.get("layer") or None
    q = (request.args.get("q") or "").strip().lower()
    defs = reg.definitions_by_name()
    usage = queries.definition_usage(reg)
    by_layer: dict[str, list[dict]] = {name: [] for name in LAYERS}
    for d in defs.values():
        if layer and d["layer"] != layer:
            continue
        if q and not any(q in (text or "").lower() for text in (
                d["name"], d["display_name"], d["description"], *(a["key"] for a in d["aliases"]))):
            continue
        d = dict(d, runs=usage.get(d["name"], 0), semantics_text=describe_semantics(d),
                 frameworks=sorted({a["framework"] for a in d["aliases"]}))
        by_layer.setdefault(d["layer"], []).append(d)
    return render_template("dictionary/index.html", by_layer=by_layer, layer=layer, q=request.args.get("q") or "",
                           layers=LAYERS, total=sum(len(v) for v in by_layer.values()))


@bp.get("/<name>")
def definition(name: str):
    reg = get_registry()
    current, versions = queries.definition_history(reg, name)
    runs, runs_total = queries.runs_using(reg, name)
    for r in runs:
        r["semantics_text"] = describe_semantics(r["semantics"])

    return render_template("dictionary/definition.html", d=current, versions=versions, runs=runs,
                           runs_total=runs_total, frameworks=FRAMEWORKS, ranges=definition_ranges(reg, current))


@bp.route("/<name>/edit", methods=["GET", "POST"])
@admin_access_required
def edit(name: str):
    """The edit form (login required); each save is a new version authored by the logged-in user."""
    reg = get_registry()
    current, _ = queries.definition_history(reg, name)
    form = DefinitionForm() if request.method == "POST" else DefinitionForm.for_definition(current)
    error = None
    if form.validate_on_submit():
        try:
            with reg.transaction() as session:
                defn = update_definition(session, name, form.changes(), author=current_user(),
                                         note=(form.note.data or "").strip())
                new_version = defn.version
        except DefinitionError as exc:
            error = str(exc)
        else:
            if new_version == current["version"]:
                flash("Nothing changed: no new version recorded.", "info")
            else:
                flash(f"Saved {name} as version {new_version}.", "success")
            return redirect(url_for("dictionary.definition", name=name) + "#history")
    status = 400 if request.method == "POST" else 200
    return render_template("dictionary/edit.html", d=current, form=form, error=error,
                           current_user=current_user()), status
