"""From stored series to plot specs and exports: smoothing, downsampling, overlays.

Smoothing always runs on the full series; only then are raw and smoothed points reduced
to display size. Overlays use canonical values (the alias sign applied) and refuse to mix
series whose semantics differ: they are drawn in separate styles with a warning naming
the difference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from registry.dictionary.definitions import healthy_range_for
from registry.core.errors import InputError
from registry.core.semantics import FIELD_LABELS, SEMANTIC_FIELDS
from registry.core.series import SeriesData
from registry.web import smoothing
from registry.core.downsample import DISPLAY_POINTS, MAX_POINTS, downsample_indices
from registry.web.plotting import SINGLE_RAW, SINGLE_SMOOTH, PlotSpec, Trace

DEFAULT_WINDOW = 10
ALIGNMENTS = ("step", "fraction")
BANDS = ("minmax", "std")
NORMALIZATIONS = ("zscore", "minmax")
NORMALIZATION_LABELS = {"zscore": "z-score per run", "minmax": "min-max per run"}
GRID_POINTS = 600
MAX_COMPARE_RUNS = 24
# Objective quantities that are shown twice in a comparison: as logged and normalised per run.
NORMALIZED_QUANTITIES = ("reward", "return")


def choice_arg(args: Mapping[str, str], name: str, allowed: Sequence[str], default: str) -> str:
    value = (args.get(name) or default).strip().lower()
    if value == "centered":
        value = "centred"
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def int_arg(args: Mapping[str, str], name: str, default: int | None, low: int, high: int) -> int | None:
    """A whole-number query parameter within [low, high]; InputError naming it otherwise."""
    raw = (args.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number; got {raw!r}") from None
    if not low <= value <= high:
        raise InputError(f"{name} must be between {low} and {high}; got {value}")
    return value


@dataclass(frozen=True)
class SmoothOptions:
    """How a plot is smoothed and reduced (query parameters ``smooth``, ``window``, ``outliers``, ``points``)."""

    method: str = "ema"
    window: int | None = None  # None: the metric definition's smoothing_window
    ignore_outliers: bool = False
    points: int = DISPLAY_POINTS

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> SmoothOptions:
        return cls(
            method=choice_arg(args, "smooth", smoothing.METHODS, "ema"),
            window=int_arg(args, "window", None, 1, smoothing.MAX_WINDOW),
            ignore_outliers=(args.get("outliers") or "") in ("ignore", "1", "on", "true"),
            points=int_arg(args, "points", DISPLAY_POINTS, 10, MAX_POINTS) or DISPLAY_POINTS,
        )

    def window_for(self, definition: Mapping[str, Any] | None, n_points: int | None = None) -> int:
        """The window used: the user's as given; else the definition's, adapted to ``n_points``
        (see :func:`smoothing.adaptive_window`) so a short run's smoothed line keeps its level."""
        if self.window is not None:
            return self.window
        default = int((definition or {}).get("smoothing_window") or DEFAULT_WINDOW)
        return smoothing.adaptive_window(default, n_points)

    def key(self) -> tuple:
        return (self.method, self.window, self.ignore_outliers, self.points)

    def query(self) -> dict[str, str]:
        """Non-default options as query parameters (for links that keep the page's choices)."""
        out = {}
        if self.method != "ema":
            out["smooth"] = self.method
        if self.window is not None:
            out["window"] = str(self.window)
        if self.ignore_outliers:
            out["outliers"] = "ignore"
        if self.points != DISPLAY_POINTS:
            out["points"] = str(self.points)
        return out


