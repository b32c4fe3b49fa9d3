"""verl's ``file`` logger backend: JSON Lines ``{"step": N, "data": {"actor/pg_loss": ..., ...}}``.

``verl/utils/tracking.py`` (``FileLogger.log``, verl 0.8.0.dev, b178a3cd) writes one
``orjson.dumps({"step": step, "data": data})`` line per training step to
``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``, unbuffered, so a run still in progress
leaves a last line cut mid-record. ``data`` is the envelope, not part of the keys: they are
read as verl logged them (``actor/kl_loss``, not ``data/actor/kl_loss``), and the envelope is
recorded on the run's layout.

A last line that is not complete JSON (no newline at its end) is a record still being
written: the complete records are registered and the partial line is reported as a warning.
The same damage anywhere else is an InputError naming the line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from registry.core.errors import InputError
from registry.core.series import Point
from registry.importers.base import Source
from registry.importers.tabular import first_json_object, flatten_record, json_number
from registry.importers.textio import numbered_lines
from registry.importers.values import as_step

FORMAT = "verl_file"


def sniff(path: Path, head: bytes) -> bool:
    """Whether the first line is a ``{"step": N, "data": {...}}`` record."""
    first = first_json_object(path, head)
    return first is not None and set(first) == {"step", "data"} and isinstance(first["data"], dict)


def open_verl_file(path: Path) -> Source:
    """A Source over a verl file-backend log."""
    source = Source(path=path, format=FORMAT, points=lambda: iter(()), framework="verl",
                    name=path.stem or None, files=[path],
                    layout={"envelope": 'verl file backend {"step": N, "data": {...}}: keys read from data'})

    def points() -> Iterator[Point]:
        source.warnings.clear()
        skipped: dict[str, str] = {}
        yield from _points(path, skipped, source)
        if skipped:
            shown = ", ".join(f"{k!r} ({where})" for k, where in list(skipped.items())[:10])
            source.warnings.append(f"skipped non-numeric values in {len(skipped)} keys: {shown}")

    source.points = points
    return source


def _points(path: Path, skipped: dict[str, str], source: Source) -> Iterator[Point]:
    name = str(path)
    pending: tuple[int, str] | None = None
    for number, text in numbered_lines(path):
        if pending is not None:
            yield from _record(*pending, name, skipped, last=False, source=source)
            pending = None
        if text.strip():
            pending = (number, text)
    if pending is not None:
        yield from _record(*pending, name, skipped, last=True, source=source)


def _record(number: int, text: str, name: str, skipped: dict[str, str], *, last: bool,
            source: Source) -> Iterator[Point]:
    position = f"line {number}"
    try:
        row: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:
        if last and not text.endswith("\n"):
            source.warnings.append(
                f"{name}, {position}: the last line is an incomplete record (the run is still writing it?); "
                f"registered the complete records before it"
            )
            source.layout["partial last line"] = position
            return
        raise InputError(f"not valid JSON: {exc}", name, position) from None
    if not isinstance(row, dict) or "step" not in row or not isinstance(row.get("data"), dict):
        raise InputError('expected {"step": N, "data": {...}}', name, position)
    step = as_step(row["step"], name, position)
    for key, value in flatten_record(row["data"]):
        number_value = json_number(value, name, position)
        if number_value is not None:
            yield Point(key, step, number_value, None, position)
        elif value is not None:
            skipped.setdefault(key, position)
