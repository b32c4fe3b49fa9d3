"""The JSON write API under /api/ (documented in ``openapi.yaml``): runs, metric batches, outcomes,
status, deletes, dictionary edits and file uploads (archives are unpacked by ``archives``).

Longer than 500 lines: one endpoint per write, each with the input checks that make a bad
body a 400 naming the field instead of a 500; they share the helpers at the top.

Every endpoint needs ``Authorization: Bearer <token>`` or a session login plus an
``X-CSRFToken`` header (:func:`~registry.web.security.write_access_required`). Errors are
``{"error": message}``: 400 bad input (the importer's message, naming the uploaded file and the
position), 401 no or bad credentials, 404 unknown run or definition, 409 already registered /
a run id taken by another run, 413 body over ``MAX_CONTENT_LENGTH``, 429 too many failed token
checks.

Non-finite values in a metrics batch are the JSON strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"``; ``null`` is stored as NaN too (a point whose value is not a number). Reads
return every non-finite value as ``null`` and count them in ``nonfinite``.

Idempotency: ``POST /api/runs`` takes an optional client-chosen ``run_id`` (32 hex digits); sending
it again with the same name returns the existing run (200) instead of a second one. ``POST
/api/runs/{ref}/metrics`` needs a client-chosen ``batch_id``: a batch id the run has already
applied is acknowledged with ``applied: false`` and changes nothing, so a client may resend a
batch whose answer it never saw. Outcome and status writes are idempotent by nature.

Uploads (``POST /api/uploads``, multipart, one ``file`` part): a single ``trainer_state.json``, CSV,
JSONL or verl console log, or a ``.zip`` / ``.tar`` / ``.tar.gz`` of a TensorBoard run directory (or
of a checkpoint directory holding ``trainer_state.json``); or a tracker's store: an MLflow or
trackio database file, a W&B history export (Parquet) or ``.wandb`` log, or an archive of an
``mlruns/`` store or of W&B run directories. A store registers one run per tracker run (the
answer's ``runs``); runs imported before are skipped, and a store with nothing new is a 409.
A store of which some runs cannot be read registers nothing. The kind is told from the content
(``registry.importers.open_source``), never from the client's file name, and the bytes are written
only under ``UPLOAD_DIR`` (``RLREG_UPLOAD_DIR``, default ``./rlregistry-uploads``) in a new directory
with generated names; the client's file name is only used as the run's default name and in error
messages. Archive members with an absolute path, a ``..`` component, a link or a device are
refused before anything is unpacked (zip-slip), and so are archives that unpack to more than
``MAX_UNPACKED_BYTES`` or hold more than ``MAX_ARCHIVE_MEMBERS`` members. A failed upload leaves
neither files nor rows behind; a registered one keeps its files (the run's ``source.path``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tarfile
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

import numpy as np
from flask import Blueprint, Response, current_app, jsonify, request, url_for

from registry.dictionary.definitions import get_definition, update_definition
from registry.core.errors import AlreadyRegisteredError, InputError, LimitExceededError
from registry.core.jsonsafe import has_unstorable_text
from registry.importers import run_paths
from registry.db.models import IngestBatch, Run
from registry.core.series import DEFAULT_ORDER_POLICY, ORDER_POLICIES, SeriesData
from registry.web import archives
from registry.web.context import get_registry
from registry.store.run_history import record_registration
from registry.store.tracker_runs import PartialImportError, store_format
from registry.web.api import clean
from registry.web.security import admin_access_required, current_user, write_access_required

bp = Blueprint("write_api", __name__, url_prefix="/api")

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
BATCH_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
MAX_KEY_LENGTH = 300
INT64_MAX = 2**63 - 1
NONFINITE = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
             "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}
RUN_FIELDS = ("name", "project", "algorithm", "framework", "task", "params", "tags", "code_version", "run_id")
OUTCOME_FIELDS = ("verdict", "scores", "notes", "checkpoints")
SINGLE_FILE_SUFFIXES = {".csv": ".csv", ".jsonl": ".jsonl", ".ndjson": ".jsonl", ".json": ".json",
                        ".log": ".log", ".txt": ".txt"}


# --- helpers -----------------------------------------------------------------------


def _body(allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    limits = current_app.config["LIMITS"]
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # the parser's own recursion limit, far below any memory trouble
        raise LimitExceededError(f"the request body is nested more than {limits.max_json_depth} levels deep "
                                 "(RLREG_MAX_JSON_DEPTH)") from None
    if not isinstance(data, dict):
        raise InputError("the body must be a JSON object (Content-Type: application/json)")
    limits.check_depth(data, "the request body")
    if has_unstorable_text(data):
        raise InputError("the body contains a NUL character or a lone surrogate (\\ud800-\\udfff)")
    if allowed is not None:
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InputError(f"unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(allowed)}")
    return data


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{key} must be a string or null, got {type(value).__name__}")
    return value


def _opt_mapping(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise InputError(f"{key} must be a JSON object, got {type(value).__name__}")
    return value


def _tags(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InputError("tags must be a list of strings")
    return value


def _semantics(value: Any) -> dict[str, dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise InputError("semantics must map metric keys to objects of semantic fields")
    return value


def _run_summary(run_id: str) -> dict[str, Any]:
    return clean(get_registry().run_detail(run_id))


AUDIT = logging.getLogger("rlregistry.audit")


def _audit(action: str, target: str) -> None:
    """One line per write, naming the acting user (configure the ``rlregistry.audit`` logger to keep them)."""
    AUDIT.info("%s by %s: %s", action, current_user(), target)


# --- runs ----------------------------------------------------------------------------


@bp.post("/runs")
@write_access_required
def create_run() -> tuple[Response, int] | Response:
    data = _body(RUN_FIELDS)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InputError("name is required (a non-empty string)")
    run_id = _opt_str(data, "run_id")
    if run_id is not None and not RUN_ID.match(run_id):
        raise InputError("run_id must be 32 lowercase hex digits (uuid4().hex)")
    reg = get_registry()
    if run_id is not None:
        with reg.read() as s:
            existing = s.get(Run, run_id)
            if existing is not None:
                if existing.name != name.strip():
                    raise AlreadyRegisteredError(existing.id, existing.name)
                return jsonify(_run_summary(run_id))  # a retried create: the run it made the first time
    params = _opt_mapping(data, "params")
    try:
        handle = reg.create_run(
            name, project=_opt_str(data, "project") or "default", algorithm=_opt_str(data, "algorithm"),
            framework=_opt_str(data, "framework"), task=_opt_str(data, "task"), params=params,
            tags=_tags(data.get("tags")), code_version=_opt_str(data, "code_version"), run_id=run_id,
        )
    except AlreadyRegisteredError:
        if run_id is None:
            raise
        # Two copies of one create raced; the other one won.
        with reg.read() as s:
            existing = s.get(Run, run_id)
        if existing is None or existing.name != name.strip():
            raise
        return jsonify(_run_summary(run_id))
    _audit("create run", handle.id)
    response = jsonify(_run_summary(handle.id))
    response.headers["Location"] = url_for("api.run", ref=handle.id)
    return response, 201


def _steps(key: str, raw: Any) -> np.ndarray:
    if not isinstance(raw, list):
        raise InputError(f"metric {key!r}: steps must be a list of whole numbers")
    for i, s in enumerate(raw):
        if isinstance(s, bool) or not isinstance(s, int) or not -INT64_MAX <= s <= INT64_MAX:
            raise InputError(f"metric {key!r}: steps[{i}] = {s!r} is not a whole number in the int64 range")
    return np.asarray(raw, dtype=np.int64)


def _floats(key: str, what: str, raw: Any) -> np.ndarray:
    if not isinstance(raw, list):
        raise InputError(f"metric {key!r}: {what} must be a list of numbers")
    out = np.empty(len(raw), dtype=np.float64)
    for i, v in enumerate(raw):
        if v is None:
            out[i] = math.nan
        elif isinstance(v, bool):
            raise InputError(f"metric {key!r}: {what}[{i}] = {v!r} is not a number")
        elif isinstance(v, (int, float)):
            out[i] = float(v)
        elif isinstance(v, str) and v.strip().lower() in NONFINITE:
            out[i] = NONFINITE[v.strip().lower()]
        else:
            raise InputError(f"metric {key!r}: {what}[{i}] = {str(v)[:40]!r} is not a number "
                             "(non-finite values are \"NaN\", \"Infinity\", \"-Infinity\" or null)")
    return out


def _check_key(key: str) -> None:
    if not key or not key.strip() or len(key) > MAX_KEY_LENGTH or any(ord(c) < 32 for c in key):
        raise InputError(f"metric key {key[:40]!r} must be 1-{MAX_KEY_LENGTH} printable characters")


def parse_points(points: Any) -> dict[str, SeriesData]:
    if not isinstance(points, dict) or not points:
        raise InputError("points must be a non-empty object {key: {\"steps\": [...], \"values\": [...]}}")
    current_app.config["LIMITS"].check_keys(len(points))
    out = {}
    for key, series in points.items():
        _check_key(key)
        if not isinstance(series, dict) or not {"steps", "values"} <= set(series) or \
                set(series) - {"steps", "values", "wall_times"}:
            raise InputError(f"metric {key!r}: expected {{\"steps\": [...], \"values\": [...]}} "
                             "(and optionally \"wall_times\")")
        steps = _steps(key, series["steps"])
        values = _floats(key, "values", series["values"])
        if len(steps) != len(values):
            raise InputError(f"metric {key!r}: {len(steps)} steps but {len(values)} values")
        walls = None
        if series.get("wall_times") is not None:
            walls = _floats(key, "wall_times", series["wall_times"])
            if len(walls) != len(steps):
                raise InputError(f"metric {key!r}: {len(steps)} steps but {len(walls)} wall times")
        out[key] = SeriesData(steps, values, walls)
    return out


def _batch_applied(run_id: str, batch_id: str) -> bool:
    with get_registry().read() as s:
        return s.get(IngestBatch, (run_id, batch_id)) is not None


@bp.post("/runs/<ref>/metrics")
@write_access_required
def append_metrics(ref: str) -> Response:
    data = _body(("batch_id", "points", "semantics"))
    batch_id = data.get("batch_id")
    if not isinstance(batch_id, str) or not BATCH_ID.match(batch_id):
        raise InputError("batch_id is required: 1-64 characters of A-Z a-z 0-9 . _ : - (a uuid4 is right)")
    series = parse_points(data.get("points"))
    reg = get_registry()
    with reg.read() as s:
        run_id = reg.resolve_run(s, ref).id
    try:
        applied = reg.append(run_id, series, batch_id=batch_id, overrides=_semantics(data.get("semantics")))
    except InputError:
        # A copy of this batch sent earlier (the client timed out and resent it) may have landed
        # while this one was checking step order: then this is a duplicate, not an error.
        if _batch_applied(run_id, batch_id):
            applied = False
        else:
            raise
    except Exception:
        if _batch_applied(run_id, batch_id):  # the same race, lost at commit (primary key)
            applied = False
        else:
            raise
    return jsonify({"run_id": run_id, "batch_id": batch_id, "applied": applied,
                    "points": sum(len(sd) for sd in series.values())})


@bp.post("/runs/<ref>/outcome")
@write_access_required
def set_outcome(ref: str) -> Response:
    data = _body(OUTCOME_FIELDS)
    outcome: dict[str, Any] = {}
    if "verdict" in data:
        outcome["verdict"] = _opt_str(data, "verdict")
    if "notes" in data:
        outcome["notes"] = _opt_str(data, "notes")
    if data.get("scores") is not None:
        scores = _opt_mapping(data, "scores") or {}
        for k, v in scores.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"score {k!r} must be a number, got {v!r}")
        outcome["scores"] = scores
    if data.get("checkpoints") is not None:
        raw = data["checkpoints"]
        if not isinstance(raw, list):
            raise InputError("checkpoints must be a list of {\"step\": int, \"uri\": str, \"note\": str}")
        ckpts = []
        for i, c in enumerate(raw):
            if not isinstance(c, dict) or set(c) - {"step", "uri", "note"} or \
                    isinstance(c.get("step"), bool) or not isinstance(c.get("step"), int) or \
                    not isinstance(c.get("uri"), str) or not isinstance(c.get("note", ""), (str, type(None))):
                raise InputError(f"checkpoints[{i}] must be {{\"step\": int, \"uri\": str, \"note\": str}}")
            ckpts.append((c["step"], c["uri"], c["note"]) if c.get("note") is not None else (c["step"], c["uri"]))
        outcome["checkpoints"] = ckpts
    reg = get_registry()
    with reg.read() as s:
        run_id = reg.resolve_run(s, ref).id
    reg.set_outcome(run_id, author=current_user(), **outcome)
    _audit("set outcome", run_id)
    return jsonify(_run_summary(run_id))


@bp.post("/runs/<ref>/status")
@write_access_required
def set_status(ref: str) -> Response:
    data = _body(("status",))
    status = data.get("status")
    if not isinstance(status, str):
        raise InputError("status is required: running, finished, crashed or incomplete")
    reg = get_registry()
    with reg.read() as s:
        run_id = reg.resolve_run(s, ref).id
    reg.set_status(run_id, status, author=current_user())
    _audit(f"set status {status}", run_id)
    return jsonify(_run_summary(run_id))


@bp.delete("/runs/<ref>")
@admin_access_required
def delete_run(ref: str) -> Response:
    run_id = get_registry().delete_run(ref, author=current_user())
    _audit("delete run", run_id)
    return jsonify({"deleted": run_id})


# --- dictionary --------------------------------------------------------------------------


@bp.patch("/definitions/<name>")
@admin_access_required
def edit_definition(name: str) -> Response:
    data = _body(("changes", "note"))
    changes = _opt_mapping(data, "changes")
    if not changes:
        raise InputError("changes is required: an object of the fields to change")
    note = _opt_str(data, "note") or ""
    reg = get_registry()
    with reg.transaction() as session:
        before = get_definition(session, name).version  # NotFoundError: 404
        defn = update_definition(session, name, changes, author=current_user() or "unknown", note=note)
        version = defn.version
    _audit(f"edit definition (version {version})", name)
    return jsonify({"name": name, "version": version, "changed": version != before})


# --- uploads -----------------------------------------------------------------------------


def upload_root() -> Path:
    root = current_app.config.get("UPLOAD_DIR") or (Path.cwd() / "rlregistry-uploads")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def _form_bool(name: str) -> bool:
    value = (request.form.get(name) or "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise InputError(f"{name} must be true or false, got {value[:20]!r}")


def _form_json(name: str) -> dict[str, Any] | None:
    raw = request.form.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InputError(f"{name} must be a JSON object: {exc}") from None
    except RecursionError:
        raise LimitExceededError(f"{name} is nested too deeply (RLREG_MAX_JSON_DEPTH)") from None
    if not isinstance(value, dict):
        raise InputError(f"{name} must be a JSON object")
    current_app.config["LIMITS"].check_depth(value, name)
    if has_unstorable_text(value):
        raise InputError(f"{name} contains a NUL character")
    return value


def _rewrite(exc: InputError, mapping: list[tuple[str, str]]) -> InputError:
    """The importer's error with our stored paths replaced by the names the client knows."""
    source = exc.source
    if source:
        for stored, shown in mapping:
            if source == stored:
                source = shown
                break
            if source.startswith(stored + os.sep):
                source = shown + ":" + source[len(stored) + 1:]
                break
    if isinstance(exc, LimitExceededError):
        return LimitExceededError(exc.reason, source, exc.position, status=exc.status)
    return InputError(exc.reason, source, exc.position)


