"""The JSON write API under /api/ (documented in ``openapi.yaml``): runs, metric batches, outcomes,
status, deletes, dictionary edits and file uploads.

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
of a checkpoint directory holding ``trainer_state.json``). The kind is told from the content
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
import stat
import tarfile
import time
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any, Mapping

import numpy as np
from flask import Blueprint, Response, current_app, jsonify, request, url_for

from registry.dictionary import get_definition, update_definition
from registry.errors import AlreadyRegisteredError, InputError, LimitExceededError
from registry.importers import run_paths
from registry.models import IngestBatch, Run
from registry.series import DEFAULT_ORDER_POLICY, ORDER_POLICIES, SeriesData
from registry.web import get_registry
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
    if _has_nul(data):
        raise InputError("the body contains a NUL character or a lone surrogate (\\ud800-\\udfff)")
    if allowed is not None:
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InputError(f"unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(allowed)}")
    return data


def _has_nul(value: Any) -> bool:
    """A NUL (PostgreSQL text cannot hold it) or a lone surrogate (no database can encode it)."""
    if isinstance(value, str):
        return "\x00" in value or _has_surrogate(value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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
    reg.set_outcome(run_id, **outcome)
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
    reg.set_status(run_id, status)
    _audit(f"set status {status}", run_id)
    return jsonify(_run_summary(run_id))


@bp.delete("/runs/<ref>")
@admin_access_required
def delete_run(ref: str) -> Response:
    run_id = get_registry().delete_run(ref)
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



def _display_name(filename: str | None) -> str:
    """The client's file name for messages: its last component, printable, at most 100 characters."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable())[:100].strip()
    return name if name not in ("", ".", "..") else "upload"


def _create_file(path: Path) -> IO[bytes]:
    """A new file that did not exist (no overwrite, no following a planted link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    return os.fdopen(fd, "wb")


def _copy_limited(src: IO[bytes], dst: IO[bytes], budget: list[int], what: str,
                  started: float | None = None) -> None:
    """Copy with a byte budget (shared by all members) and a CPU-time budget for the decompression."""
    limits = current_app.config["LIMITS"]
    started = time.thread_time() if started is None else started
    while chunk := src.read(1 << 20):
        budget[0] -= len(chunk)
        if budget[0] < 0:
            raise LimitExceededError(f"the archive unpacks to more than {current_app.config['MAX_UNPACKED_BYTES']} "
                                     "bytes (RLREG_MAX_UNPACKED_BYTES)", what, status=413)
        if time.thread_time() - started > limits.max_decompress_seconds:
            raise LimitExceededError(f"unpacking the archive takes more than {limits.max_decompress_seconds:g} s of "
                                     "CPU time (RLREG_MAX_DECOMPRESS_SECONDS)", what)
        dst.write(chunk)


def _decompressed_tar(archive: Path, shown: str) -> Path:
    """A compressed tar (gzip, bzip2, xz) unpacked to a plain tar beside it, within the byte and CPU budgets.

    tarfile would decompress the whole stream just to list the members, with no bound: a few KB of
    bzip2 can take tens of seconds. A plain tar is returned as it is."""
    import bz2
    import gzip
    import lzma

    with open(archive, "rb") as f:
        head = f.read(6)
    opener = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ": lzma.open}
    for magic, open_compressed in opener.items():
        if head.startswith(magic):
            break
    else:
        return archive
    plain = archive.with_suffix(".tar")
    budget = [int(current_app.config["MAX_UNPACKED_BYTES"]) + 1024 * int(current_app.config["MAX_ARCHIVE_MEMBERS"])]
    with open_compressed(archive, "rb") as src, _create_file(plain) as dst:
        _copy_limited(src, dst, budget, shown)
    archive.unlink()
    return plain


def member_path(name: str, archive: str) -> PurePosixPath:
    """An archive member's relative path, or InputError for anything that could leave the target."""
    if not name or "\x00" in name or any(ord(c) < 32 for c in name):
        raise InputError(f"member {name[:80]!r} has an unusable name", archive)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise InputError(f"member {name[:80]!r} has an absolute path; refusing the archive", archive)
    parts = [p for p in re.split(r"[/\\]", name) if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InputError(f"member {name[:80]!r} points outside the archive ('..'); refusing the archive", archive)
    if not parts:
        raise InputError(f"member {name[:80]!r} has an empty path", archive)
    return PurePosixPath(*parts)


def _inside(root: Path, rel: PurePosixPath) -> Path:
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()):
        raise InputError(f"member {str(rel)[:80]!r} resolves outside the target directory")
    return target


