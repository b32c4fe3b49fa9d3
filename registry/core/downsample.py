"""Shape-preserving reduction of long series for display.

MinMaxLTTB (tsdownsample): a min/max preselection keeps every local extreme, then LTTB
picks the points that best keep the visual shape. A single spike in a million points
survives; a million points cost a few milliseconds.
"""
from __future__ import annotations

import numpy as np
from tsdownsample import MinMaxLTTBDownsampler

DISPLAY_POINTS = 2000
MAX_POINTS = 100000
_DOWNSAMPLER = MinMaxLTTBDownsampler()


def downsample_indices(x: np.ndarray, y: np.ndarray, n_out: int = DISPLAY_POINTS) -> np.ndarray | None:
    """Indices of the kept points, or None when the series is already short enough.

    ``x`` must be increasing and ``y`` finite (callers drop NaN/Inf first).
    """
    n = len(x)
    n_out = max(3, int(n_out))
    if n <= n_out:
        return None
    x = np.ascontiguousarray(x)
    if x.dtype.kind not in "iuf":
        x = x.astype(np.float64)
    idx = _DOWNSAMPLER.downsample(x, np.ascontiguousarray(y, dtype=np.float64), n_out=n_out)
    return np.asarray(idx, dtype=np.int64)


def downsample(x: np.ndarray, y: np.ndarray, n_out: int = DISPLAY_POINTS) -> tuple[np.ndarray, np.ndarray]:
    idx = downsample_indices(x, y, n_out)
    if idx is None:
        return x, y
    return x[idx], y[idx]
