"""verl console logs: the ``step:N - key:value - key:value`` lines of its console logger.

Under Ray each line carries the actor prefix ``(TaskRunner pid=123) `` (often wrapped
in ANSI colour codes) and sometimes a ``[repeated 3x across cluster]`` suffix; both are
stripped. Everything that is not a metric record (Ray start-up, config dumps, tqdm
bars) is ignored.

Long records get wrapped by whatever captured the console (terminal width, ``fold``,
container log splitters), even in the middle of a key or number. A physical line
continues the open record when it is shaped like a fragment of one: no whitespace
except around `` - `` separators, and every piece after the first starting ``key:``.
Pieces are joined with nothing in between, so a split ``-8.1e`` / ``-06`` rejoins.
When a wrap loses the spaces around a separator (``0.42 -`` trimmed then ``critic``),
the separator pattern still finds it.

verl prints only numbers, but forks log strings or lists too: those values are
skipped, counted and reported in ``Source.warnings`` after a pass. numpy 2 reprs
such as ``np.float64(0.5)`` (what ``pprint.pformat`` gives for numpy scalars) are
unwrapped. A step that is not an integer is an InputError.

Positions are ``"line N"`` of the physical line where the key:value pair starts.
"""
from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Iterator

from registry.core.series import Point
from registry.importers.base import Source
from registry.importers.textio import numbered_lines
from registry.importers.values import as_step, parse_number

FORMAT = "verl_log"
_SNIFF_LIMIT = 16 * 1024 * 1024  # verl prints its whole config before step 1

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s?")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# " - " between pairs; also " -key" and "value- " where a wrap ate one of the spaces.
# A dash inside a pair ("kl:-8.1e-06") never has whitespace next to it.
_SEPARATOR = re.compile(r"\s+-\s+|\s+-(?=[A-Za-z_])|(?<=\S)-\s+")
_KEY_START = re.compile(r"^[^\s:]+:")
# "step:12 - ..." or a bare "step:12"; "step: starting rollout" is prose, not a record.
_RECORD_START = re.compile(r"^step:\S*(?:\s+-(?:\s|$)|\s*$)")
_SNIFF_RECORD = re.compile(r"^step:\s*\d+\s+-\s+[^\s:]+:")
_NUMPY_SCALAR = re.compile(r"^(?:np|numpy)\.(?:float|int|uint)\d*\((.*)\)$")


def sniff(path: Path, head: bytes) -> bool:
    """Whether a ``step:N - key:value`` record appears in the first 16 MB of the file."""
    if path.is_dir():
        return False
    read = 0
    for _, line in numbered_lines(path, errors="replace"):
        read += len(line)
        if _SNIFF_RECORD.match(clean_line(line)):
            return True
        if read > _SNIFF_LIMIT:
            break
    return False


def open_verl_log(path: Path) -> Source:
    """A Source over the metric records of a verl console log."""
    source = Source(path=path, format=FORMAT, points=lambda: iter(()), framework="verl",
                    name=path.stem or None, files=[path])

    def points() -> Iterator[Point]:
        skipped = _Skipped()
        source.warnings.clear()
        for record in _records(path):
            yield from _record_points(record, str(path), skipped)
        source.warnings.extend(skipped.messages())

    source.points = points
    return source


class _Record:
    """One logical record: the joined text and where each physical line starts in it."""

    def __init__(self, line_number: int, text: str):
        self.text = text
        self.starts = [0]
        self.lines = [line_number]

    def extend(self, line_number: int, text: str) -> None:
        self.starts.append(len(self.text))
        self.lines.append(line_number)
        self.text += text

    def line_at(self, offset: int) -> int:
        return self.lines[bisect.bisect_right(self.starts, offset) - 1]


def _records(path: Path) -> Iterator[_Record]:
    record: _Record | None = None
    for number, line in numbered_lines(path, errors="replace"):
        body = clean_line(line)
        if starts_record(body):
            if record is not None:
                yield record
            record = _Record(number, body)
        elif record is not None and continues_record(body):
            record.extend(number, body)
        elif record is not None:
            yield record
            record = None
    if record is not None:
        yield record


# The line-level rules below are public: ``registry.integrations.follow`` parses a growing log with them, a
# line at a time, so a followed log and a registered one are read alike.

def clean_line(line: str) -> str:
    """A physical line without its line ending, ANSI colours and Ray decorations (``(TaskRunner
    pid=1)`` prefix, ``[repeated 3x across cluster]`` suffix)."""
    text = _ANSI.sub("", line.rstrip("\r\n"))
    text = _RAY_PREFIX.sub("", text, count=1)
    return _RAY_REPEATED.sub("", text)


def starts_record(body: str) -> bool:
    """Whether a cleaned line opens a metric record (``step:12 - ...`` or a bare ``step:12``)."""
    return bool(_RECORD_START.match(body))


def continues_record(body: str) -> bool:
    """Whether a cleaned line is a wrapped fragment of the open record (see the module docstring)."""
    pieces = [piece for piece in _SEPARATOR.split(body.strip().removeprefix("- ")) if piece]
    if not pieces or _has_space(pieces[0]):
        return False  # prose, a tqdm bar, a config dump
    # Pieces in between must be whole "key:value" pairs; the first and the last may be
    # fragments cut at a wrap ("-06", "response_le").
    *middle, last = pieces[1:] or [""]
    if not all(_KEY_START.match(piece) for piece in middle):
        return False
    return not last or bool(_KEY_START.match(last)) or not _has_space(last)


def _has_space(text: str) -> bool:
    return any(ch.isspace() for ch in text)


class _Skipped:
    """Non-numeric values seen in one pass, by key, with the first line of each."""

    def __init__(self) -> None:
        self.count = 0
        self.first_line: dict[str, int] = {}

    def add(self, key: str, line: int) -> None:
        self.count += 1
        self.first_line.setdefault(key, line)

    def messages(self) -> list[str]:
        if not self.count:
            return []
        shown = ", ".join(f"{key!r} (line {line})" for key, line in list(self.first_line.items())[:10])
        more = f" and {len(self.first_line) - 10} more" if len(self.first_line) > 10 else ""
        return [f"skipped {self.count} non-numeric values in {len(self.first_line)} keys: {shown}{more}"]


def _record_points(record: _Record, source: str, skipped: _Skipped) -> Iterator[Point]:
    pairs = list(record_pairs(record.text))
    step_offset, _, step_text = pairs[0]
    step = as_step(step_text, source, f"line {record.line_at(step_offset)}")
    for offset, key, text in pairs[1:]:
        line = record.line_at(offset)
        value = console_number(text)
        if value is None:
            skipped.add(key, line)
        else:
            yield Point(key, step, value, None, f"line {line}")


def record_pairs(text: str) -> Iterator[tuple[int, str, str]]:
    """``(offset, key, value_text)`` for each ``key:value`` piece; the first is ``step``."""
    offset = 0
    for match in [*_SEPARATOR.finditer(text), None]:
        end = match.start() if match else len(text)
        piece = text[offset:end]
        key, colon, value = piece.partition(":")
        if colon and key.strip():
            yield offset, key.strip(), value.strip()
        offset = match.end() if match else end


def console_number(text: str) -> float | None:
    """A value's text as a float (numpy reprs like ``np.float64(0.5)`` unwrapped); None if not a number."""
    wrapped = _NUMPY_SCALAR.match(text)
    return parse_number(wrapped.group(1) if wrapped else text)
