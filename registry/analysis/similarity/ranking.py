"""Coverage-first order: a run compared on more of the query's metrics ranks above one compared on fewer.

A distance over fewer metrics is not comparable with one over all of them: a neighbour that
only shares the entropy can be very close on it and say nothing about the reward. So every
stage orders candidates by (metrics compared, descending; distance, ascending): a neighbour
compared on 1 of 3 metrics never outranks a full match, and it appears only when fewer than k
runs share more. Collections where every candidate shares every metric (the usual case) take
the plain distance order unchanged.
"""
from __future__ import annotations

import numpy as np


def coverage_counts(avail: np.ndarray) -> np.ndarray:
    """(n,) how many of the query's metrics each candidate is compared on."""
    return avail.sum(axis=1)


def coverage_first(scores: np.ndarray, counts: np.ndarray, keep: int | None = None) -> np.ndarray:
    """Positions of the ``keep`` best (all when None) by (count descending, score ascending), best first.

    Ties keep their input order (a stable sort), like the distance-only order it replaces."""
    order = np.lexsort((scores, -counts))
    return order if keep is None else order[:keep]


def tiers(counts: np.ndarray) -> list[np.ndarray]:
    """Positions grouped by count, the highest count first (each group in input order)."""
    return [np.flatnonzero(counts == c) for c in sorted(np.unique(counts), reverse=True)]


def coverage_label(compared: int, total: int) -> str:
    """``"2 of 3 metrics"``."""
    return f"{compared} of {total} metric{'s' if total != 1 else ''}"