@bp.post("/uploads")
@write_access_required
def upload() -> tuple[Response, int]:
    files = request.files.getlist("file")
    if len(files) != 1 or len(request.files) != 1:
        raise InputError("send exactly one file, as the multipart part named 'file'")
    upload_file = files[0]
    if has_unstorable_text([*request.form.keys(), *request.form.values(), upload_file.filename or ""]):
        raise InputError("the form contains a NUL character")
    shown = archives.display_name(upload_file.filename)
    fmt = (request.form.get("format") or "").strip() or None
    on_disorder = (request.form.get("on_disorder") or DEFAULT_ORDER_POLICY).strip()
    if on_disorder not in ORDER_POLICIES:
        raise InputError(f"on_disorder must be one of {', '.join(ORDER_POLICIES)}")
    tags = [t.strip() for v in request.form.getlist("tags") for t in v.split(",") if t.strip()]
    status = (request.form.get("status") or "finished").strip()

    root = upload_root()
    workdir = root / uuid.uuid4().hex
    workdir.mkdir(mode=0o700)
    ok = False
    try:
        raw = workdir / "upload.bin"
        with archives.create_file(raw) as dst:
            shutil.copyfileobj(upload_file.stream, dst, 1 << 20)
        if raw.stat().st_size == 0:
            raise InputError("the file is empty", shown)
        kind = archives.archive_kind(raw)
        mapping: list[tuple[str, str]]
        default_name: str | None
        if kind is None:
            suffix = SINGLE_FILE_SUFFIXES.get(PurePosixPath(shown).suffix.lower(), "")
            source_path = workdir / f"upload{suffix}"
            raw.rename(source_path)
            mapping = [(str(source_path), shown)]
            default_name = PurePosixPath(shown).stem or shown
            if shown == "trainer_state.json":
                default_name = None  # the importer's own name (global step, model)
        else:
            tree = workdir / "tree"
            tree.mkdir()
            try:
                (archives.extract_zip if kind == "zip" else archives.extract_tar)(raw, tree, shown)
            except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, archives.lzma_error()) as exc:
                if isinstance(exc, InputError):
                    raise
                raise InputError(f"not a readable {kind} archive: {exc}", shown) from None
            raw.unlink(missing_ok=True)
            raw.with_suffix(".tar").unlink(missing_ok=True)
            entries = list(tree.iterdir())
            source_path = entries[0] if len(entries) == 1 and entries[0].is_dir() else tree
            mapping = [(str(tree), shown)]
            default_name = source_path.name if source_path != tree else re.sub(
                r"(\.tar)?\.(zip|tar|tgz|gz|bz2|xz)$", "", shown, flags=re.I) or shown
        name = (request.form.get("name") or "").strip() or default_name
        try:
            store = store_format(source_path, fmt)
        except InputError as exc:
            raise _rewrite(exc, mapping) from None
        if store is not None or len(run_paths(source_path, fmt)) > 1:
            # A tracker's store or a directory of runs: each run keeps its own name (the tracker's,
            # or its sub-directory's) unless the client named the one run.
            name = (request.form.get("name") or "").strip() or None
        project = (request.form.get("project") or "").strip() or "default"
        if store == "trackio" and project == "default":
            project = PurePosixPath(shown).stem or project  # trackio names a project by its database file
        try:
            results = get_registry().register_all(
                source_path, format=fmt, name=name, project=project,
                algorithm=(request.form.get("algorithm") or "").strip() or None,
                framework=(request.form.get("framework") or "").strip() or None,
                task=(request.form.get("task") or "").strip() or None, params=_form_json("params"),
                tags=tags or None, code_version=(request.form.get("code_version") or "").strip() or None,
                status=status, on_disorder=on_disorder, replace=_form_bool("replace"),
                semantics=_semantics(_form_json("semantics")),
            )
        except PartialImportError as exc:
            # An upload lands whole or not at all: the store's runs that did register are taken out again.
            for done in exc.registered:
                get_registry().delete_run(done.run_id)
            reasons = "; ".join(f"{run}: {reason}" for run, reason in exc.failures[:3])
            raise _rewrite(InputError(f"{len(exc.failures)} run(s) could not be registered ({reasons}); "
                                      "nothing was registered", str(source_path)), mapping) from None
        except InputError as exc:
            raise _rewrite(exc, mapping) from None
        except (UnicodeError, ValueError, OSError) as exc:
            raise InputError(f"cannot read the upload: {exc}", shown) from None
        if not results and getattr(results, "skipped", None):
            # Every run of the uploaded store was imported before: nothing new, as for a file sent twice.
            raise AlreadyRegisteredError(*results.present[0])
        ok = True
    finally:
        if not ok:
            shutil.rmtree(workdir, ignore_errors=True)
    result = results[0]
    for registered in results:
        _audit("upload", registered.run_id)
        record_registration(get_registry(), registered.run_id, current_user(), shown,
                            {"series": registered.series_count, "points": registered.point_count})
    out = clean(result.to_dict())
    out["file"] = shown
    if len(results) > 1:
        out["runs"] = [clean(r.to_dict()) for r in results]
    response = jsonify(out)
    response.headers["Location"] = url_for("api.run", ref=result.run_id)
    return response, 201


__all__ = ["bp", "parse_points"]
