"""Subsequence search: where else in the collection did the query's pattern happen?

``find_similar(..., anywhere=True)`` matches the query portion (a window or a prefix of the
query run) against every window of the same length in each historical run, wherever it
lies: the same fraction of training (align "fraction") or the same number of steps (align
"step"), starting at any stored grid point of the run. Each run is represented by its best
window, and the neighbours say where it was (``Neighbour.compared_steps``,
``Neighbour.match_start``).

Stage 1: for every eligible run and every start, the noise-aware z-normalised squared
Euclidean distance of its window to the query, at the stored grids' resolution (128 points
over the run; the 32-point whole-run PAA vectors when the collection is too large for the
grids to be kept in memory). Window means and variances come from cumulative sums and the
cross terms from one FFT correlation per row, so every start of every run costs a few
array operations in total, not a Python loop over starts.

Stage 1b: banded DTW_D on PAA-32 vectors of the windows (cut from the stored PAA vectors,
band 3) at the best starts of the best ``max(STAGE1_MIN, STAGE1_SHARE * n)`` runs and the
``NEAR_PAA`` starts either side; each run keeps its best, and the best
``max(POOL_MIN, POOL_PER_K * k)`` runs go on. (The Euclidean score alone ranks smooth,
near-tied windows poorly against DTW: on the benchmark corpus at 1k runs an exact pool of
its 50 best gave recall@10 0.52; with this stage, 0.89.)

Stage 2: exact banded DTW_D (dtaidistance) of the query's grid against 128-point grids cut
at those runs' best starts and the ``NEAR`` starts either side (cut from the finest stored
level, as same-portion windows are); each run keeps its best. ``exact=True`` gives every
start of every run the exact DTW: a brute force, for checking the cascade.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from registry.core.errors import InputError
from registry.analysis.similarity import features as F
from registry.analysis.similarity import index as X
from registry.analysis.similarity.ranking import coverage_counts, coverage_first
from registry.analysis.similarity.candidates import PAA_WINDOW, Eligible, candidate_grids, gather, row_features
from registry.analysis.similarity.dtw import DTW_WINDOW, dtw_block
from registry.analysis.similarity.query import Portion, QueryMetric

#: Stage 1 passes max(STAGE1_MIN, STAGE1_SHARE * n) runs (their best starts) to stage 1b,
#: which passes max(POOL_MIN, POOL_PER_K * k) to the exact DTW.
STAGE1_MIN = 400
STAGE1_SHARE = 0.05
POOL_MIN = 100
POOL_PER_K = 5
#: Starts tried either side of a run's best so far: by stage 1b (cheap) and by the exact DTW.
NEAR_PAA = 3
NEAR = 3
#: DTWs per C call in stage 2 (bounds the memory of the cut grids in exact mode).
CHUNK = 2048


def window_widths(corpus: X.Corpus, el: Eligible, portion: Portion, query_first: float) -> np.ndarray:
    """(n, M) the window's length as a fraction of each compared row's own step span (nan: not compared)."""
    out = np.full(el.rows.shape, np.nan)
    if portion.kind == "fraction":
        out[el.avail] = portion.end - portion.start
        return out
    length = portion.end - (query_first if portion.start is None else portion.start)
    rows = el.rows[el.avail]
    span = corpus.last[rows] - corpus.first[rows]
    out[el.avail] = np.where(span > 0, length / np.maximum(span, 1e-12), np.inf)
    return out


def _query_at(qgrid_j: np.ndarray, points: int, centre: bool) -> np.ndarray:
    """The query metric's 128-point grid resampled to ``points`` points (stage 1's resolution)."""
    q = F.portion(qgrid_j[None, :], 1.0, 0.0, 1.0, n=points)[0]
    return q - q.mean() if centre else q


def _window_distances(z: np.ndarray, stats: np.ndarray, widths: np.ndarray, q128: np.ndarray, normalize: str,
                      raw_scale: float) -> np.ndarray:
    """(n, P) mean squared distance per point of each row's window starting at each point (inf: no room).

    ``z``: (n, P) whole-run z-grids (or PAA vectors) of the rows; ``stats``: their whole-run
    level statistics; ``widths``: window lengths as fractions of each row's span."""
    n, P = z.shape
    out = np.full((n, P), np.inf)
    lengths = np.clip(np.rint(widths * P).astype(np.int64), 2, P)
    c1 = np.concatenate([np.zeros((n, 1)), np.cumsum(z, axis=1)], axis=1)
    c2 = np.concatenate([np.zeros((n, 1)), np.cumsum(z * z, axis=1)], axis=1)
    # cross terms sum_i z[o + i] q[i] for every start o: a correlation, by FFT (one transform of
    # the rows serves every window length)
    L = 1 << int(2 * P - 1).bit_length()
    zf = np.fft.rfft(z, L, axis=1)
    mean, scale = stats[:, 0:1], stats[:, 6:7]
    # the stored noise is in value units; a PAA point averages GRID / P grid points
    noise_z = stats[:, 7:8] / scale / math.sqrt(F.GRID / P)
    for W in np.unique(lengths):
        rs = np.flatnonzero(lengths == W)
        if len(rs) == n:  # one window length (fraction alignment): slices, not gathered copies
            rs = slice(None)
        O = P - W + 1
        s1, s2 = c1[rs, W:W + O] - c1[rs, :O], c2[rs, W:W + O] - c2[rs, :O]
        q = _query_at(q128, int(W), centre=normalize == "z")
        cross = np.fft.irfft(zf[rs] * np.fft.rfft(q[::-1], L)[None, :], L, axis=1)[:, W - 1:W - 1 + O]
        qq = float(q @ q)
        if normalize == "z":
            mu = s1 / W
            var = np.maximum(s2 / W - mu * mu, 0.0)
            flat = F.is_flat(scale[rs] * mu + mean[rs], scale[rs] * np.sqrt(var))
            sc = np.sqrt(var + (F.NOISE_K * noise_z[rs]) ** 2)
            sc = np.where(flat | (sc <= 0), 1.0, sc)
            d = np.where(flat, 0.0, W * var / (sc * sc) - 2.0 * cross / sc) + qq
        else:  # values / raw_scale = a z + b
            a, b = scale[rs] / raw_scale, mean[rs] / raw_scale
            d = a * a * s2 + 2 * a * b * s1 + W * b * b - 2.0 * (a * cross + b * q.sum()) + qq
        out[rs, :O] = np.maximum(d, 0.0) / W
    return out


