"""Curve smoothing on the full series, vectorised with numpy.

Three methods, each over the *finite* points of a series (NaN and Inf are kept out of
the average and shown separately on the plot):

- ``ema``: exponential moving average with TensorBoard's debiasing, so the start of the
  curve is not dragged towards zero. The window ``w`` maps to a weight the way a pandas
  ``span`` does: ``weight = 1 - 2 / (w + 1)`` (window 10 -> weight 0.818).
- ``trailing``: mean of the last ``w`` points (what a training log's running mean shows).
- ``centred``: mean of ``w`` points centred on each point (no lag, looks ahead).
- ``none``: no smoothed line.
"""
from __future__ import annotations

import math

import numpy as np

METHODS = ("ema", "trailing", "centred", "none")
METHOD_LABELS = {
    "ema": "EMA (debiased)",
    "trailing": "trailing moving average",
    "centred": "centred moving average",
    "none": "no smoothing",
}
MAX_WINDOW = 100000
#: A definition's default window is capped to this fraction of the series' points, so that a
#: short run's smoothed line keeps the curve's level: a 50-point window on a 49-point run
#: would average the whole run and end far below (or above) where the raw points end.
ADAPTIVE_FRACTION = 0.1


def adaptive_window(default: int, n_points: int | None) -> int:
    """The window a definition's default ``default`` becomes on a series of ``n_points`` points.

    ``min(default, max(1, round(ADAPTIVE_FRACTION * n_points)))``; an explicit window chosen by
    the user is never adapted (callers pass it through unchanged).
    """
    default = max(1, int(default))
    if n_points is None or n_points <= 0:
        return default
    return int(min(default, max(1, round(ADAPTIVE_FRACTION * n_points))))


def ema_weight(window: int) -> float:
    """The TensorBoard smoothing weight equivalent to a window of ``window`` points."""
    window = max(1, int(window))
    return 1.0 - 2.0 / (window + 1.0)


def ema_debiased(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: ``last = last * w + (1 - w) * x``, divided by ``1 - w**n``.

    Two exact vectorised forms of the recurrence, chosen by speed:
    - light smoothing (w < 0.9): a doubling scan, ``y[s:] += w**s * y[:-s]`` for s = 1, 2, 4, ...
      until ``w**s`` is below float precision (at most ~9 passes);
    - heavy smoothing: closed form per block, ``y[j] = w**(j+1) * carry + (1-w) * w**j *
      cumsum(x[k] * w**-k)``, with blocks short enough that ``w**-k`` stays far from overflow.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0 or weight <= 0.0:
        return x.copy()
    if weight >= 1.0:
        raise ValueError("EMA weight must be below 1")
    log_w = math.log(weight)
    if weight < 0.9:
        out = x * (1.0 - weight)
        shift, w_shift = 1, weight
        while w_shift > 1e-17 and shift < n:
            out[shift:] += w_shift * out[:-shift].copy()
            shift *= 2
            w_shift *= w_shift
    else:
        block = int(max(16, min(8192, 100 * math.log(10) / -log_w)))
        powers = weight ** np.arange(block + 1, dtype=np.float64)   # w**0 .. w**block
        inv_powers = np.exp(-log_w * np.arange(block, dtype=np.float64))  # w**-0 .. w**-(block-1)
        out = np.empty(n, dtype=np.float64)
        carry = 0.0
        for start in range(0, n, block):
            seg = x[start:start + block]
            m = seg.size
            y = powers[1:m + 1] * carry + (1.0 - weight) * powers[:m] * np.cumsum(seg * inv_powers[:m])
            out[start:start + m] = y
            carry = y[-1]
    # Debias: the EMA started from 0, so early values are scaled by 1 - w**n.
    return out / -np.expm1(np.arange(1, n + 1, dtype=np.float64) * log_w)


def _cumsum0(x: np.ndarray) -> tuple[np.ndarray, float]:
    offset = float(x.mean()) if x.size else 0.0  # centring keeps the cumulative sums precise
    c = np.empty(x.size + 1, dtype=np.float64)
    c[0] = 0.0
    np.cumsum(x - offset, out=c[1:])
    return c, offset


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` points (fewer at the start)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0 or window <= 1:
        return x.copy()
    c, offset = _cumsum0(x)
    w = min(window, n)
    out = np.empty(n, dtype=np.float64)
    out[:w] = c[1:w + 1] / np.arange(1, w + 1)
    out[w:] = (c[w + 1:] - c[1:n - w + 1]) / w
    return out + offset


def centred_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of ``window`` points centred on each point (shrinking at both ends)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0 or window <= 1:
        return x.copy()
    c, offset = _cumsum0(x)
    before, after = (window - 1) // 2, window // 2
    if window > n:  # short series: every window is clipped, index directly
        idx = np.arange(n)
        lo = np.maximum(idx - before, 0)
        hi = np.minimum(idx + after + 1, n)
        return (c[hi] - c[lo]) / (hi - lo) + offset
    out = np.empty(n, dtype=np.float64)
    out[before:n - after] = (c[window:] - c[:n + 1 - window]) / window
    head = np.arange(before)                      # lo = 0, hi = i + after + 1
    out[:before] = c[head + after + 1] / (head + after + 1)
    tail = np.arange(n - after, n)                # lo = i - before, hi = n
    out[n - after:] = (c[n] - c[tail - before]) / (n - tail + before)
    return out + offset


def smooth(values: np.ndarray, method: str, window: int) -> np.ndarray | None:
    """Smoothed finite values (input must already be finite); None for ``none``."""
    if method == "none":
        return None
    window = max(1, min(int(window), MAX_WINDOW))
    if method == "ema":
        return ema_debiased(values, ema_weight(window))
    if method == "trailing":
        return trailing_mean(values, window)
    if method == "centred":
        return centred_mean(values, window)
    raise ValueError(f"smoothing must be one of {', '.join(METHODS)}; got {method!r}")


def describe(method: str, window: int) -> str:
    """A short caption: ``EMA (debiased), window 10 (weight 0.818)``."""
    if method == "none":
        return METHOD_LABELS["none"]
    text = f"{METHOD_LABELS[method]}, window {window}"
    if method == "ema":
        text += f" (weight {ema_weight(window):.3f})"
    return text
