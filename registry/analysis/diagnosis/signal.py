"""Vectorised signal helpers: binning, rolling medians, runs of a condition, robust stats.

Nothing here loops over points in Python: long curves are binned with one reshape, rolling
statistics use ``sliding_window_view`` on at most ``max_points`` bins.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from registry.analysis.diagnosis.types import Curve

MAD_TO_SIGMA = 1.4826
#: Below this a value counts as zero (a level to divide by, a median to take the log of).
TINY = 1e-12


@dataclass
class Series:
    """A curve's finite points reduced to at most ``max_points`` bins.

    ``y`` is each bin's median, ``ymax``/``ymin`` its extremes; ``steps`` the first step
    of each bin and ``steps_end`` the last. ``bin_size`` raw points per bin (1 = no binning).
    """

    name: str
    steps: np.ndarray
    steps_end: np.ndarray
    y: np.ndarray
    ymax: np.ndarray
    ymin: np.ndarray
    bin_size: int
    raw_steps: np.ndarray      # finite points only
    raw_values: np.ndarray

    @property
    def n(self) -> int:
        return int(self.y.size)

    def step(self, i: int) -> int:
        return int(self.steps[min(max(i, 0), self.n - 1)])

    def step_end(self, i: int) -> int:
        return int(self.steps_end[min(max(i, 0), self.n - 1)])

    def index_at(self, step: float) -> int:
        """Index of the first bin whose end step is >= ``step``."""
        return int(min(np.searchsorted(self.steps_end, step, side="left"), self.n - 1))


def prepare(name: str, curve: Curve, max_points: int) -> Series:
    finite = np.isfinite(curve.values)
    s = curve.steps[finite]
    v = curve.values[finite]
    n = v.size
    if n <= max_points or n == 0:
        return Series(name, s, s, v, v, v, 1, s, v)
    k = int(np.ceil(n / max_points))
    m = n // k
    full = v[: m * k].reshape(m, k)
    med = np.median(full, axis=1)
    mx = full.max(axis=1)
    mn = full.min(axis=1)
    st = s[: m * k : k]
    se = s[k - 1 : m * k : k]
    if m * k < n:
        tail = v[m * k:]
        med = np.append(med, np.median(tail))
        mx = np.append(mx, tail.max())
        mn = np.append(mn, tail.min())
        st = np.append(st, s[m * k])
        se = np.append(se, s[-1])
    return Series(name, st, se, med, mx, mn, k, s, v)


def rolling_median(x: np.ndarray, w: int, mode: str = "centered") -> np.ndarray:
    """Median over a window of ``w`` points, edges padded with the edge value.

    ``trailing``: window ending at i (inclusive); ``leading``: window starting at i;
    ``centered``: window centred on i.
    """
    return _rolling(x, w, mode, np.median)


def rolling_mean(x: np.ndarray, w: int, mode: str = "centered") -> np.ndarray:
    """Mean over a window of ``w`` points, padded as :func:`rolling_median`. For batch means over a few
    completions, whose values lie on a grid (sixteenths) where a median jumps a whole grid step."""
    return _rolling(x, w, mode, np.mean)


def _rolling(x: np.ndarray, w: int, mode: str, stat) -> np.ndarray:
    n = x.size
    w = int(max(1, min(w, n)))
    if w == 1 or n == 0:
        return x.astype(np.float64, copy=True)
    if mode == "trailing":
        pad = np.concatenate([np.full(w - 1, x[0]), x])
    elif mode == "leading":
        pad = np.concatenate([x, np.full(w - 1, x[-1])])
    else:
        left = (w - 1) // 2
        right = w - 1 - left
        pad = np.concatenate([np.full(left, x[0]), x, np.full(right, x[-1])])
    return stat(sliding_window_view(pad, w), axis=1)


def shift(x: np.ndarray, k: int) -> np.ndarray:
    """x[i - k] for k > 0 (edge-padded with x[0]); x[i + |k|] for k < 0 (padded with x[-1])."""
    if k == 0 or x.size == 0:
        return x.copy()
    if k > 0:
        k = min(k, x.size)
        return np.concatenate([np.full(k, x[0]), x[:-k]])
    k = min(-k, x.size)
    return np.concatenate([x[k:], np.full(k, x[-1])])


def runs(mask: np.ndarray, min_len: int = 1) -> list[tuple[int, int]]:
    """(start, end) inclusive index pairs of the True runs of ``mask`` at least ``min_len`` long."""
    if mask.size == 0:
        return []
    m = np.concatenate([[False], mask.astype(bool), [False]])
    d = np.diff(m.astype(np.int8))
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1) - 1
    keep = (ends - starts + 1) >= min_len
    return [(int(a), int(b)) for a, b in zip(starts[keep], ends[keep])]


def merge_close(spans: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def mad_sigma(x: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    med = np.median(x)
    return float(MAD_TO_SIGMA * np.median(np.abs(x - med)))


def noise_sigma(x: np.ndarray) -> float:
    """Robust point-to-point noise: MAD of first differences / sqrt(2)."""
    if x.size < 3:
        return 0.0
    return mad_sigma(np.diff(x)) / np.sqrt(2.0)


def trend_noise_sigma(x: np.ndarray) -> float:
    """Robust noise around a locally straight curve: MAD of second differences / sqrt(6). A steady
    climb or slide cancels out of second differences, where first differences count it as noise."""
    if x.size < 4:
        return 0.0
    return mad_sigma(np.diff(x, 2)) / np.sqrt(6.0)


def rank_corr(x: np.ndarray) -> float:
    """Spearman rank correlation of ``x`` with its index (1 = strictly increasing)."""
    n = x.size
    if n < 3:
        return 0.0
    r = np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(np.float64)
    t = np.arange(n, dtype=np.float64)
    r -= r.mean()
    t -= t.mean()
    den = np.sqrt((r * r).sum() * (t * t).sum())
    return float((r * t).sum() / den) if den > 0 else 0.0


def early_count(n: int, frac: float, minimum: int = 3) -> int:
    return int(min(n, max(minimum, int(np.ceil(frac * n)))))


def window_ends(n: int, w: int, n_eval: int = 24) -> np.ndarray:
    """Indices at which to evaluate a trailing window of ``w`` points (always includes n-1)."""
    if n < w:
        return np.zeros(0, dtype=np.int64)
    ends = np.unique(np.linspace(w - 1, n - 1, num=min(n_eval, n - w + 1)).round().astype(np.int64))
    return ends