def _drop_unmatchable(corpus: X.Corpus, el: Eligible, widths: np.ndarray, weights: np.ndarray,
                      excluded: list[dict[str, Any]], counts: dict[str, int]) -> tuple[Eligible, np.ndarray]:
    """Rows whose run is shorter than the window, or where the window is under 8 of its stored
    points, are not compared; runs left with no compared metric are excluded with the reason."""
    short = el.avail & (widths > 1.0 + 1e-9)
    coarse = el.avail & ~short & (widths * F.GRID < F.MIN_PORTION_POINTS)
    avail = el.avail & ~short & ~coarse
    wp = avail.astype(np.float64) @ weights
    gone = wp <= 0
    for reason, flag, what in (("too_short", short, "the run is shorter than the query window"),
                               ("too_coarse", coarse, "the window is under 8 points of its stored grids")):
        bad = np.flatnonzero(gone & flag.any(axis=1))
        counts[reason] = counts.get(reason, 0) + len(bad)
        if len(bad):
            excluded.append({"reason": reason, "metric": None, "differences": [what], "count": int(len(bad)),
                             "run_ids": [str(corpus.run_ids[el.runs[b]]) for b in bad[:10]]})
    counts["no_comparable_metric"] = counts.get("no_comparable_metric", 0) + int(gone.sum())
    keep = ~gone
    rows = np.where(avail, el.rows, -1)
    return Eligible(el.runs[keep], rows[keep], el.s[keep], el.e[keep], avail[keep], wp[keep]), widths[keep]


def _around(total: np.ndarray, pool: np.ndarray, centres: np.ndarray, near: int) -> tuple[np.ndarray, np.ndarray]:
    """(runs, starts): the starts within +-near of each pool run's centre that have room for the window."""
    runs = np.repeat(pool, 2 * near + 1)
    starts = (centres[:, None] + np.arange(-near, near + 1)[None, :]).ravel()
    ok = (starts >= 0) & (starts < total.shape[1])
    runs, starts = runs[ok], starts[ok]
    ok = np.isfinite(total[runs, starts])
    return runs[ok], starts[ok]


def _pairs(el: Eligible, widths: np.ndarray, runs: np.ndarray, starts: np.ndarray, P: int) -> Eligible:
    """(run, start) pairs as rows of an ``Eligible``: s/e the window's fractions per metric."""
    s = np.where(el.avail[runs], (starts / P)[:, None], 0.0)
    e = np.where(el.avail[runs], np.minimum(s + np.nan_to_num(widths[runs]), 1.0), 1.0)
    return Eligible(el.runs[runs], el.rows[runs], s, e, el.avail[runs], el.wp[runs])


def _window_paa(corpus: X.Corpus, pairs: Eligible, normalize: str, scales: list[float],
                wvec: np.ndarray) -> np.ndarray:
    """(n + 1, PAA, M) the pairs' windows as PAA-32 vectors cut from the stored ones (slot 0
    free), sqrt(w)-scaled, zeros where not compared: stage 1b's cheap elastic pass."""
    out = np.zeros((len(pairs.runs) + 1, F.PAA, len(scales)))
    for j in range(len(scales)):
        have = pairs.avail[:, j]
        out[1:][have, :, j] = math.sqrt(wvec[j]) * row_features(
            corpus, pairs.rows[have, j], pairs.s[have, j], pairs.e[have, j], False, normalize, scales[j], "paa")
    return out


