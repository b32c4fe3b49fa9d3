"""What an interactive plot draws for one series over a step range, reduced to the plot's width.

The browser asks for the range it shows (everything at first, the zoomed range after a drag)
and the number of pixels it has; the server reduces only that range (MinMaxLTTB), so a spike
inside a zoomed range is always among the returned points, however long the series.

As on the PNG plots: the smoothed line runs over one point per step (the mean of the step's
finite points), computed on the full series before any reduction; the raw points are returned
separately only where some step holds several (else the per-step values *are* the raw points).
The x-axis may be the step, the fraction of training, the wall time since the series' first
point (hours), or any monotone counter the run logs (tokens, samples, env steps), read at each
step by linear interpolation between its own logged steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from registry.core.errors import InputError
from registry.core.series import SeriesData
from registry.web import smoothing
from registry.web.curves import int_arg
from registry.core.downsample import MAX_POINTS, downsample_indices

X_AXES = ("step", "fraction", "wall")
COUNTER_PREFIX = "counter:"
# Names of logged counters worth offering as an x-axis (matched anywhere in the raw key).
COUNTER_HINTS = ("token", "sample", "step", "episode", "frame", "flos", "epoch", "num_", "env")
DEFAULT_POINTS = 1000


@dataclass(frozen=True)
class ViewRequest:
    """The part of a series a plot shows: step range (inclusive, None = open), pixels, smoothing, x-axis."""

    from_step: float | None = None
    to_step: float | None = None
    points: int = DEFAULT_POINTS
    method: str = "ema"
    window: int | None = None
    x_axis: str = "step"

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> ViewRequest:
        method = (args.get("smooth") or "ema").strip().lower()
        if method == "centered":
            method = "centred"
        if method not in smoothing.METHODS:
            raise InputError(f"smooth must be one of {', '.join(smoothing.METHODS)}; got {method!r}")
        x_axis = (args.get("x") or "step").strip()
        if x_axis not in X_AXES and not (x_axis.startswith(COUNTER_PREFIX) and len(x_axis) > len(COUNTER_PREFIX)):
            raise InputError(f"x must be one of {', '.join(X_AXES)} or counter:KEY; got {x_axis!r}")
        lo, hi = step_arg(args, "from_step"), step_arg(args, "to_step")
        if lo is not None and hi is not None and hi < lo:
            raise InputError(f"to_step ({hi:g}) must not be below from_step ({lo:g})")
        return cls(from_step=lo, to_step=hi, points=int_arg(args, "points", DEFAULT_POINTS, 10, MAX_POINTS),
                   method=method, window=int_arg(args, "window", None, 1, smoothing.MAX_WINDOW), x_axis=x_axis)

    def key(self) -> tuple:
        return (self.from_step, self.to_step, self.points, self.method, self.window, self.x_axis)


def step_arg(args: Mapping[str, str], name: str) -> float | None:
    """A step bound: a finite number (a zoomed range's edge need not be a whole step)."""
    raw = (args.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name} must be a number; got {raw!r}") from None
    if not math.isfinite(value):
        raise InputError(f"{name} must be finite; got {raw!r}")
    return value


def step_range(steps: np.ndarray, lo: float | None, hi: float | None) -> slice:
    """The slice of increasing ``steps`` with ``lo <= step <= hi``."""
    start = 0 if lo is None else int(np.searchsorted(steps, lo, side="left"))
    stop = len(steps) if hi is None else int(np.searchsorted(steps, hi, side="right"))
    return slice(start, max(start, stop))


def counter_curve(data: SeriesData, key: str) -> tuple[np.ndarray, np.ndarray]:
    """A logged counter as (steps, values), one per step; InputError unless it never decreases."""
    per = data.per_step()
    steps, values = np.asarray(per.steps), np.asarray(per.values, dtype=np.float64)
    ok = np.isfinite(values)
    steps, values = steps[ok], values[ok]
    if len(values) < 2:
        raise InputError(f"the counter {key!r} has fewer than 2 finite points: it cannot be an x-axis")
    if (np.diff(values) < 0).any():
        at = int(steps[1:][np.diff(values) < 0][0])
        raise InputError(f"the counter {key!r} decreases at step {at}: only a monotone counter can be an x-axis")
    return steps, values


def x_mapper(view: ViewRequest, data: SeriesData, run_length: float,
             counter: tuple[np.ndarray, np.ndarray] | None) -> tuple[Any, str]:
    """A function step array -> x array for the chosen axis, and the axis title."""
    if view.x_axis == "step":
        return None, "step"
    if view.x_axis == "fraction":
        scale = run_length if run_length > 0 else 1.0
        return (lambda s: np.asarray(s, dtype=np.float64) / scale), "fraction of training"
    if view.x_axis == "wall":
        walls = None if data.wall_times is None else np.asarray(data.wall_times, dtype=np.float64)
        ok = None if walls is None else np.isfinite(walls)
        if walls is None or ok.sum() < 1:
            raise InputError("this series has no wall times: choose another x-axis")
        ws, wv = np.asarray(data.steps)[ok], walls[ok]
        start = float(wv.min())
        return (lambda s: (np.interp(np.asarray(s, dtype=np.float64), ws, wv) - start) / 3600.0), \
            "wall time since the first point (h)"
    assert counter is not None
    cs, cv = counter
    key = view.x_axis[len(COUNTER_PREFIX):]
    return (lambda s: np.interp(np.asarray(s, dtype=np.float64), cs.astype(np.float64), cv)), key


def _floats(values: np.ndarray) -> list[float | None]:
    out = values.tolist()
    if not np.isfinite(values).all():
        out = [v if math.isfinite(v) else None for v in out]
    return out


def view_data(data: SeriesData, sign: float, view: ViewRequest, window: int, *, run_length: float = 1.0,
              counter: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """The JSON body of one interactive plot request (see ``openapi.yaml``, ``PlotView``)."""
    steps = np.asarray(data.steps)
    values = np.asarray(data.values, dtype=np.float64)
    if sign != 1.0:
        values = values * sign
    finite = np.isfinite(values)
    x, y = steps[finite], values[finite]
    per = SeriesData(x, y).per_step()
    line_steps, line_values, counts = np.asarray(per.steps), np.asarray(per.values, dtype=np.float64), per.counts
    smoothed = smoothing.smooth(line_values, view.method, window) if line_values.size else None
    to_x, x_title = x_mapper(view, data, run_length, counter)

    rng = step_range(line_steps, view.from_step, view.to_step)
    ls, lv = line_steps[rng], line_values[rng]
    idx = downsample_indices(ls, lv, view.points)
    pick = (lambda a: a[rng]) if idx is None else (lambda a: a[rng][idx])
    line: dict[str, Any] = {"steps": pick(line_steps).tolist(), "values": _floats(pick(line_values))}
    if smoothed is not None:
        line["smoothed"] = _floats(pick(smoothed))
    if counts is not None:
        line["counts"] = pick(counts).tolist()
    if to_x is not None:
        line["x"] = _floats(to_x(pick(line_steps)))
    body: dict[str, Any] = {
        "from_step": view.from_step, "to_step": view.to_step, "x_axis": view.x_axis, "x_title": x_title,
        "smoothing": {"method": view.method, "window": window,
                      "description": smoothing.describe(view.method, window)},
        "total": int(len(steps)), "in_range": int(len(ls)), "returned": len(line["steps"]),
        "downsampled": idx is not None, "repeated_steps": counts is not None,
        "first_step": int(steps[0]) if len(steps) else None, "last_step": int(steps[-1]) if len(steps) else None,
        "line": line,
    }
    if counts is not None:
        # Several points at some step: every point is drawn as a dot under the per-step line.
        rrng = step_range(x, view.from_step, view.to_step)
        rx, ry = x[rrng], y[rrng]
        ridx = downsample_indices(rx, ry, view.points)
        if ridx is not None:
            rx, ry = rx[ridx], ry[ridx]
        body["raw"] = {"steps": rx.tolist(), "values": ry.tolist(),
                       **({"x": _floats(to_x(rx))} if to_x is not None else {})}
    bad = steps[~finite]
    if len(bad):
        bad = bad[step_range(bad, view.from_step, view.to_step)]
        if len(bad) > 600:  # a tick per pixel-ish bin is enough to show where they are
            bad = bad[np.linspace(0, len(bad) - 1, 600).astype(np.int64)]
        body["nonfinite"] = {"steps": bad.tolist(), **({"x": _floats(to_x(bad))} if to_x is not None else {})}
    return body
