"""Moving a whole registry between databases (SQLite <-> PostgreSQL), losslessly.

The export is a gzip-compressed JSON Lines file: a header naming the schema revision and the
tables it carries, one line per row of every table (parents before children), and a last line,
the manifest: the row count and a SHA-256 of the row lines of every table. Values are tagged
where JSON would lose them: binary chunks as base64, non-finite floats by name, datetimes in ISO
8601 with their offset. Python's float repr round-trips exactly, so every stored number comes
back bit for bit.

What an export holds: runs with their hyperparameters, tags, outcomes, checkpoints, series and
every point, the metric dictionary with its whole version history, bindings, health baselines,
stored findings and similarity embeddings; and, unless ``without_credentials``, the users with
their password hashes and the API tokens' hashes and scopes (never a token's secret). Web
sessions are never exported.

Import checks the manifest before it commits: a file cut short (even at a line boundary), a
changed or added line, or a missing table is refused naming what does not match, and the target
is left as it was. The export is written to a temporary file beside the target and renamed over
it when complete, so a failed export never leaves a partial file under the target's name.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import Table, func, insert, select
from sqlalchemy.exc import IntegrityError

from registry.core.errors import InputError, RegistryError
from registry.db.migrate import current_revision
from registry.db.dialect import reset_sequences
from registry.db.models import Base, DefinitionVersion, Run
from registry.store.facade import Registry

EXPORT_FORMAT = "rlregistry-export"
EXPORT_VERSION = 2  # 2: the manifest line at the end
BATCH_ROWS = 500
CREDENTIAL_TABLES = frozenset({"users", "api_tokens"})
NEVER_EXPORTED = frozenset({"user_sessions"})


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, dict):
        # Tagged dicts are recognised by their single key; escape user dicts that look like one.
        encoded = {k: _encode(v) for k, v in value.items()}
        return {"$map": encoded} if len(value) == 1 and next(iter(value)).startswith("$") else encoded
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == "$b64":
                return base64.b64decode(inner)
            if tag == "$float":
                return float(inner)
            if tag == "$dt":
                # SQLite hands back naive datetimes; every stored time is UTC.
                moment = datetime.fromisoformat(inner)
                return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
            if tag == "$map":
                return {k: _decode(v) for k, v in inner.items()}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _tables() -> list[Table]:
    return [t for t in Base.metadata.sorted_tables if t.name not in NEVER_EXPORTED]


def export_registry(registry: Registry, path: str | Path, progress: Callable[[str, int], None] | None = None,
                    *, overwrite: bool = False, without_credentials: bool = False) -> dict[str, int]:
    """Write every table of ``registry`` to ``path``; returns rows written per table.

    Refuses an existing ``path`` unless ``overwrite``, and a directory that does not exist.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory; name a file to write", str(path))
    if path.exists() and not overwrite:
        raise InputError("exists already; choose another name or overwrite it with --force", str(path))
    if not path.parent.is_dir():
        raise InputError(f"directory {str(path.parent)!r} does not exist", str(path))
    tables = [t for t in _tables() if not (without_credentials and t.name in CREDENTIAL_TABLES)]
    counts: dict[str, int] = {}
    digests: dict[str, str] = {}
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write there ({exc.strerror})", str(path)) from None
    try:
        with os.fdopen(handle, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8") as out, \
                registry.engine.connect() as conn:
            header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                      "schema_revision": current_revision(registry.engine), "tables": [t.name for t in tables],
                      "without_credentials": without_credentials}
            out.write(json.dumps(header) + "\n")
            for table in tables:
                n = 0
                digest = hashlib.sha256()
                pk = list(table.primary_key.columns)
                for row in conn.execution_options(yield_per=BATCH_ROWS).execute(
                        select(table).order_by(*pk)).mappings():
                    line = json.dumps({"t": table.name, "r": {k: _encode(v) for k, v in row.items()}},
                                      allow_nan=False)
                    digest.update(line.encode("utf-8") + b"\n")
                    out.write(line + "\n")
                    n += 1
                counts[table.name] = n
                digests[table.name] = digest.hexdigest()
                if progress:
                    progress(table.name, n)
            manifest = {"manifest": {name: {"rows": counts[name], "sha256": digests[name]} for name in counts}}
            out.write(json.dumps(manifest) + "\n")
        os.replace(temp, path)
    except OSError as exc:
        raise InputError(f"could not write the export ({exc.strerror or exc}); nothing was written", str(path)) \
            from None
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return counts


def _read_lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    yield lineno, line, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"not valid JSON ({exc.msg}); the file is damaged", str(path),
                                     f"line {lineno}") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"not a readable export file, or cut short ({exc})", str(path)) from None


def _is_pristine(registry: Registry) -> bool:
    """No runs, and the dictionary is still the untouched shipped default."""
    with registry.read() as s:
        if s.scalar(select(func.count()).select_from(Run)):
            return False
        edited = s.scalar(select(func.count()).select_from(DefinitionVersion).where(DefinitionVersion.version > 1))
        return not edited