def search_anywhere(session: Session, corpus: X.Corpus, el: Eligible, qms: list[QueryMetric], qgrid: np.ndarray,
                    qpaa: np.ndarray, portion: Portion, query_first: float, normalize: str, scales: list[float],
                    wvec: np.ndarray, k: int, exact: bool, excluded: list[dict[str, Any]],
                    counts: dict[str, int]) -> tuple[Eligible, list[tuple[float, int]], int, np.ndarray, int]:
    """The k runs with the windows nearest to the query portion.

    ``el``: eligibility over whole runs. Returns the matched runs (an ``Eligible`` whose
    ``s``/``e`` are the matched windows), the ranking ``[(distance, index into it)]``, how
    many DTWs ran, their grids ((n + 1, GRID, M), slot 0 free, as ``gather``) and
    how many runs stage 1 scored."""
    if portion.whole:
        raise InputError("anywhere needs a window or a prefix of the query run: a whole run only matches whole runs")
    widths = window_widths(corpus, el, portion, query_first)
    el, widths = _drop_unmatchable(corpus, el, widths, wvec, excluded, counts)
    n, M = el.rows.shape
    if n == 0:
        return el, [], 0, np.zeros((1, F.GRID, M)), 0
    grids = corpus.grids is not None
    P = F.GRID if grids else F.PAA
    total = np.zeros((n, P))
    for j, qm in enumerate(qms):
        have = el.avail[:, j]
        if not have.any():
            continue
        rows = el.rows[have, j]
        # the rows themselves: a run may be compared on an equivalent definition's row (``concepts``)
        z = (corpus.grids[rows, -1] if grids else corpus.paa[rows, -1]).astype(np.float64)
        d = _window_distances(z, corpus.stats[rows, -1], widths[have, j], qgrid[:, j] / math.sqrt(wvec[j]),
                              normalize, scales[j])
        total[have] += wvec[j] * d
    total /= el.wp[:, None]
    if exact:
        runs, starts = np.nonzero(np.isfinite(total))
        pairs = _pairs(el, widths, runs, starts, P)
    else:
        best = np.argmin(total, axis=1)
        keep1 = min(n, max(STAGE1_MIN, math.ceil(STAGE1_SHARE * n)))
        pool = np.argsort(total[np.arange(n), best], kind="stable")[:keep1]
        keep2 = max(POOL_MIN, POOL_PER_K * k)
        if len(pool) > keep2:  # stage 1b: PAA-32 DTW near each run's best start; the best keep2 runs go on
            runs, starts = _around(total, pool, best[pool], NEAR_PAA)
            buf = _window_paa(corpus, _pairs(el, widths, runs, starts, P), normalize, scales, wvec)
            d1 = dtw_block(qpaa, buf[1:], el.avail[runs], np.arange(len(runs)), None, PAA_WINDOW) \
                / np.sqrt(el.wp[runs])
            order = np.argsort(d1, kind="stable")
            _, first = np.unique(runs[order], return_index=True)
            top = order[np.sort(first)][:keep2]
            pool, best_starts = runs[top], starts[top]
        else:
            best_starts = best[pool]
        runs, starts = _around(total, pool, best_starts, NEAR)
        pairs = _pairs(el, widths, runs, starts, P)
    cut = replace(portion, kind="fraction", start=0.0, end=0.5)  # any non-whole portion: cut rows at s/e
    dist = np.full(len(runs), np.inf)
    for a in range(0, len(runs), CHUNK):
        sel = np.arange(a, min(a + CHUNK, len(runs)))
        buf = gather(*candidate_grids(session, corpus, pairs, sel, qms, cut, normalize, scales, wvec))
        dist[sel] = dtw_block(qgrid, buf[1:], pairs.avail[sel], np.arange(len(sel)), None, DTW_WINDOW) \
            / np.sqrt(F.GRID * pairs.wp[sel])
    # coverage first (``ranking``); windows with no finite distance last, whatever they cover
    order = coverage_first(dist, np.where(np.isfinite(dist), coverage_counts(pairs.avail), -1))
    _, first = np.unique(runs[order], return_index=True)  # each run's best start
    winners = order[np.sort(first)][:k]
    winners = winners[np.isfinite(dist[winners])]
    matched = Eligible(pairs.runs[winners], pairs.rows[winners], pairs.s[winners], pairs.e[winners],
                        pairs.avail[winners], pairs.wp[winners])
    buf = gather(*candidate_grids(session, corpus, matched, np.arange(len(winners)), qms, cut, normalize,
                                    scales, wvec))
    ranked = [(float(dist[w]), i) for i, w in enumerate(winners)]
    return matched, ranked, len(runs), buf, n
