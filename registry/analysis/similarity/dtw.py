"""The elastic rerank: banded dynamic time warping over z-grids, with a lower bound to prune."""
from __future__ import annotations

from typing import Any

import numpy as np
from dtaidistance import dtw_ndim

from registry.analysis.similarity import features as F
from registry.analysis.similarity import ranking as RK


DTW_WINDOW = max(1, round(0.1 * F.GRID))


def running_extreme(x: np.ndarray, r: int, op: Any) -> np.ndarray:
    """op (np.maximum / np.minimum) over windows of +-r points along the last axis, edges clamped.

    Doubling: windows of width 1, 2, 4, ... built from two shifted halves, then the width
    2r+1 window as the union of two overlapping power-of-two windows: O(log r) array ops.
    """
    width = 2 * r + 1
    n = x.shape[-1]
    y = np.concatenate([np.repeat(x[..., :1], r, axis=-1), x, np.repeat(x[..., -1:], r, axis=-1)], axis=-1)
    w = 1
    while 2 * w <= width:
        y = op(y[..., :-w], y[..., w:])
        w *= 2
    # y[i] now covers [i, i + w) of the padded axis; cover [i, i + width) with two windows
    return op(y[..., :n], y[..., width - w:width - w + n])


def lb_query_envelope(qt: np.ndarray, xt: np.ndarray, mask: np.ndarray, r: int) -> np.ndarray:
    """Squared LB_Keogh: candidates (C, M, L) against the query's (M, L) envelope."""
    upper, lower = running_extreme(qt, r, np.maximum), running_extreme(qt, r, np.minimum)
    viol = np.maximum(xt - upper, 0.0) + np.maximum(lower - xt, 0.0)
    return np.einsum("cml,cm->c", viol * viol, mask)


def dtw_block(q: np.ndarray, xs: np.ndarray, avail: np.ndarray, sel: np.ndarray,
               max_dist: float | None, window: int = DTW_WINDOW) -> np.ndarray:
    """Raw DTW_D of q against xs[sel] in one C call per channel pattern (inf: over max_dist)."""
    out = np.full(len(sel), np.inf)
    if not len(sel):
        return out
    patterns = avail[sel]
    groups = [(None, np.arange(len(sel)))] if patterns.all() else \
        [(p, np.flatnonzero((patterns == p).all(axis=1))) for p in np.unique(patterns, axis=0)]
    for pattern, grp in groups:
        stack = np.empty((len(grp) + 1, *q.shape))
        stack[0] = q if pattern is None else q * pattern[None, :]
        np.take(xs, sel[grp], axis=0, out=stack[1:])
        out[grp] = dtw_stack(stack, window, max_dist)
    return out


def dtw_stack(stack: np.ndarray, window: int, max_dist: float | None = None) -> np.ndarray:
    """Raw DTW_D of stack[0] against stack[1:] (a C-contiguous float64 (n + 1, L, M) array), one C call."""
    return np.asarray(dtw_ndim.distance_matrix_fast(stack, window=window, block=((0, 1), (1, len(stack))),
                                                    compact=True, parallel=False, max_dist=max_dist))


