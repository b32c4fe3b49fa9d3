"""Tables of metrics: CSV (wide or long) and JSON Lines (W&B history exports and the like).

Wide CSV: a step column (``step``/``Step``, ``global_step``, ``timesteps``, ``timestep``,
``iteration``, else W&B's ``_step``; the first present in that order) and one column per
metric; other step-like columns are kept as metrics. Long CSV:
exactly a step, a key (``key``/``metric``/``tag``/``name``) and a ``value`` column,
plus optionally a wall-time one. In both, an empty cell is a missing point, ``nan`` /
``inf`` spell NaN / Inf, and other text in a numeric column is an InputError naming
the line and column. Whether a wide column is numeric is decided by its first
non-empty cell, so text columns (run names, W&B media references) are skipped with a
warning instead of failing the file, while a number column that later holds text fails.
A pandas index column (empty header or ``Unnamed: 0``) is ignored.

JSONL: one object per line; nested objects are flattened with ``/``; ``_timestamp`` /
``wall_time`` / ``timestamp`` is the wall time; ``null`` is a missing point; strings,
lists and booleans are skipped (counted in ``Source.warnings``), except the strings
``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` some exporters write for non-finite
numbers. W&B's own ``_wandb`` bookkeeping is ignored; ``_runtime`` is kept as a metric.

Positions are ``"line N"`` (physical line, from 1; the header is line 1), plus
``", column 'name'"`` in CSV errors.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Iterator

from registry.core.errors import InputError
from registry.core.series import Point
from registry.importers.base import Source
from registry.importers.textio import numbered_lines
from registry.importers.values import STEP_NAMES, WALL_TIME_NAMES, as_step, as_value, parse_number, pick_column

CSV_FORMAT = "csv"
JSONL_FORMAT = "jsonl"
_KEY_NAMES = ("key", "metric", "tag", "name")
_NON_FINITE = {"nan": math.nan, "infinity": math.inf, "-infinity": -math.inf, "inf": math.inf, "-inf": -math.inf}


# --- sniffing ---------------------------------------------------------------------------

def sniff_csv(path: Path, head: bytes) -> bool:
    """Whether the first line is a CSV header with a step column."""
    if path.is_dir():
        return False
    first = head.decode("utf-8", errors="replace").lstrip("\ufeff").split("\n", 1)[0]
    if "," not in first:
        return False
    try:
        header = next(csv.reader([first]), [])
    except csv.Error:
        return False
    return pick_column(header, STEP_NAMES) is not None


def first_json_object(path: Path, head: bytes) -> dict[str, Any] | None:
    """The file's first line as a JSON object, when it is one (a pretty-printed document's is not)."""
    if path.is_dir():
        return None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return None
    try:
        first = json.loads(text.split("\n", 1)[0])
    except (ValueError, RecursionError):
        return None
    return first if isinstance(first, dict) else None


def sniff_jsonl(path: Path, head: bytes) -> bool:
    """Whether the first line is a complete JSON object."""
    return first_json_object(path, head) is not None


# --- CSV --------------------------------------------------------------------------------

def open_csv(path: Path) -> Source:
    """A Source over a wide or long CSV file."""
    source = Source(path=path, format=CSV_FORMAT, points=lambda: iter(()), name=_run_name(path), files=[path])

    def points() -> Iterator[Point]:
        source.warnings.clear()
        yield from _csv_points(path, source.warnings, source.layout)

    source.points = points
    return source


def _csv_points(path: Path, warnings: list[str], recorded: dict[str, Any]) -> Iterator[Point]:
    name = str(path)
    lines = (text for _, text in numbered_lines(path))
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
        if header is None:
            return
        layout = _Layout(header, name)
        recorded["step column"] = header[layout.step].strip()
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            position = f"line {reader.line_num}"
            if len(row) != len(header):
                raise InputError(f"row has {len(row)} cells but the header has {len(header)}", name, position)
            yield from layout.points(row, position, warnings)
        warnings.extend(layout.stepless_report(name, header[layout.step].strip()))
    except csv.Error as exc:
        raise InputError(f"malformed CSV ({exc})", name, f"line {reader.line_num}") from None


def _run_name(path: Path) -> str | None:
    """The file's stem, or its directory's name for a logger's fixed file name (SB3's progress.csv)."""
    if path.stem.lower() in ("progress", "metrics", "history", "wandb_history") and path.parent.name:
        return path.parent.name
    return path.stem or None


class _Layout:
    """Which column is what, decided from the header (and, for wide files, first values)."""

    def __init__(self, header: list[str], source: str):
        self.header = header
        self.source = source
        names = [h.strip() for h in header]
        seen: set[str] = set()
        for column in names:
            if column and column in seen:
                raise InputError(f"duplicate column {column!r}", source, "line 1")
            seen.add(column)
        step = pick_column(names, STEP_NAMES)
        if step is None:
            raise InputError(
                "no step column (expected one of: " + ", ".join(STEP_NAMES) + ")", source, "line 1"
            )
        self.step = names.index(step)
        wall = pick_column(names, WALL_TIME_NAMES)
        self.wall = names.index(wall) if wall is not None else None
        key = pick_column(names, _KEY_NAMES)
        value = pick_column(names, ("value",))
        used = {self.step, self.wall}
        others = [i for i, n in enumerate(names) if i not in used and not _is_index_column(n)]
        self.long = key is not None and value is not None and len(others) == 2
        if self.long:
            self.key, self.value = names.index(key), names.index(value)
        self.metrics = others
        self.numeric: dict[int, bool] = {}  # wide column -> numeric?, decided on first value
        # A trainer step column next to W&B's own counter: a row without the trainer step
        # (a summary or system row) has no place on the trainer's axis.
        self.counter = pick_column(names, ("_step",))
        self.carry = _StepCarry() if self.counter is not None and self.counter != step else None

    def stepless_report(self, source: str, step_name: str) -> list[str]:
        return self.carry.report(source, step_name) if self.carry else []

    def points(self, row: list[str], position: str, warnings: list[str]) -> Iterator[Point]:
        carried = self.carry is not None and not row[self.step].strip()
        if carried:
            step = self.carry.missing(position)
            if step is None:
                return
        else:
            step = as_step(row[self.step], self.source, self._at(position, self.step))
            if self.carry is not None:
                self.carry.last = step
        wall = self._wall_time(row, position)
        if self.long:
            cell = row[self.value].strip()
            if cell:
                key = row[self.key].strip()
                if not key:
                    raise InputError("empty metric name", self.source, self._at(position, self.key))
                yield Point(key, step, self._number(cell, position, self.value), wall, position)
            return
        for column in self.metrics:
            cell = row[column].strip()
            if not cell or (carried and self.header[column].strip().startswith("_")):
                continue  # a carried row's own logger counters (_step, _runtime) would clash
            if column not in self.numeric:
                self.numeric[column] = parse_number(cell) is not None
                if not self.numeric[column]:
                    warnings.append(
                        f"{self.source}, {position}: column {self.header[column]!r} holds text "
                        f"({_clip(cell)!r}); skipped"
                    )
            if self.numeric[column]:
                yield Point(self.header[column].strip(), step, self._number(cell, position, column), wall, position)

    def _wall_time(self, row: list[str], position: str) -> float | None:
        if self.wall is None or not row[self.wall].strip():
            return None
        return self._number(row[self.wall].strip(), position, self.wall)

    def _number(self, cell: str, position: str, column: int) -> float:
        number = parse_number(cell)
        if number is None:
            raise InputError(f"expected a number, got {_clip(cell)!r}", self.source, self._at(position, column))
        return number

    def _at(self, position: str, column: int) -> str:
        return f"{position}, column {self.header[column].strip()!r}"


class _StepCarry:
    """W&B rows without the trainer's step (the Trainer logs eval results in their own call)
    are placed at the last trainer step logged before them: the step training was at. Rows
    before any trainer step have no place on that axis and are left out; both are reported."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.placed: list[str] = []
        self.dropped: list[str] = []

    def missing(self, position: str) -> int | None:
        (self.placed if self.last is not None else self.dropped).append(position)
        return self.last

    def report(self, source: str, step_name: str) -> list[str]:
        out = []
        if self.placed:
            out.append(f"{source}: {len(self.placed)} row(s) without {step_name!r} (first: {self.placed[0]}) placed "
                       f"at the last {step_name} logged before them (their own _step/_runtime counters left out)")
        if self.dropped:
            out.append(f"{source}: {len(self.dropped)} row(s) before the first {step_name!r} (first: "
                       f"{self.dropped[0]}) have no place on the trainer's step axis; left out")
        return out


