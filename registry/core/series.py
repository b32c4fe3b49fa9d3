"""Accumulating points into per-key arrays, enforcing the step-order policy, and summarising.

A series' steps never decrease, but a step may hold several points: trainers log once per
finished episode at the global step (CleanRL, with vectorised environments), or log an
evaluation round and a training entry at the same step. Every point is kept, in logging order;
readers that need one value per step (curves, smoothing, similarity, diagnosis) take
``SeriesData.per_step()``, the mean of the step's finite points with their count.

Step-order policy (one per registration):
- ``keep-all`` (default): several points at one step are all kept. A step that goes back
  (a restart from a checkpoint) stops the registration with the file and position, naming
  ``keep-last``. The one repeat that is not data is a schedule logging its unchanged value
  again at the same step (the Trainer repeats ``epoch`` with its evaluation and end-of-training
  entries): that is kept as one point, silently.
- ``error``: any repeated or decreasing step stops the registration; nothing is written.
- ``keep-last``: a repeated step replaces the earlier value (a resumed run that re-logged
  a few steps); a decreasing step drops every stored point at or after that step, as
  TensorBoard does after a restart from a checkpoint. Each such event is reported as a warning.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

import numpy as np

from registry.core.errors import InputError, StepOrderError
from registry.core.jsonsafe import has_unstorable_text
from registry.core.run_fields import DEFAULT_ORDER_POLICY, ORDER_POLICIES


class Point(NamedTuple):
    """One logged value: what every importer yields and the series builder accumulates."""

    key: str            # metric key exactly as logged
    step: int
    value: float        # NaN and +-Inf are legal values and must be passed through
    wall_time: float | None
    position: str       # where in the input this point came from, e.g. "line 17"


# Logged values that are a schedule's position rather than a measurement: the same value
# logged again at the same step is one point, not two.
SCHEDULE_NAMES = frozenset({"epoch", "learning_rate", "lr", "global_step", "step"})


def is_schedule_key(key: str) -> bool:
    """Whether ``key`` (``epoch``, ``train/epoch``, ``train/learning_rate``, ...) names a schedule."""
    return key.rsplit("/", 1)[-1] in SCHEDULE_NAMES
MAX_KEY_LENGTH = 300


@dataclass
class SeriesData:
    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray | None = None
    # Points logged at each step, when several steps hold more than one (see ``per_step``).
    counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def has_repeats(self) -> bool:
        """Whether some step holds more than one point."""
        steps = self.steps
        return len(steps) > 1 and bool((steps[1:] == steps[:-1]).any())

    def per_step(self) -> SeriesData:
        """One point per step: the mean of the step's finite values (NaN where it has none),
        the step's last wall time, and ``counts`` of the points logged at each step.

        The series itself when no step repeats (no copy), so readers call it unconditionally.
        """
        if not self.has_repeats:
            return self
        steps = np.asarray(self.steps)
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
        counts = np.diff(np.r_[starts, len(steps)])
        values = np.asarray(self.values, dtype=np.float64)
        finite = np.isfinite(values)
        sums = np.add.reduceat(np.where(finite, values, 0.0), starts)
        n_finite = np.add.reduceat(finite.astype(np.int64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(n_finite > 0, sums / np.maximum(n_finite, 1), np.nan)
        # A step whose points are all non-finite keeps its first non-finite value (Inf stays Inf).
        all_bad = n_finite == 0
        if all_bad.any():
            means[all_bad] = values[starts[all_bad]]
        walls = None if self.wall_times is None else np.asarray(self.wall_times)[starts + counts - 1]
        return SeriesData(steps[starts], means, walls, counts)
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


def _same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _check_key(key: str, source: str, position: str) -> None:
    if not key or not key.strip():
        raise InputError("empty metric key", source, position)
    if len(key) > MAX_KEY_LENGTH:
        raise InputError(f"metric key longer than {MAX_KEY_LENGTH} characters", source, position)
    if any(ord(c) < 32 for c in key):
        raise InputError(f"metric key {key[:40]!r} contains control characters", source, position)
    if has_unstorable_text(key):
        raise InputError(f"metric key {key[:40]!r} contains a lone surrogate, which no database can store",
                         source, position)


class SeriesBuilder:
    """Collects points in arrival order; each point is held once, in compact arrays."""

    def __init__(self, source: str, policy: str = DEFAULT_ORDER_POLICY):
        if policy not in ORDER_POLICIES:
            raise ValueError(f"step-order policy must be one of {ORDER_POLICIES}")
        self.source = source
        self.policy = policy
        self.warnings: list[str] = []
        self._columns: dict[str, _Column] = {}

    @property
    def key_count(self) -> int:
        return len(self._columns)

    def add(self, point: Point) -> None:
        key, step, value, wall, position = point
        col = self._columns.get(key)
        if col is None:
            _check_key(key, self.source, position)
            col = self._columns[key] = _Column()
        if col.steps and step <= col.steps[-1]:
            last = col.steps[-1]
            if step == last and is_schedule_key(key) and _same_value(value, col.values[-1]):
                return
            if self.policy == "keep-last":
                self._rewind(key, col, step, position)
            elif step < last or self.policy == "error":  # keep-all keeps a repeat of the last step
                what = "duplicate" if step == last else "decreasing"
                hint = ("pass --on-disorder keep-last to drop the points the restarted run logged again, "
                        "as TensorBoard does" if step < last else
                        "pass --on-disorder keep-all to keep every point logged at a step")
                raise StepOrderError(f"{what} step {step} for metric {key!r} (previous step {last}); {hint}",
                                     self.source, position)
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
    """Validate a batch appended through the API: equal lengths, steps that never decrease
    (several points at one step are kept, as from a file)."""
    if steps.shape != values.shape or steps.ndim != 1:
        raise InputError(f"metric {key!r}: steps and values must be 1-D arrays of equal length", source)
    if len(steps) == 0:
        return
    bad = np.flatnonzero(np.diff(steps) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise StepOrderError(
            f"metric {key!r}: step {int(steps[i])} goes back (previous {int(steps[i - 1])})",
            source,
            f"point {i}",
        )
    if after_step is not None and steps[0] < after_step:
        raise StepOrderError(
            f"metric {key!r}: step {int(steps[0])} is before the last stored step {after_step}; "
            "series are append-only",
            source,
        )
