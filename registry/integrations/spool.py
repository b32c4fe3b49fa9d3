"""The spool file: a run that could not reach its registry, kept as JSON Lines until uploaded.

The first line is ``{"kind": "run", "target": ..., "spec": {...}}``; the others are the
records :class:`registry.integrations.stream.StreamingRun` would have sent (``batch`` with its
id, ``outcome``, ``status``), in order. Replaying is idempotent: the run is created under its
own id and every batch keeps its id, so a replay cut short and started again adds nothing twice.
A last line cut off by a crash mid-write is ignored; a bad line elsewhere is an error naming it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Mapping

from registry.core.errors import InputError


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def append_records(path: Path, records: list[Mapping[str, Any]]) -> None:
    if not records:
        return
    lines = []
    for record in records:
        if record.get("kind") == "batch":
            record = {**record, "points": {k: {**p, "values": [_encode(v) for v in p["values"]]}
                                           for k, p in record["points"].items()}}
        lines.append(json.dumps(record, allow_nan=False, separators=(",", ":"), default=str))
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                return  # cut off mid-write by a crash: everything before it is whole
            raise InputError(f"not a spool record: {exc.msg}", str(path), f"line {number}") from None
        if number == 1 and record.get("kind") != "run":
            raise InputError("a spool file starts with its run record", str(path), "line 1")
        if record.get("kind") == "batch":
            for p in record["points"].values():
                p["values"] = [float(v) if v is not None else math.nan for v in p["values"]]
        yield record


def is_closed(path: Path, quiet_seconds: float = 3600.0) -> bool:
    """Whether the run that wrote the spool is over: its last record is a status, or the file has not
    been written to for ``quiet_seconds`` (a process killed before it could write one)."""
    import time

    if time.time() - path.stat().st_mtime > quiet_seconds:
        return True
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - 200))
        tail = handle.read().decode("utf-8", errors="replace").strip().rsplit("\n", 1)[-1]
    try:
        return json.loads(tail).get("kind") == "status"
    except ValueError:
        return False


def read_header(path: Path) -> dict[str, Any]:
    for record in read_records(path):
        return record
    raise InputError("empty spool file", str(path))


def replay(path: Path, target) -> dict[str, int]:
    """Send a spool file's run to ``target`` (a registry.integrations.targets target); counts sent."""
    records = iter(read_records(path))
    header = next(records, None)
    if header is None:
        raise InputError("empty spool file", str(path))
    spec = header["spec"]
    target.create(spec)
    counts = {"batches": 0, "points": 0, "records": 0}
    for record in records:
        target.send(spec["run_id"], record)
        counts["records"] += 1
        if record["kind"] == "batch":
            counts["batches"] += 1
            counts["points"] += sum(len(p["steps"]) for p in record["points"].values())
    return counts
