"""Accumulating points into per-key arrays, enforcing the step-order policy, and summarising.

Step-order policy (one per registration):
- ``error`` (default): a duplicate or decreasing step in a series stops the registration
  with the file and position of the offending point; nothing is written.
- ``keep-last``: a repeated step replaces the earlier value (a resumed run that re-logged
  a few steps); a decreasing step drops every stored point at or after that step, as
  TensorBoard does after a restart from a checkpoint. Each such event is reported as a warning.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .errors import InputError, StepOrderError
from .importers.base import Point

ORDER_POLICIES = ("error", "keep-last")
MAX_KEY_LENGTH = 300


@dataclass
class SeriesData:
    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)

    def between(self, first: float, last: float) -> SeriesData:
        """The points with ``first <= step <= last`` (steps are increasing)."""
        lo = int(np.searchsorted(self.steps, first, side="left"))
        hi = int(np.searchsorted(self.steps, last, side="right"))
        return SeriesData(self.steps[lo:hi], self.values[lo:hi],
                          None if self.wall_times is None else self.wall_times[lo:hi])


@dataclass
class _Column:
    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    walls: array = field(default_factory=lambda: array("d"))
    has_wall: bool = False


def _check_key(key: str, source: str, position: str) -> None:
    if not key or not key.strip():
        raise InputError("empty metric key", source, position)
    if len(key) > MAX_KEY_LENGTH:
        raise InputError(f"metric key longer than {MAX_KEY_LENGTH} characters", source, position)
    if any(ord(c) < 32 for c in key):
        raise InputError(f"metric key {key[:40]!r} contains control characters", source, position)


class SeriesBuilder:
    """Collects points in arrival order; each point is held once, in compact arrays."""

    def __init__(self, source: str, policy: str = "error"):
        if policy not in ORDER_POLICIES:
            raise ValueError(f"step-order policy must be one of {ORDER_POLICIES}")
        self.source = source
        self.policy = policy
        self.warnings: list[str] = []
        self._columns: dict[str, _Column] = {}

    def add(self, point: Point) -> None:
        key, step, value, wall, position = point
        col = self._columns.get(key)
        if col is None:
            _check_key(key, self.source, position)
            col = self._columns[key] = _Column()
        if col.steps and step <= col.steps[-1]:
            if self.policy == "error":
                what = "duplicate" if step == col.steps[-1] else "decreasing"
                raise StepOrderError(
                    f"{what} step {step} for metric {key!r} (previous step {col.steps[-1]}); "
                    "pass --on-disorder keep-last to keep the last value logged for a step",
                    self.source,
                    position,
                )
            self._rewind(key, col, step, position)
        col.steps.append(step)
        col.values.append(value)
        if wall is not None:
            col.has_wall = True
        col.walls.append(math.nan if wall is None else wall)

    def _rewind(self, key: str, col: _Column, step: int, position: str) -> None:
        # Steps are sorted, so the points to drop form a tail: find where it starts.
        # The numpy view is a temporary so the array's buffer is released before the del below.
        cut = int(np.searchsorted(np.frombuffer(col.steps, dtype=np.int64), step, side="left"))
        dropped = len(col.steps) - cut
        del col.steps[cut:], col.values[cut:], col.walls[cut:]
        kind = "repeated" if dropped == 1 else "went back"
        self.warnings.append(f"{self.source}, {position}: step {step} of {key!r} {kind}; "
                             f"kept the later value(s), dropped {dropped}")

    def extend(self, points: Iterable[Point]) -> None:
        for p in points:
            self.add(p)

    def build(self) -> dict[str, SeriesData]:
        out = {}
        for key, col in self._columns.items():
            walls = np.array(col.walls, dtype=np.float64) if col.has_wall else None
            out[key] = SeriesData(np.array(col.steps, dtype=np.int64), np.array(col.values, dtype=np.float64), walls)
        return out

    @property
    def point_count(self) -> int:
        return sum(len(c.steps) for c in self._columns.values())


@dataclass
class Summary:
    count: int
    nan_count: int
    inf_count: int
    first_step: int | None
    last_step: int | None
    first_value: float | None
    last_value: float | None
    min_value: float | None
    max_value: float | None
    finite_sum: float


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def summarize(steps: np.ndarray, values: np.ndarray) -> Summary:
    """Summary columns of a batch of points (NaN and Inf counted, not folded into min/max/mean)."""
    n = len(values)
    nan = np.isnan(values)
    inf = np.isinf(values)
    finite = values[~(nan | inf)]
    return Summary(
        count=n,
        nan_count=int(nan.sum()),
        inf_count=int(inf.sum()),
        first_step=int(steps[0]) if n else None,
        last_step=int(steps[-1]) if n else None,
        # First/last are what was logged; NaN is not representable in every database's float
        # column, so a non-finite endpoint is stored as NULL and shows up in the counts instead.
        first_value=_finite_or_none(values[0]) if n else None,
        last_value=_finite_or_none(values[-1]) if n else None,
        min_value=float(finite.min()) if finite.size else None,
        max_value=float(finite.max()) if finite.size else None,
        finite_sum=float(finite.sum()) if finite.size else 0.0,
    )


def check_batch(key: str, steps: np.ndarray, values: np.ndarray, after_step: int | None, source: str) -> None:
    """Validate a batch appended through the API: equal lengths, strictly increasing steps."""
    if steps.shape != values.shape or steps.ndim != 1:
        raise InputError(f"metric {key!r}: steps and values must be 1-D arrays of equal length", source)
    if len(steps) == 0:
        return
    bad = np.flatnonzero(np.diff(steps) <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise StepOrderError(
            f"metric {key!r}: step {int(steps[i])} does not increase (previous {int(steps[i - 1])})",
            source,
            f"point {i}",
        )
    if after_step is not None and steps[0] <= after_step:
        raise StepOrderError(
            f"metric {key!r}: step {int(steps[0])} is not after the last stored step {after_step}; "
            "series are append-only",
            source,
        )
