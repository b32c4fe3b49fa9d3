"""What the tracker-history importers share: a tracker run read lazily, and small readers.

Histories from other trackers (MLflow, trackio, W&B): many runs per store, each registered once.

A tracker's store holds many runs, each with its own id, so these importers do not produce one
``Source`` per path as the log importers do: they yield :class:`HistoryRun` objects, each
registered in its own transaction with ``"<format>:<tracker's run id>"`` hashed as its
fingerprint. A second import of the same store therefore registers nothing new (each run is
reported as already present), and a store that fails half-way keeps the runs registered
before the failure, each whole.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from registry.core.errors import InputError
from registry.core.series import SeriesData

SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass
class HistoryRun:
    """One run of another tracker, its points loaded only when it is registered."""

    format: str
    path: Path | str                            # the store it came from (a URL without its password)
    key: str                                    # the tracker's own run id
    name: str
    load: Callable[[], dict[str, SeriesData]]   # raises InputError naming the file on bad data
    project: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    status: str = "finished"
    scores: dict[str, float] = field(default_factory=dict)
    framework: str | None = None
    warnings: list[str] = field(default_factory=list)   # filled in by load()

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.format}:{self.key}".encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.path} ({self.format} run {self.name!r}, id {self.key})"


def series_from_columns(keys: Sequence[str], steps: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray,
                        walls: Sequence[float] | np.ndarray | None = None,
                        tiebreak: np.ndarray | None = None) -> dict[str, SeriesData]:
    """Group parallel columns by key, each key's points sorted by step; within a step by ``tiebreak``
    (MLflow's timestamps) when given, else in input (logging) order: the sort is stable."""
    if not len(keys):
        return {}
    codes_of: dict[str, int] = {}
    codes = np.fromiter((codes_of.setdefault(k, len(codes_of)) for k in keys), np.int64, len(keys))
    step_arr = np.asarray(steps, dtype=np.int64)
    value_arr = np.asarray(values, dtype=np.float64)
    wall_arr = np.asarray(walls, dtype=np.float64) if walls is not None else None
    sort_keys = (step_arr, codes) if tiebreak is None else (tiebreak, step_arr, codes)
    order = np.lexsort(sort_keys)
    sorted_codes = codes[order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    names = list(codes_of)
    out: dict[str, SeriesData] = {}
    for chunk in np.split(order, bounds):
        out[names[codes[chunk[0]]]] = SeriesData(step_arr[chunk], value_arr[chunk],
                                                 None if wall_arr is None else wall_arr[chunk])
    return out


def check_sqlite(path: Path) -> bool:
    """True for an SQLite database file (by its 16-byte header)."""
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        return handle.read(16) == SQLITE_HEADER


def sqlite_tables(path: Path) -> set[str]:
    """The table names of an SQLite file; InputError naming the file when it cannot be read."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {row[0] for row in conn.execute("select name from sqlite_master where type='table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"the SQLite database cannot be read ({exc}): a partially written or truncated file?",
                         str(path)) from None


def plain_scores(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a summary (scores), nested keys joined with ``/``."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update({f"{key}/{k}": v for k, v in plain_scores(value).items()})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            out[str(key)] = float(value)
    return out