def _unpack(plan: list[tuple[Path, bool, int, Any]], tree: Path, shown: str) -> None:
    """Write checked archive members under ``tree``: (relative path, is directory, size, opener)."""
    limit = int(current_app.config["MAX_UNPACKED_BYTES"])
    if sum(size for _, is_dir, size, _ in plan if not is_dir) > limit:
        raise InputError(f"the archive unpacks to more than {limit} bytes", shown)
    budget = [limit]  # declared sizes can lie: the copy counts the bytes really written
    started = time.thread_time()
    for rel, is_dir, _, opener in plan:
        target = _inside(tree, rel)
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with opener() as src, _create_file(target) as dst:
            _copy_limited(src, dst, budget, shown, started)


def _extract_zip(archive: Path, tree: Path, shown: str) -> None:
    limit_members = int(current_app.config["MAX_ARCHIVE_MEMBERS"])
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > limit_members:
            raise InputError(f"the archive has {len(infos)} members; at most {limit_members} are accepted", shown)
        plan = []
        for info in infos:
            rel = member_path(info.filename, shown)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded (a plain file)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise InputError(f"member {info.filename[:80]!r} is a link or a special file", shown)
            if info.flag_bits & 0x1:
                raise InputError(f"member {info.filename[:80]!r} is encrypted", shown)
            plan.append((rel, info.is_dir(), info.file_size, lambda info=info: zf.open(info)))
        _unpack(plan, tree, shown)


def _extract_tar(archive: Path, tree: Path, shown: str) -> None:
    limit_members = int(current_app.config["MAX_ARCHIVE_MEMBERS"])
    archive = _decompressed_tar(archive, shown)
    with tarfile.open(archive, mode="r:") as tf:
        members = []
        for m in tf:
            members.append(m)
            if len(members) > limit_members:
                raise InputError(f"the archive has more than {limit_members} members", shown)
        plan = []
        for m in members:
            rel = member_path(m.name, shown)
            if not (m.isreg() or m.isdir()):
                raise InputError(f"member {m.name[:80]!r} is a link or a special file", shown)
            plan.append((rel, m.isdir(), m.size, lambda m=m: _tar_member(tf, m, shown)))
        _unpack(plan, tree, shown)


def _tar_member(tf: tarfile.TarFile, member: tarfile.TarInfo, shown: str) -> Any:
    src = tf.extractfile(member)
    if src is None:
        raise InputError(f"member {member.name[:80]!r} cannot be read", shown)
    return src


def lzma_error() -> type[Exception]:
    import lzma

    return lzma.LZMAError


def _archive_kind(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(262)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b") or head.startswith(b"BZh") or head.startswith(b"\xfd7zXZ\x00") or \
            head[257:262] == b"ustar":
        return "tar"
    return None


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
    if _has_nul(value):
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
    if _has_nul([*request.form.keys(), *request.form.values(), upload_file.filename or ""]):
        raise InputError("the form contains a NUL character")
    shown = _display_name(upload_file.filename)
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
        with _create_file(raw) as dst:
            shutil.copyfileobj(upload_file.stream, dst, 1 << 20)
        if raw.stat().st_size == 0:
            raise InputError("the file is empty", shown)
        kind = _archive_kind(raw)
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
                (_extract_zip if kind == "zip" else _extract_tar)(raw, tree, shown)
            except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, lzma_error()) as exc:
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
        if len(run_paths(source_path, fmt)) > 1:
            name = None  # a directory of runs: each run keeps its sub-directory's name
        try:
            results = get_registry().register_all(
                source_path, format=fmt, name=name, project=(request.form.get("project") or "").strip() or "default",
                algorithm=(request.form.get("algorithm") or "").strip() or None,
                framework=(request.form.get("framework") or "").strip() or None,
                task=(request.form.get("task") or "").strip() or None, params=_form_json("params"),
                tags=tags or None, code_version=(request.form.get("code_version") or "").strip() or None,
                status=status, on_disorder=on_disorder, replace=_form_bool("replace"),
                semantics=_semantics(_form_json("semantics")),
            )
        except InputError as exc:
            raise _rewrite(exc, mapping) from None
        except (UnicodeError, ValueError, OSError) as exc:
            raise InputError(f"cannot read the upload: {exc}", shown) from None
        ok = True
    finally:
        if not ok:
            shutil.rmtree(workdir, ignore_errors=True)
    result = results[0]
    for registered in results:
        _audit("upload", registered.run_id)
    out = clean(result.to_dict())
    out["file"] = shown
    if len(results) > 1:
        out["runs"] = [clean(r.to_dict()) for r in results]
    response = jsonify(out)
    response.headers["Location"] = url_for("api.run", ref=result.run_id)
    return response, 201


__all__ = ["bp", "member_path", "parse_points"]
