"""Curve preprocessing for similarity search: resampling, shape normalisation, embeddings.

One series becomes, for each stored *level* (prefix fraction of the run's step span:
0.1, 0.25, 0.5 and 1.0):

- a grid of ``GRID`` (128) points over ``[first_step, first_step + level * span]``: the raw
  values are area-averaged into equal step bins (irregular logging is fine; empty bins are
  interpolated), then smoothed with a Gaussian of ``SMOOTH_SIGMA`` (3) grid points (edges
  padded with the edge value). Without it the distances between runs of one kind are
  dominated by their logging noise: measured on the benchmark corpus, a [1, 2, 1]/4 kernel
  left ~90 runs within 10% of a query's 10th-nearest DTW distance, and the coarse candidate
  stages (PAA-32, 64-point DTW) ranked that noise poorly; sigma = 3 (2.3% of the span)
  keeps phase changes and spikes a few points wide while DTW compares shapes;
- that grid z-normalised: subtract the mean, divide by ``sqrt(std^2 + (NOISE_K * noise)^2)``
  where ``noise`` is the grid's noise level, estimated from the raw points (robust std of
  first differences, reduced by the points averaged per bin). A trend well above the noise
  is plain z-normalisation; a series that is only noise around a constant (a steady KL)
  keeps a small amplitude instead of being blown up to unit variance, so DTW compares
  shapes, not noise. A *flat* grid (std at or below ``FLAT_REL`` times its level, or ~0)
  is marked flat and its z-grid is all zeros, never divided by ~0;
- PAA-``PAA`` (32) of the z-grid: the mean of each run of 4 grid points. ``sqrt(GRID/PAA)``
  times the Euclidean distance of two PAA vectors lower-bounds the Euclidean distance of the
  z-grids (Keogh et al. 2001), so it is a faithful first filter;
- level scalars of the grid: mean, std, final, max and argmax (as a fraction of the level).

The x-axis is the fraction of the step span, so a 2,000-step and a 20,000-step run line up.
Any other prefix or window of a run is cut from the smallest stored level that contains it
(``portion``): a 20% prefix is 102 points of the 25% grid, re-sampled to 128 and
re-normalised (the stored z-grid times the stored scale, plus the mean, is the grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = 128
PAA = 32
LEVELS = (0.1, 0.25, 0.5, 1.0)
FLAT_REL = 1e-4
FLAT_ABS = 1e-12
# the noise term is of the smoothed grid (SMOOTH_NOISE times the raw noise): with K = 3 the
# noise-only prefixes of stagnant runs kept enough amplitude to match other families' trends
# (tests/test_similarity.py, prefix queries); with 8 they stay small
NOISE_K = 8.0
SMOOTH_SIGMA = 3.0
_KERNEL_RADIUS = int(3 * SMOOTH_SIGMA)
_KERNEL = np.exp(-0.5 * (np.arange(-_KERNEL_RADIUS, _KERNEL_RADIUS + 1) / SMOOTH_SIGMA) ** 2)
_KERNEL /= _KERNEL.sum()
SMOOTH_NOISE = float(np.sqrt(np.sum(_KERNEL ** 2)))  # white-noise std left by the kernel
#: A portion cut from a stored level must span at least this many of its grid points.
MIN_PORTION_POINTS = 8
#: Names method and parameters; embeddings of another version are never compared.
EMBEDDING_VERSION = (f"areaavg-gauss{SMOOTH_SIGMA:g}-znoise{NOISE_K:g}-paa{PAA}-L{GRID}-"
                     f"levels{'_'.join(str(x) for x in LEVELS)}-v1")

N_LEVELS = len(LEVELS)
STATS = ("mean", "std", "final", "max", "argmax", "flat", "scale", "noise")
#: Above this magnitude squares (stds) and sums (means, bins) of values may overflow float64.
HUGE = 1e150


@dataclass
class SeriesFeatures:
    """Everything stored for one series (arrays indexed by level, ascending)."""

    first_step: int
    last_step: int
    point_count: int
    zgrid: np.ndarray   # (N_LEVELS, GRID) float: z-normalised grids
    paa: np.ndarray     # (N_LEVELS, PAA) float32
    stats: np.ndarray   # (N_LEVELS, len(STATS)) float64

    @property
    def flat(self) -> bool:
        return bool(self.stats[-1, 5])


def is_flat(mean: np.ndarray | float, std: np.ndarray | float) -> np.ndarray:
    return np.asarray(std) <= np.maximum(FLAT_REL * np.abs(mean), FLAT_ABS)


def unit_factor(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Powers of two that bring values above ``HUGE`` (along ``axis``) down near 1, else 1.

    Scaling by a power of two is exact, shapes do not depend on scale, and every
    statistic computed on the scaled values scales back by the same factor: so finite
    values near the float64 limit never turn into inf or NaN on the way."""
    peak = np.max(np.abs(values), axis=axis, initial=0.0)
    return np.where(peak > HUGE, np.ldexp(1.0, -np.frexp(peak)[1]), 1.0)