@dataclass
class Prepared:
    """One series ready to plot: finite points, smoothed values, and where NaN/Inf were.

    ``x``/``y`` hold every finite point (the raw scatter); the smoothed line runs over one point
    per step (``smooth_x``: the mean of a step's finite points where a step holds several, as
    CleanRL's per-episode returns do), so repeats at a step never bend the line.
    """

    x: np.ndarray                # finite points' x (steps, or fraction of training)
    y: np.ndarray                # finite canonical values
    smooth: np.ndarray | None    # smoothed per-step values, computed on the full series
    nonfinite_x: np.ndarray
    total: int                   # points stored, finite or not
    window: int
    steps: np.ndarray            # every stored step (exports)
    values: np.ndarray           # every stored value, canonical sign (exports)
    smooth_x: np.ndarray | None = None  # x of ``smooth`` when some step holds several points
    step_y: np.ndarray | None = None    # per-step mean of ``y`` when some step holds several points

    @property
    def repeats(self) -> bool:
        """Whether some step holds several points."""
        return self.smooth_x is not None

    @property
    def line_x(self) -> np.ndarray:
        """The x of the smoothed line (one per step)."""
        return self.x if self.smooth_x is None else self.smooth_x

    @property
    def line_y(self) -> np.ndarray:
        """The curve the smoothed line follows: one value per step, before smoothing."""
        return self.y if self.step_y is None else self.step_y


def prepare(data: SeriesData, sign: float, method: str, window: int, *, x_scale: float | None = None,
            normalize: str | None = None, x_offset: float = 0.0) -> Prepared:
    steps = np.asarray(data.steps)
    values = np.asarray(data.values, dtype=np.float64)
    if sign != 1.0:
        values = values * sign
    finite = np.isfinite(values)
    all_finite = bool(finite.all())
    y = values if all_finite else values[finite]
    if normalize:
        y = normalize_values(y, normalize)
        values = np.full(values.shape, np.nan)
        values[finite] = y
    x = steps if all_finite else steps[finite]
    nonfinite = steps[~finite] if not all_finite else steps[:0]
    per_step = SeriesData(x, y).per_step()
    repeats = per_step.counts is not None
    line_x, line_y = per_step.steps, per_step.values
    if x_scale:
        x = (x - x_offset) / x_scale
        nonfinite = (nonfinite - x_offset) / x_scale
        line_x = (line_x - x_offset) / x_scale if repeats else x
    smooth = smoothing.smooth(line_y, method, window) if line_y.size else None
    return Prepared(x=x, y=y, smooth=smooth, nonfinite_x=nonfinite, total=len(steps), window=window,
                    steps=steps, values=values, smooth_x=line_x if repeats else None,
                    step_y=line_y if repeats else None)


def normalize_values(y: np.ndarray, how: str) -> np.ndarray:
    if y.size == 0:
        return y
    if how == "zscore":
        std = float(y.std())
        return (y - y.mean()) / std if std > 0 else y - y.mean()
    if how == "minmax":
        lo, hi = float(y.min()), float(y.max())
        return (y - lo) / (hi - lo) if hi > lo else np.zeros_like(y)
    raise ValueError(how)