def _is_index_column(name: str) -> bool:
    return name == "" or name.startswith("Unnamed: ")


# --- JSONL ------------------------------------------------------------------------------

def open_jsonl(path: Path) -> Source:
    """A Source over a JSON Lines file, one object per logging call."""
    source = Source(path=path, format=JSONL_FORMAT, points=lambda: iter(()), name=_run_name(path), files=[path])

    def points() -> Iterator[Point]:
        source.warnings.clear()
        skipped: dict[str, str] = {}
        yield from _jsonl_points(path, skipped, source.layout, source.warnings)
        if skipped:
            shown = ", ".join(f"{k!r} ({where})" for k, where in list(skipped.items())[:10])
            source.warnings.append(f"skipped non-numeric values in {len(skipped)} keys: {shown}")

    source.points = points
    return source


def _jsonl_points(path: Path, skipped: dict[str, str], recorded: dict[str, Any] | None = None,
                  warnings: list[str] | None = None) -> Iterator[Point]:
    name = str(path)
    step_key: str | None = None
    carry: _StepCarry | None = None
    for number, text in numbered_lines(path):
        if not text.strip():
            continue
        position = f"line {number}"
        row = _json_object(text, name, position)
        flat = dict(flatten_record(row))
        if step_key is None:
            step_key = pick_column(list(flat), STEP_NAMES)
            if step_key is None:
                raise InputError("no step key (expected one of: " + ", ".join(STEP_NAMES) + ")", name, position)
            if recorded is not None:
                recorded["step column"] = step_key
            if step_key != "_step" and "_step" in flat:
                carry = _StepCarry()
        carried = flat.get(step_key) is None
        if carried:
            if carry is None:
                raise InputError(f"no {step_key!r} in this line", name, position)
            step = carry.missing(position)
            if step is None:
                continue
            # A carried row's own logger counters (_step, _runtime) would clash with the row it joins.
            flat = {k: v for k, v in flat.items() if not k.startswith("_")}
        else:
            step = as_step(flat[step_key], name, position)
            if carry is not None:
                carry.last = step
        wall = _json_wall_time(row, name, position)
        for key, value in flat.items():
            if key == step_key or key.lower() in WALL_TIME_NAMES or key.startswith("_wandb"):
                continue
            number = json_number(value, name, position)
            if number is not None:
                yield Point(key, step, number, wall, position)
            elif value is not None:
                skipped.setdefault(key, position)
    if carry is not None and warnings is not None:
        warnings.extend(carry.report(name, step_key))


def _json_object(text: str, source: str, position: str) -> dict[str, Any]:
    try:
        row = json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", source, position) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not valid JSON: {exc}", source, position) from None
    if not isinstance(row, dict):
        raise InputError(f"expected a JSON object, got {type(row).__name__}", source, position)
    return row


def _json_wall_time(row: dict[str, Any], source: str, position: str) -> float | None:
    key = pick_column(list(row), WALL_TIME_NAMES)
    if key is None or row[key] is None:
        return None
    number = json_number(row[key], source, position)
    if number is None:
        raise InputError(f"wall time {key!r} is not a number", source, position)
    return number


def json_number(value: Any, source: str, position: str) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return as_value(value, source, position)
    if isinstance(value, str):
        return _NON_FINITE.get(value.strip().lower())
    return None


def flatten_record(row: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``("a/b", v)`` for ``{"a": {"b": v}}``, in document order.

    Iterative, because json.loads accepts nesting deeper than Python's recursion limit.
    """
    stack = [("", iter(row.items()))]
    while stack:
        prefix, items = stack[-1]
        for key, value in items:
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                stack.append((f"{name}/", iter(value.items())))
                break
            yield name, value
        else:
            stack.pop()


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