def _verified_header(path: Path, known: dict[str, Table]) -> dict[str, Any]:
    """A first pass over the file: the header, if every table's rows match the manifest; else InputError."""
    lines = _read_lines(path)
    try:
        _, _, header = next(lines)
    except StopIteration:
        raise InputError("empty export file", str(path)) from None
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise InputError("not an rlregistry export (missing header)", str(path), "line 1")
    if header.get("version") != EXPORT_VERSION:
        raise InputError(f"export format version {header.get('version')!r}; this version reads {EXPORT_VERSION} "
                         "(with a manifest): export again with this version", str(path), "line 1")
    carried = header.get("tables")
    if not isinstance(carried, list) or any(name not in known for name in carried):
        unknown = [n for n in carried or [] if n not in known] if isinstance(carried, list) else carried
        raise InputError(f"the header lists tables this registry does not have: {unknown!r}", str(path), "line 1")
    counts = {name: 0 for name in carried}
    digests = {name: hashlib.sha256() for name in carried}
    manifest = None
    last_line = 1
    for lineno, raw, item in lines:
        last_line = lineno
        if manifest is not None:
            raise InputError("a line after the manifest; the file was altered", str(path), f"line {lineno}")
        if isinstance(item, dict) and "manifest" in item:
            manifest = item["manifest"]
            continue
        name = item.get("t") if isinstance(item, dict) else None
        if name not in counts or not isinstance(item.get("r"), dict):
            raise InputError(f"a row of table {name!r}, which the header does not list", str(path), f"line {lineno}")
        digests[name].update(raw.rstrip("\n").encode("utf-8") + b"\n")
        counts[name] += 1
    _check_manifest(manifest, counts, digests, path, last_line)
    return header


def import_registry(registry: Registry, path: str | Path) -> dict[str, int]:
    """Load an export into an empty registry (one transaction); returns rows read per table.

    The whole file is checked against its manifest first, so a cut or altered export changes nothing.
    """
    path = Path(path)
    known = {t.name: t for t in _tables()}
    header = _verified_header(path, known)
    revision = current_revision(registry.engine)
    if header.get("schema_revision") != revision:
        raise InputError(
            f"export is at schema revision {header.get('schema_revision')!r} but this registry is at {revision!r}; "
            "upgrade the older side first (rlreg init)", str(path), "line 1")
    if not _is_pristine(registry):
        raise RegistryError("the target registry already holds runs or an edited dictionary; import into a new one")
    order = [t.name for t in _tables() if t.name in header["tables"]]
    tables = {name: known[name] for name in order}
    counts: dict[str, int] = {name: 0 for name in order}
    lines = _read_lines(path)
    next(lines)
    try:
        with registry.transaction() as session:
            # The target was seeded with the shipped dictionary on creation: the export's replaces it.
            # Tables the export does not carry (its users, without credentials) are left as they are.
            for name in reversed(order):
                session.execute(tables[name].delete())
            pending: dict[str, list[dict[str, Any]]] = {}
            for _, _, item in lines:
                if "manifest" in item:
                    break
                name = item["t"]
                # Rows arrive parents first; flush a table's batch before any later table's rows.
                for earlier in order[: order.index(name)]:
                    if pending.get(earlier):
                        session.execute(insert(tables[earlier]), pending.pop(earlier))
                batch = pending.setdefault(name, [])
                batch.append({k: _decode(v) for k, v in item["r"].items()})
                counts[name] += 1
                if len(batch) >= BATCH_ROWS:
                    session.execute(insert(tables[name]), pending.pop(name))
            for name in order:
                if pending.get(name):
                    session.execute(insert(tables[name]), pending.pop(name))
            reset_sequences(session, tables.values())
    except IntegrityError as exc:  # rows that match their manifest but not each other (made by hand)
        raise InputError(f"the rows do not fit together ({exc.orig}); nothing was imported", str(path)) from None
    return counts


def _check_manifest(manifest: Any, counts: dict[str, int], digests: dict[str, Any], path: Path,
                    last_line: int) -> None:
    """Refuse the import (the transaction rolls back) unless every table is exactly as exported."""
    if not isinstance(manifest, dict):
        last = next((name for name in reversed(list(counts)) if counts[name]), None)
        raise InputError(f"the export is incomplete: it ends at line {last_line} without its manifest "
                         f"(cut short{f' in or after table {last!r}' if last else ''}); nothing was imported",
                         str(path))
    problems = []
    for name in sorted(set(manifest) - set(counts)):
        problems.append(f"table {name!r} is in the manifest but not in the header")
    for name, got in counts.items():
        expected = manifest.get(name)
        if not isinstance(expected, dict):
            problems.append(f"table {name!r} is missing from the manifest")
            continue
        if expected.get("rows") != got:
            problems.append(f"{name}: {got} rows, the manifest says {expected.get('rows')}")
        elif expected.get("sha256") != digests[name].hexdigest():
            problems.append(f"{name}: the rows differ from the exported ones (checksum mismatch)")
    if problems:
        raise InputError("the export does not match its manifest: " + "; ".join(problems) + "; nothing was imported",
                         str(path))