def rerank_rows(q: np.ndarray, xs: np.ndarray, avail: np.ndarray, wp: np.ndarray, k: int,
            brute: bool = False, buf: np.ndarray | None = None,
            lb: bool = True) -> tuple[list[tuple[float, int]], int]:
    """Top k (distance, candidate index) by DTW_D, and how many DTWs ran.

    Brute force, and after the coarse stages (``lb=False``): one call over the pool. Exact
    mode (``lb=True``, candidates in stage-1 order): the first k + 6 are computed outright,
    which gives a tight k-th best distance; the rest are ordered by LB_Keogh against the
    query envelope (a lower bound of banded DTW with a squared-Euclidean cost: every point
    is matched within +-r of its index), dropped once their bound exceeds the k-th best,
    and run in batches (one C call each) that abandon early at the current k-th best. So
    the result equals brute-force DTW over the same candidates. (The candidate-envelope
    direction and LB_Improved were measured too: on z-normalised training curves with a
    13-point band they pruned under 5% more, for more than their cost.)
    """
    norm = np.sqrt(F.GRID * wp)
    n = len(xs)
    if brute or not lb:
        # brute force, or the small near-tied pool behind the coarse stages: one call over
        # all of it (measured: abandoning at a bound of the k-th best saved nothing there;
        # neither did two calls, the pool's first k then the rest with their largest
        # distance as ``max_dist``: PrunedDTW stopped ~80% of the rest, late, for ~0 in the
        # rerank and +5% in stages 1b and 1c)
        if buf is not None and avail.all():
            buf[0] = q  # the candidates already sit in buf[1:]: one C call, no copy
            d = dtw_stack(buf, DTW_WINDOW) / norm
        else:
            d = dtw_block(q, xs, avail, np.arange(n), None) / norm
        order = np.argsort(d, kind="stable")[:k]
        return [(float(d[i]), int(i)) for i in order], n
    d = np.full(n, np.inf)
    seed = np.arange(min(n, k + 6))
    d[seed] = dtw_block(q, xs, avail, seed, None) / norm[seed]
    computed = len(seed)
    rest = np.arange(len(seed), n)
    if len(rest):
        kth = float(np.partition(d[seed], min(k, len(seed)) - 1)[min(k, len(seed)) - 1])
        qt = np.ascontiguousarray(q.T)
        xt = np.ascontiguousarray(xs[rest].transpose(0, 2, 1))
        mask = avail[rest].astype(np.float64)
        lb = np.sqrt(lb_query_envelope(qt, xt, mask, DTW_WINDOW)) / norm[rest]
        keep = lb <= kth
        rest, lb = rest[keep], lb[keep]
        rest = rest[np.argsort(lb, kind="stable")]
        lb = np.sort(lb, kind="stable")
        pos = 0
        while pos < len(rest):
            sel = rest[pos:pos + 64]
            sel = sel[lb[pos:pos + 64] <= kth]
            if not len(sel):
                break
            d[sel] = dtw_block(q, xs, avail, sel, float(kth * norm[sel].max() * (1 + 1e-9))) / norm[sel]
            computed += len(sel)
            pos += 64
            finite = d[np.isfinite(d)]
            kth = float(np.partition(finite, k - 1)[k - 1]) if len(finite) >= k else np.inf
    top = np.argsort(d, kind="stable")[:k]
    return [(float(d[i]), int(i)) for i in top if np.isfinite(d[i])], computed


def rerank_coverage_first(q: np.ndarray, xs: np.ndarray, avail: np.ndarray, wp: np.ndarray, k: int,
                           brute: bool = False, buf: np.ndarray | None = None,
                           lb: bool = True) -> tuple[list[tuple[float, int]], int]:
    """``rerank_rows`` in coverage-first order (``ranking``): the candidates compared on the most
    metrics fill the k places first, by distance; fewer-metric tiers only fill what is left."""
    counts = RK.coverage_counts(avail)
    if not len(counts) or (counts == counts[0]).all():
        return rerank_rows(q, xs, avail, wp, k, brute=brute, buf=buf, lb=lb)
    ranked: list[tuple[float, int]] = []
    computed = 0
    for idx in RK.tiers(counts):
        if len(ranked) >= k:
            break
        part, n = rerank_rows(q, xs[idx], avail[idx], wp[idx], k - len(ranked), brute=brute, lb=lb)
        ranked += [(d, int(idx[i])) for d, i in part]
        computed += n
    return ranked, computed


def elastic_order(q: np.ndarray, buf: np.ndarray, avail: np.ndarray, wp: np.ndarray, keep: int,
                   window: int) -> np.ndarray:
    """Positions (into ``buf[1:]``) of the ``keep`` nearest by banded DTW_D at a coarse
    resolution, best first.

    ``q``: the query at that resolution (L, M); ``buf``: (C + 1, L, M), slot 0 free. The
    cascade runs it twice: on the PAA-32 vectors (32 points, band ``CS.PAA_WINDOW``, ~1/16 of
    the exact DTW's cost) and on grids averaged over pairs of points (64 points, band
    ``CS.HALF_WINDOW``, ~1/5). Both follow the warping, which the Euclidean stage 1 does not.
    """
    if avail.all():
        buf[0] = q
        d = dtw_stack(buf, window)
    else:
        d = dtw_block(q, buf[1:], avail, np.arange(len(avail)), None, window=window)
    d = d / np.sqrt(wp)
    if not avail.all():
        return RK.coverage_first(d, RK.coverage_counts(avail), keep)
    if keep < len(d):
        part = np.argpartition(d, keep - 1)[:keep]
        return part[np.argsort(d[part], kind="stable")]
    return np.argsort(d, kind="stable")