def shape(grid: np.ndarray, noise: np.ndarray | float = 0.0) -> tuple[np.ndarray, ...]:
    """Row-wise noise-aware z-normalisation of (k, n) grids: (z, mean, std, flat, scale).

    ``scale = sqrt(std^2 + (NOISE_K * noise)^2)``; flat rows are all zeros (scale 1).
    """
    grid = np.atleast_2d(grid)
    f = unit_factor(grid, axis=-1)
    g = grid if (f == 1.0).all() else grid * f[:, None]
    mean_f, std_f = g.mean(axis=-1), g.std(axis=-1)
    mean, std = mean_f / f, std_f / f
    flat = is_flat(mean, std)
    scale_f = np.sqrt(std_f * std_f + (NOISE_K * np.asarray(noise) * f) ** 2)
    unit = flat | (scale_f <= 0)
    z = (g - mean_f[:, None]) / np.where(unit, 1.0, scale_f)[:, None]
    z[flat] = 0.0
    return z, mean, std, flat, np.where(unit, 1.0, scale_f / f)


def noise_level(values: np.ndarray) -> float:
    """Std of the white noise on a series: robust (MAD) std of first differences / sqrt(2)."""
    if len(values) < 3:
        return 0.0
    d = np.diff(values)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def paa(z: np.ndarray, segments: int = PAA) -> np.ndarray:
    """Piecewise aggregate approximation of (..., GRID) arrays."""
    return z.reshape(*z.shape[:-1], segments, z.shape[-1] // segments).mean(axis=-1)


def _smooth(grid: np.ndarray) -> np.ndarray:
    return np.convolve(np.pad(grid, _KERNEL_RADIUS, mode="edge"), _KERNEL, mode="valid")


def bin_average(steps: np.ndarray, values: np.ndarray, lo: float, hi: float,
                n: int = GRID) -> tuple[np.ndarray, float]:
    """Area-average points with ``lo <= step <= hi`` into ``n`` equal step bins, then smooth.

    Empty bins (sparse logging: 48 SB3 points on 128 bins) take the linear interpolation
    of their neighbours' centres, so the grid never has holes. Returns the grid and its
    noise level (the points' noise, reduced by averaging and smoothing).
    """
    width = max(hi - lo, 1e-12)
    pos = (steps - lo) / width * n
    idx = np.clip(pos.astype(np.int64), 0, n - 1)
    inside = (steps >= lo) & (steps <= hi)
    idx, vals, pos = idx[inside], values[inside], pos[inside]
    f = float(unit_factor(vals))
    vals = vals * f
    sums = np.bincount(idx, weights=vals, minlength=n)
    counts = np.bincount(idx, minlength=n)
    have = counts > 0
    if not have.any():
        return np.full(n, float(values[0]) if len(values) else 0.0), 0.0
    centres = np.arange(n) + 0.5
    grid = np.empty(n)
    grid[have] = sums[have] / counts[have]
    if not have.all():
        # Interpolate holes between the actual positions of the points around them.
        xp = np.bincount(idx, weights=pos, minlength=n)[have] / counts[have]
        grid[~have] = np.interp(centres[~have], xp, grid[have])
    noise = noise_level(vals) * SMOOTH_NOISE * float(np.sqrt(np.mean(1.0 / np.maximum(counts, 1))))
    return _smooth(grid) / f, noise / f


def compute_features(steps: np.ndarray, values: np.ndarray) -> SeriesFeatures | None:
    """Features of one series (canonical sign applied); None when no finite point is left."""
    steps = np.asarray(steps, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(values)
    steps, values = steps[keep], values[keep]
    if len(values) == 0:
        return None
    first, last = float(steps[0]), float(steps[-1])
    span = last - first
    grids = np.empty((N_LEVELS, GRID))
    noise = np.zeros(N_LEVELS)
    for i, level in enumerate(LEVELS):
        if span <= 0:
            grids[i] = values.mean()
        else:
            grids[i], noise[i] = bin_average(steps, values, first, first + level * span)
    z, mean, std, flat, scale = shape(grids, noise)
    stats = np.empty((N_LEVELS, len(STATS)))
    stats[:, 0], stats[:, 1], stats[:, 2] = mean, std, grids[:, -1]
    stats[:, 3] = grids.max(axis=1)
    stats[:, 4] = (grids.argmax(axis=1) + 0.5) / GRID * np.asarray(LEVELS)
    stats[:, 5] = flat
    stats[:, 6], stats[:, 7] = scale, noise
    return SeriesFeatures(int(first), int(last), int(len(values)), z, paa(z).astype(np.float32), stats)


def level_for(end: np.ndarray | float) -> np.ndarray:
    """Index of the smallest stored level that contains a portion ending at fraction ``end``."""
    return np.searchsorted(np.asarray(LEVELS) + 1e-9, np.asarray(end), side="left").clip(0, N_LEVELS - 1)


def portion(zgrid_level: np.ndarray, level: np.ndarray | float, start: np.ndarray | float, end: np.ndarray | float,
            n: int = GRID) -> np.ndarray:
    """Re-sample rows of a level's z-grid (k, m points over [0, level]) onto [start, end], n points.

    Works for grids (m = GRID) and for PAA vectors (m = PAA) alike; vectorised over rows.
    The result is not re-normalised (see :func:`shape`).
    """
    rows = np.atleast_2d(zgrid_level)
    m = rows.shape[-1]
    level = np.broadcast_to(np.asarray(level, dtype=np.float64), rows.shape[:1])
    start = np.broadcast_to(np.asarray(start, dtype=np.float64), rows.shape[:1])
    end = np.broadcast_to(np.asarray(end, dtype=np.float64), rows.shape[:1])
    centres = (np.arange(n) + 0.5) / n
    # positions in the level's index space, where point i sits at (i + 0.5) / m * level
    frac = start[:, None] + centres[None, :] * (end - start)[:, None]
    pos = np.clip(frac / level[:, None] * m - 0.5, 0.0, m - 1.0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, m - 1)
    w = pos - lo
    return np.take_along_axis(rows, lo, 1) * (1 - w) + np.take_along_axis(rows, hi, 1) * w


def portion_points(level: np.ndarray | float, start: np.ndarray | float, end: np.ndarray | float) -> np.ndarray:
    """How many stored grid points of ``level`` a portion [start, end] spans."""
    return (np.asarray(end) - np.asarray(start)) / np.asarray(level) * GRID


# --- blob encoding ----------------------------------------------------------------------

def encode_paa(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def decode_paa(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4").reshape(N_LEVELS, PAA)


def encode_grid(z: np.ndarray) -> bytes:
    # z-grids live in about [-10, 10]: float16 keeps ~3 significant digits of the shape.
    return np.ascontiguousarray(z, dtype="<f2").tobytes()


def decode_grid(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f2").reshape(N_LEVELS, GRID)


def encode_stats(s: np.ndarray) -> bytes:
    return np.ascontiguousarray(s, dtype="<f8").tobytes()


def decode_stats(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f8").reshape(N_LEVELS, len(STATS))
