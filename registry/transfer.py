"""Moving a whole registry between databases (SQLite <-> PostgreSQL), losslessly.

The export is a gzip-compressed JSON Lines file: a header naming the schema revision, then one
line per row of every table, parents before children. Values are tagged where JSON would lose
them: binary chunks as base64, non-finite floats by name, datetimes in ISO 8601 with their
offset. Python's float repr round-trips exactly, so every stored number comes back bit for bit.
"""
from __future__ import annotations

import base64
import gzip
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import Table, func, insert, select, text

from .errors import InputError, RegistryError
from .migrate import current_revision
from .models import Base, DefinitionVersion, Run
from .store import Registry

EXPORT_FORMAT = "rlregistry-export"
EXPORT_VERSION = 1
BATCH_ROWS = 500


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
    return list(Base.metadata.sorted_tables)


def export_registry(registry: Registry, path: str | Path,
                    progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Write every table of ``registry`` to ``path``; returns rows written per table."""
    counts: dict[str, int] = {}
    with gzip.open(path, "wt", encoding="utf-8") as out, registry.engine.connect() as conn:
        header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                  "schema_revision": current_revision(registry.engine), "tables": [t.name for t in _tables()]}
        out.write(json.dumps(header) + "\n")
        for table in _tables():
            n = 0
            pk = list(table.primary_key.columns)
            for row in conn.execution_options(yield_per=BATCH_ROWS).execute(select(table).order_by(*pk)).mappings():
                out.write(json.dumps({"t": table.name, "r": {k: _encode(v) for k, v in row.items()}},
                                     allow_nan=False) + "\n")
                n += 1
            counts[table.name] = n
            if progress:
                progress(table.name, n)
    return counts


def _read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"not valid JSON ({exc.msg})", str(path), f"line {lineno}") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"not a readable export file ({exc})", str(path)) from None


def _is_pristine(registry: Registry) -> bool:
    """No runs, and the dictionary is still the untouched shipped default."""
    with registry.read() as s:
        if s.scalar(select(func.count()).select_from(Run)):
            return False
        edited = s.scalar(select(func.count()).select_from(DefinitionVersion).where(DefinitionVersion.version > 1))
        return not edited


def import_registry(registry: Registry, path: str | Path) -> dict[str, int]:
    """Load an export into an empty registry (one transaction); returns rows read per table."""
    path = Path(path)
    lines = _read_lines(path)
    try:
        _, header = next(lines)
    except StopIteration:
        raise InputError("empty export file", str(path)) from None
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise InputError("not an rlregistry export (missing header)", str(path), "line 1")
    revision = current_revision(registry.engine)
    if header.get("schema_revision") != revision:
        raise InputError(
            f"export is at schema revision {header.get('schema_revision')!r} but this registry is at {revision!r}; "
            "upgrade the older side first (rlreg init)", str(path), "line 1")
    if not _is_pristine(registry):
        raise RegistryError("the target registry already holds runs or an edited dictionary; import into a new one")
    tables = {t.name: t for t in _tables()}
    counts: dict[str, int] = {name: 0 for name in tables}
    with registry.transaction() as session:
        # The target was seeded with the shipped dictionary on creation: the export's replaces it.
        for table in reversed(_tables()):
            session.execute(table.delete())
        pending: dict[str, list[dict[str, Any]]] = {}
        order = [t.name for t in _tables()]
        for lineno, item in lines:
            name = item.get("t") if isinstance(item, dict) else None
            if name not in tables:
                raise InputError(f"unknown table {name!r}", str(path), f"line {lineno}")
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
        if registry.engine.dialect.name == "postgresql":
            _reset_sequences(session, tables.values())
    return counts


def _reset_sequences(session, tables) -> None:  # noqa: ANN001
    """Imported rows carry their ids; move each serial sequence past them."""
    for table in tables:
        for column in table.primary_key.columns:
            if column.autoincrement is True or (column.autoincrement == "auto" and column.type.python_type is int
                                                and len(table.primary_key.columns) == 1):
                session.execute(text(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                    f"COALESCE((SELECT MAX({column.name}) FROM {table.name}), 0) + 1, false)"
                ))

