"""Is the nearest run actually close? Judged against the collection's own nearest-neighbour distances.

A distance means little on its own: 0.4 is close in a collection of noisy LLM runs and far in a
sweep of CartPole seeds. So the reference is the collection itself: for a sample of its runs
(``REFERENCE_SAMPLE`` of the eligible runs compared on every query metric, chosen by their curves'
content, not their ids), the distance from each to its nearest other run, computed like the query's
(same metrics, portion, normalisation, banded DTW_D on the 128-point grids). Each sampled run's nearest
neighbour is sought among its ``SHORTLIST`` nearest by Euclidean distance of the PAA-32 vectors (the search's
own first stage, whose top 200 hold 99% of the true top 10 on the benchmark corpus); a missed
true nearest only makes that distance larger, so the reference errs towards calling a query
close, never towards a false "no close match".

The query's best distance above the reference's ``FAR_PERCENTILE``-th percentile is "no close
match"; with fewer than ``MIN_REFERENCE`` such runs the collection is too small to say, and the
result says so. The reference is cached on the loaded corpus per metric list, portion and
filter set, so it is recomputed whenever runs are added or removed (the corpus reloads then).
"""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from dtaidistance import dtw_ndim

REFERENCE_SAMPLE = 100
SHORTLIST = 16
MIN_REFERENCE = 10
FAR_PERCENTILE = 95.0
#: Distinct references kept per corpus (one per metric list / portion / filter set).
CACHE_SIZE = 32


@dataclass
class Closeness:
    """How the query's nearest run compares with the collection's usual nearest-neighbour distance."""

    status: str                     # "close", "far" (no close match), "partial" (no full match), "unknown"
    best_distance: float | None     # the nearest neighbour's distance
    reference_runs: int             # runs whose nearest-neighbour distance makes up the reference
    median: float | None            # of those distances
    p95: float | None               # their FAR_PERCENTILE-th percentile
    percentile: float | None        # share of those distances below the query's best (0-100)
    message: str

    @property
    def no_close_match(self) -> bool:
        return self.status in ("far", "partial")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "no_close_match": self.no_close_match}


def sample_positions(vectors: np.ndarray, size: int = REFERENCE_SAMPLE) -> np.ndarray:
    """Positions of ``size`` of the rows of ``vectors`` (all of them when there are no more), ascending.

    Chosen by the rows' content (spread evenly over the rows ordered by a checksum of their bytes), not by
    their place in the collection, which follows run ids: the same runs give the same reference whatever ids
    they were registered under (re-registering a run no longer moves the "no close match" bar for other queries)."""
    n = len(vectors)
    if n <= size:
        return np.arange(n)
    order = np.argsort([zlib.crc32(np.ascontiguousarray(row).tobytes()) for row in vectors], kind="stable")
    return np.sort(order[np.unique(np.linspace(0, n - 1, size).round().astype(np.int64))])


def nearest_distances(paa: np.ndarray, sample: np.ndarray, grids_of: Callable[[np.ndarray], np.ndarray],
                      norm: float, window: int, shortlist: int = SHORTLIST) -> np.ndarray:
    """Distance from each sampled run to its nearest other run.

    ``paa``: (n, D) weighted PAA vectors of all reference runs; ``sample``: positions into them;
    ``grids_of(positions)``: (len, L, M) float64 weighted grids of those runs; ``norm``: the
    divisor that turns raw DTW_D into the search's distance; ``window``: the DTW band.
    """
    x = paa.astype(np.float64)
    sq = np.einsum("nd,nd->n", x, x)
    keep = min(shortlist, len(x) - 1)
    short = np.empty((len(sample), keep), dtype=np.int64)
    for a in range(0, len(sample), 8):  # 8 rows of n distances at a time: bounded memory at 100k runs
        part = sample[a:a + 8]
        d2 = sq[part, None] + sq[None, :] - 2.0 * x[part] @ x.T
        d2[np.arange(len(part)), part] = np.inf  # not itself
        short[a:a + len(part)] = np.argpartition(d2, keep - 1, axis=1)[:, :keep]
    union, inverse = np.unique(np.concatenate([sample, short.ravel()]), return_inverse=True)
    grids = grids_of(union)
    at = inverse[:len(sample)]
    near = inverse[len(sample):].reshape(len(sample), keep)
    out = np.empty(len(sample))
    for i in range(len(sample)):
        stack = np.ascontiguousarray(np.concatenate([grids[at[i]][None], grids[near[i]]]))
        d = dtw_ndim.distance_matrix_fast(stack, window=window, block=((0, 1), (1, len(stack))), compact=True,
                                          parallel=False)
        out[i] = float(np.min(d)) / norm
    return out


def judge(best: float | None, best_coverage: int, total: int, reference: np.ndarray | None) -> Closeness:
    """The query's nearest neighbour against the reference distances (see the module)."""
    if best is None:
        return Closeness("unknown", None, 0, None, None, None, "No comparable runs, so nothing to be close to.")
    if best_coverage < total:
        return Closeness("partial", best, 0, None, None, None,
                         f"No close match: no run is compared on all {total} metrics; the nearest share "
                         f"{best_coverage} of {total}, so their distances say nothing about the others.")
    if reference is None or len(reference) < MIN_REFERENCE:
        n = 0 if reference is None else len(reference)
        return Closeness("unknown", best, n, None, None, None,
                         f"Too few comparable runs ({n}; at least {MIN_REFERENCE} needed) to know what distance "
                         "counts as close in this collection.")
    median = float(np.median(reference))
    p95 = float(np.percentile(reference, FAR_PERCENTILE))
    pct = float(100.0 * np.mean(reference < best))
    figures = (f"runs here are usually {median:.2f} from their nearest neighbour (median; "
               f"{FAR_PERCENTILE:.0f}th percentile {p95:.2f}, over {len(reference)} runs)")
    if best > p95:
        return Closeness("far", best, len(reference), median, p95, pct,
                         f"No close match: the nearest run is {best:.2f} away, while {figures}; read the "
                         "neighbours' outcomes with care.")
    return Closeness("close", best, len(reference), median, p95, pct,
                     f"The nearest run is {best:.2f} away; {figures}.")


def cached_reference(corpus: Any, key: tuple, compute: Callable[[], np.ndarray | None]) -> np.ndarray | None:
    """The reference for ``key``, computed once per loaded corpus (a new corpus, after runs change, recomputes)."""
    cache = corpus.__dict__.setdefault("_nn_reference", {})
    if key not in cache:
        while len(cache) >= CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[key] = compute()
    return cache[key]