def reduce_for_display(p: Prepared, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Raw and smoothed points reduced to ``n_out`` each (MinMaxLTTB keeps spikes)."""
    idx = downsample_indices(p.x, p.y, n_out)
    raw_x, raw_y = (p.x, p.y) if idx is None else (p.x[idx], p.y[idx])
    # Without smoothing, a series with several points per step still gets its per-step mean line.
    line_y = p.smooth if p.smooth is not None else p.step_y
    if line_y is None:
        return raw_x, raw_y, None, None
    line_x = p.line_x
    sidx = downsample_indices(line_x, line_y, n_out)
    sx, sy = (line_x, line_y) if sidx is None else (line_x[sidx], line_y[sidx])
    return raw_x, raw_y, sx, sy


def thin_nonfinite(x: np.ndarray, bins: int = 600) -> np.ndarray:
    """At most one tick per pixel-ish bin: a million NaNs must not mean a million markers."""
    if len(x) <= bins:
        return x
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return x[:1]
    keys = np.floor((x - lo) / (hi - lo) * bins)
    _, first = np.unique(keys, return_index=True)
    return x[first]


def y_limits(ys: Sequence[np.ndarray], ignore_outliers: bool) -> tuple[float, float] | None:
    ys = [y for y in ys if y is not None and y.size]
    if not ys:
        return None
    if ignore_outliers:
        lows = [float(np.percentile(y, 0.5)) for y in ys]
        highs = [float(np.percentile(y, 99.5)) for y in ys]
    else:
        lows = [float(y.min()) for y in ys]
        highs = [float(y.max()) for y in ys]
    return min(lows), max(highs)


def fmt_count(n: int) -> str:
    return f"{n:,}"


def describe_semantics(semantics: Mapping[str, Any] | None) -> str:
    """``KL estimator k3 · averaging batch · normalization axis none · logging point rollout``."""
    semantics = semantics or {}
    parts = []
    for f in SEMANTIC_FIELDS:
        if f == "quantity":
            continue
        v = semantics.get(f)
        if v and v != "n/a":
            parts.append(f"{FIELD_LABELS[f]} {v}")
    return " \u00b7 ".join(parts) or "semantics unspecified"


# --- one run, one metric -----------------------------------------------------------


#: ``run_plot_spec(healthy=...)`` default: the definition's own range (no diagnosis at hand).
FROM_DEFINITION: Mapping[str, Any] = {"from": "definition"}


def run_plot_spec(data: SeriesData, *, sign: float, definition: Mapping[str, Any] | None, task: str | None,
                  opts: SmoothOptions, title: str | None = None,
                  healthy: Mapping[str, Any] | None = FROM_DEFINITION) -> tuple[PlotSpec, Prepared]:
    """One run's series as drawn. ``healthy`` is the range the run's diagnosis resolved for the
    metric ({"low", "high", "source"}, None for none); its source is noted on the plot."""
    window = opts.window_for(definition, len(data.steps))
    p = prepare(data, sign, opts.method, window)
    raw_x, raw_y, sx, sy = reduce_for_display(p, opts.points)
    notes = []
    default = int((definition or {}).get("smoothing_window") or DEFAULT_WINDOW)
    if opts.window is None and window < default and opts.method != "none":
        notes.append(f"smoothing window {window} (the definition's {default}, capped to "
                     f"{smoothing.ADAPTIVE_FRACTION:.0%} of {fmt_count(len(data.steps))} points)")
    if len(raw_x) < len(p.x):
        notes.append(f"downsampled {fmt_count(len(p.x))} -> {fmt_count(len(raw_x))} points")
    if len(p.nonfinite_x):
        notes.append(f"{fmt_count(len(p.nonfinite_x))} NaN/Inf (red ticks)")
    if p.total == 0:
        notes.append("no points")
    if p.repeats:
        notes.append(f"{fmt_count(len(p.x))} points at {fmt_count(len(p.line_x))} steps; line: mean per step")
    if healthy is FROM_DEFINITION:
        band = healthy_range_for(definition, task) if definition else None
    else:
        band = (healthy["low"], healthy["high"]) if healthy else None
        if healthy and healthy.get("source"):
            notes.append(f"healthy range: {healthy['source']}")
    trace = Trace(label=None, color=SINGLE_SMOOTH, raw_color=SINGLE_RAW, raw_x=raw_x, raw_y=raw_y,
                  smooth_x=sx, smooth_y=sy, nonfinite_x=thin_nonfinite(p.nonfinite_x), raw_markers=p.repeats)
    spec = PlotSpec(traces=[trace], title=title, healthy=band,
                    ylim=y_limits([p.y, p.smooth], opts.ignore_outliers), notes=notes,
                    ylabel=(definition or {}).get("unit") or None)
    return spec, p


def export_rows(p: Prepared) -> dict[str, list]:
    """Full-resolution columns for CSV/JSON download: step, value, smoothed (None where not finite)."""
    smoothed = np.full(len(p.values), np.nan)
    if p.smooth is not None:
        # Each point gets its step's smoothed value (a step holding several points shares one).
        finite_steps = p.steps[np.isfinite(p.values)]
        line_steps = finite_steps if not p.repeats else np.unique(finite_steps)
        smoothed[np.isfinite(p.values)] = p.smooth[np.searchsorted(line_steps, finite_steps)]
    return {"step": p.steps.tolist(), "value": _nullable(p.values), "smoothed": _nullable(smoothed)}


def _nullable(a: np.ndarray) -> list[float | None]:
    out = a.tolist()
    if not np.isfinite(a).all():
        bad = np.flatnonzero(~np.isfinite(a))
        for i in bad.tolist():
            out[i] = None
    return out
