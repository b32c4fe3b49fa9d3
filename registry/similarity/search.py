"""Similar-run search: candidate stage over stored embeddings, exact banded-DTW rerank.

Stage 0 (SQL): the filters (project / task / algorithm of the query run, a filter-language
expression, verdicts) and the embedding version.

Stage 1 (candidates): per run, the weighted squared Euclidean distance between PAA-32
vectors of the compared portion, summed over the metrics both runs have with compatible
semantics (``sqrt(w)`` scaling, i.e. one L2 distance over the concatenated vectors). The
``C = max(200, 2% of the eligible runs)`` nearest go on. SQLite, and PostgreSQL without
pgvector: a NumPy scan over the per-process cache (``index.load_corpus``); whole-run
queries read cached (runs, metrics x 32) float32 matrices in place, with a coarse PAA-8
pass first (see ``_stage1``). PostgreSQL with pgvector: C = ``max(200, 2 sqrt(n))``
(every candidate costs database work there, see ``INDEX_CANDIDATE_SQRT``); an HNSW search
per metric in the database for its ``2 C`` nearest (``SET LOCAL hnsw.ef_search``,
``hnsw.iterative_scan = relaxed_order`` so filters do not starve the scan), the union
rescored in SQL on every metric and cut to ``2 C`` runs, whose PAA rows are loaded and
scored as above (see ``_pgvector_pool``; measured at 10k runs: recall@10 0.96 end to end,
against 0.89 when the union of per-metric lists of C was loaded unscored). Queries the index cannot serve
(step alignment, windows, raw scale, exact mode) use the NumPy path and say so in ``engine``.

Stages 1b and 1c (elastic pre-rank): banded DTW_D at coarse resolutions, which follows the
warping the Euclidean score cannot: on the PAA-32 vectors (32 points, band 3, ~1/16 of the
exact cost) the C candidates shrink to ``max(40, 4k, n / 500)``; on the grids averaged over
pairs of points (64 points, band 5, ~1/5) those shrink to ``max(20, 2k, n / 2500)`` (20 for
k = 10 up to 50k runs, 40 at 100k; n / 500 and n / 2500 are the shares 1/10 and 1/50 of
the full scan's C). Collections of at most 200 eligible runs skip both and get the exact DTW in
full. (Measured on the benchmark corpus at 10k runs, recall@10 of each stage's pool
against brute force: Euclidean top 200 0.99, PAA-32 DTW top 40 0.98, 64-point DTW top 20
0.98.)

Stage 2 (rerank): multi-metric dependent DTW (one warping path for all metrics, DTW_D) on
the 128-point grids, Sakoe-Chiba band of 10% (13 points), with dtaidistance's C code, on
the stage-1c pool, in one call. The result is exact over that pool. Whole-run grids come
from a cached float32 (runs, 128, metrics) stack, the corpus's own values: one ``np.take``
per query for the stage-1c pool, whose rows give both its halved grids and the rerank's
float64 buffer. ``exact=True`` skips stages 1-1c and runs stage 2 over every eligible run,
in LB_Keogh order with pruning (exact, since the bound is one); ``brute_force`` is one C
call over every eligible run, from the same cached stack.

Distances are ``DTW_D / sqrt(128 * sum of the weights compared)``: the RMS difference per
grid point, in z units for shapes (0 is identical, ~1.4 is unrelated).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from dtaidistance import dtw, dtw_ndim
from sqlalchemy import ARRAY, String, any_, bindparam, case, func, or_, select, text
from sqlalchemy.orm import Session, selectinload

from registry.errors import InputError
from registry.models import CurveEmbedding, MetricDefinition, Run, Series
from registry.semantics import semantic_differences
from registry.store import read_series_chunks
from registry.similarity import features as F
from registry.similarity import index as X
from registry.similarity.result import Neighbour, SimilarResult, summarize

DTW_WINDOW = max(1, round(0.1 * F.GRID))
MIN_CANDIDATES = 200
CANDIDATE_SHARE = 0.02
#: Bands of the coarse elastic stages: PAA-32 vectors (32 points) and halved grids (64 points).
PAA_WINDOW = 3
HALF_WINDOW = 5
#: Stage 1b keeps max(PAA_POOL_MIN, PAA_POOL_PER_K * k, PAA_POOL_SHARE * C) of the C
#: candidates (PAA-32 DTW); stage 1c keeps max(RERANK_MIN, RERANK_PER_K * k, RERANK_SHARE * C)
#: of those (64-point DTW) for the exact DTW. The shares matter from ~50k runs on: larger
#: collections hold more near-ties (at 100k, pools of 40 and 20 gave recall@10 0.89, 200 and
#: 40 gave 0.99).
PAA_POOL_MIN = 40
PAA_POOL_PER_K = 4
PAA_POOL_SHARE = 0.1
RERANK_MIN = 20
RERANK_PER_K = 2
RERANK_SHARE = 0.02
#: Whole-run float64 stacks kept per corpus (one per metric list).
STACK_CACHE = 8
HNSW_PER_METRIC = 2  # nearest rows per metric from the index, as a multiple of C
#: With the HNSW index every candidate costs database work (index steps, a rescored row, a
#: fetched row), so there C grows as INDEX_CANDIDATE_SQRT * sqrt(n) instead of with n, while
#: the elastic pools keep their size for the collection (shares of the in-process C). At 100k
#: runs: C = 633, recall@10 0.965, p50 446 ms; C = 2,000 gave 0.990 but 981 ms.
INDEX_CANDIDATE_SQRT = 2.0
#: Above this many rows the query's own semantics group is sized by the planner's estimate
#: of the number of runs rather than counted (see ``_group_sizes``): counting would be the one
#: per-query cost on the team server that grows linearly with the collection.
GROUP_COUNT_CAP = 10_000
_STACK_LOCK = threading.Lock()
#: Planned-length hyperparameters, used to place a running run's progress on the fraction axis.
TOTAL_STEP_PARAMS = ("total_timesteps", "n_timesteps", "total_training_steps", "max_steps", "total_steps",
                     "num_train_steps", "trainer.total_training_steps")
#: Short metric names and the dictionary quantities they stand for.
SHORT_NAMES = {"reward": ("reward", "return"), "return": ("return", "reward"), "score": ("reward", "return"),
               "kl": ("kl",), "entropy": ("entropy",)}
HEADLINE = ("reward", "kl", "entropy")


# --- query preparation ------------------------------------------------------------------

@dataclass
class Portion:
    """Which part of each run is compared.

    kind "fraction": [start, end] as fractions of each run's own step span.
    kind "step": [start, end] in absolute steps; ``start`` None means each run's own first step.
    """

    kind: str
    start: float | None
    end: float
    label: str | None
    mode: str  # "whole", "prefix" or "window"

    @property
    def is_prefix(self) -> bool:
        return self.mode == "prefix"

    @property
    def whole(self) -> bool:
        return self.kind == "fraction" and self.start == 0.0 and self.end == 1.0

    def fractions(self, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-row [start, end] fractions of the rows' spans."""
        if self.kind == "fraction":
            return np.full(len(first), float(self.start)), np.full(len(first), float(self.end))
        span = np.maximum(last - first, 1e-12)
        start = np.zeros(len(first)) if self.start is None else (self.start - first) / span
        return np.clip(start, 0.0, None), (self.end - first) / span


#: Eligibility over whole runs: what an anywhere search slides its window over.
WHOLE = Portion("fraction", 0.0, 1.0, None, "whole")


@dataclass
class QueryMetric:
    name: str
    weight: float
    sem_key: str
    semantics: dict[str, Any]
    steps: np.ndarray
    values: np.ndarray


def _params_total(params: Mapping[str, Any]) -> float | None:
    for key, value in params.items():
        if any(key == p or key.endswith("." + p) for p in TOTAL_STEP_PARAMS) and isinstance(value, (int, float)):
            if value > 0 and not isinstance(value, bool):
                return float(value)
    return None


def resolve_metrics(available: Mapping[str, dict[str, Any]], requested: Sequence[str] | str | None,
                    algorithm: str | None = None) -> list[str]:
    """Canonical names for the requested metrics of a run.

    ``available``: canonical name -> {quantity, layer, count, keys}. A requested name is,
    in order: a canonical name; a raw key the run logged; a short name ("reward", "return",
    "kl", "entropy", or any dictionary quantity) resolved to the run's metric of that
    quantity: objective/constraint layers first, then names ending in ``_mean``, then (for
    KL) the reference KL for GRPO and the old-policy KL otherwise, then most points.
    Default: the run's reward/return, KL and entropy (those it has).
    """
    if isinstance(requested, str):
        requested = [p.strip() for p in requested.split(",") if p.strip()]
    explicit = requested is not None
    names = list(requested) if explicit else list(HEADLINE)
    out: list[str] = []
    for name in names:
        hit = _resolve_one(available, name, algorithm)
        if hit is None:
            if explicit:
                raise InputError(f"run has no metric {name!r}; it has: {', '.join(sorted(available)) or 'none'}")
            continue
        if hit not in out:
            out.append(hit)
    if not out:
        objective = sorted((n for n, a in available.items() if a["layer"] == "objective"),
                           key=lambda n: -available[n]["count"])
        out = objective[:3]
    if not out:
        raise InputError("run has no mapped metrics to compare")
    return out


def _resolve_one(available: Mapping[str, dict[str, Any]], name: str, algorithm: str | None) -> str | None:
    if name in available:
        return name
    for canonical, info in available.items():
        if name in info["keys"]:
            return canonical
    quantities = SHORT_NAMES.get(name.lower(), (name.lower(),))
    pool = [n for n, a in available.items() if a["quantity"] in quantities]
    if not pool:
        return None
    kl_pref = "ref" if (algorithm or "").upper() == "GRPO" else "old"

    def rank(n: str) -> tuple:
        a = available[n]
        return (quantities.index(a["quantity"]), a["layer"] not in ("objective", "constraint"),
                not n.endswith("_mean"), kl_pref not in n if a["quantity"] == "kl" else False, -a["count"], n)

    return min(pool, key=rank)


def _coerce_bound(x: Any, what: str) -> float | int:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a number (fraction 0-1 or a step), got {x!r}")
    if isinstance(x, (int, np.integer)):
        return int(x)
    return float(x)


def make_portion(prefix: Any, window: Any, align: str, status: str, first: float, last: float,
                 total: float | None) -> Portion:
    """The compared portion (``total``: planned last step of a running run, when known)."""
    if align not in ("fraction", "step"):
        raise InputError(f"align must be 'fraction' or 'step', got {align!r}")
    if prefix is not None and window is not None:
        raise InputError("give either prefix or window, not both")
    running = status == "running"
    span = (total - first) if (running and total and total > last) else (last - first)
    span = max(span, 1e-12)
    if window is not None:
        try:
            a, b = (_coerce_bound(v, "window bound") for v in window)
        except (TypeError, ValueError):
            raise InputError(f"window must be a pair (start, end), got {window!r}") from None
        if isinstance(a, float) and isinstance(b, float) and 0 <= a < b <= 1 and align == "fraction":
            return Portion("fraction", a, b, f"training {a:.0%}-{b:.0%}", "window")
        if isinstance(a, float) and isinstance(b, float) and 0 <= a < b <= 1:
            a, b = first + a * span, first + b * span
        if not a < b:
            raise InputError(f"window start must be before its end, got {window!r}")
        if align == "fraction":
            fa, fb = (a - first) / span, (b - first) / span
            return Portion("fraction", max(fa, 0.0), min(fb, 1.0), f"training {fa:.0%}-{fb:.0%}", "window")
        return Portion("step", float(a), float(b), f"steps {int(a):,}-{int(b):,}", "window")
    if prefix is None:
        if not running:
            if align == "step":
                return Portion("step", None, last, f"the first {int(last):,} steps", "whole")
            return Portion("fraction", 0.0, 1.0, None, "whole")
        if align == "fraction" and total and total > last:
            f = (last - first) / span
            return Portion("fraction", 0.0, f, f"the first {f:.0%} of training (running run)", "prefix")
        return Portion("step", None, last, f"the first {int(last):,} steps (running run)", "prefix")
    p = _coerce_bound(prefix, "prefix")
    if isinstance(p, float):
        if not 0 < p <= 1:
            raise InputError(f"a fractional prefix must be in (0, 1], got {p}")
        if align == "fraction":
            return Portion("fraction", 0.0, p, f"the first {p:.0%} of training", "prefix")
        s = first + p * span
        return Portion("step", None, s, f"the first {int(s):,} steps", "prefix")
    if p <= first:
        raise InputError(f"prefix of {p} steps ends before the run's first step {int(first)}")
    if align == "fraction":
        f = min((p - first) / span, 1.0)
        return Portion("fraction", 0.0, f, f"the first {f:.0%} of training ({p:,} steps)", "prefix")
    return Portion("step", None, float(p), f"the first {p:,} steps", "prefix")


def _query_grid(q: QueryMetric, portion: Portion, total: float | None,
                origin: float | None = None) -> tuple[np.ndarray, float]:
    """The query metric's grid over the portion (``_query_span``), and its noise level."""
    steps, values, lo, hi = _query_span(q, portion, total, origin)
    if hi <= lo:
        return np.full(F.GRID, values[-1]), 0.0
    return F.bin_average(steps, values, lo, hi)


def _query_span(q: QueryMetric, portion: Portion, total: float | None,
                origin: float | None = None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The query metric's finite steps and values, and the first and last step of the portion.

    Fractions are of the metric's own step span, as for stored rows. For a running run,
    ``total`` is its planned last step and ``origin`` its first step (over all metrics):
    fractions are then of the planned span ``[origin, total]``, one axis for every metric,
    and each metric's part starts where its data starts. (Per-metric spans would not do: a
    metric logged from a later step, as SB3's ``train/*`` from the second rollout, would
    need data past the run's last step to cover the same fraction of its own plan.)
    """
    steps = q.steps.astype(np.float64)
    keep = np.isfinite(q.values)
    steps, values = steps[keep], q.values[keep]
    if not len(values):
        raise InputError(f"metric {q.name!r} has no finite points")
    first, last = steps[0], steps[-1]
    if portion.kind == "fraction" and total and total > last:
        base = first if origin is None else min(origin, first)
        lo, hi = base + portion.start * (total - base), base + portion.end * (total - base)
        lo = max(lo, first)
    elif portion.kind == "fraction":
        span = last - first
        lo, hi = first + portion.start * span, first + portion.end * span
    else:
        lo = first if portion.start is None else max(portion.start, first)
        hi = portion.end
    if hi > last:
        # metrics logged at other cadences end a little earlier: tolerate 5% of the portion
        if hi - last > 0.05 * max(hi - lo, 1e-12) + 1e-9:
            raise InputError(f"metric {q.name!r} only reaches step {int(last):,}; "
                             f"the query portion ends at {int(hi):,}")
        hi = last
    return steps, values, lo, hi


# --- the search ---------------------------------------------------------------------------

def _renorm(raw: np.ndarray, noise: np.ndarray | float, normalize: str, raw_scale: float) -> np.ndarray:
    """Rows of raw values (a cut portion, or PAA): their shape (z mode), or values / raw_scale."""
    if normalize == "raw":
        return raw / raw_scale
    return F.shape(raw, noise)[0]


def _row_features(corpus: X.Corpus, rows: np.ndarray, s: np.ndarray, e: np.ndarray, whole: bool,
                  normalize: str, scale: float, kind: str, grids: np.ndarray | None = None) -> np.ndarray:
    """Stage-1 PAA vectors (kind 'paa') or stage-2 grids (kind 'grid') of the given rows' portions."""
    n = F.PAA if kind == "paa" else F.GRID
    if not len(rows):
        return np.zeros((0, n))
    lv = np.full(len(rows), F.N_LEVELS - 1) if whole else F.level_for(e)
    stats = corpus.stats[rows, lv]
    if kind == "paa":
        base = corpus.paa[rows, lv].astype(np.float64)
    else:
        base = (grids if grids is not None else corpus.grids[rows])[np.arange(len(rows)), lv].astype(np.float64)
    if whole and normalize == "z":
        return base
    if not whole:
        base = F.portion(base, np.asarray(F.LEVELS)[lv], s, e, n=n)
    raw = base * stats[:, 6:7] + stats[:, 0:1]  # z * scale + mean
    return _renorm(raw, stats[:, 7], normalize, scale)


def _running(x: np.ndarray, r: int, op: Any) -> np.ndarray:
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


def _lb_query_envelope(qt: np.ndarray, xt: np.ndarray, mask: np.ndarray, r: int) -> np.ndarray:
    """Squared LB_Keogh: candidates (C, M, L) against the query's (M, L) envelope."""
    upper, lower = _running(qt, r, np.maximum), _running(qt, r, np.minimum)
    viol = np.maximum(xt - upper, 0.0) + np.maximum(lower - xt, 0.0)
    return np.einsum("cml,cm->c", viol * viol, mask)


def _dtw_block(q: np.ndarray, xs: np.ndarray, avail: np.ndarray, sel: np.ndarray,
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
        out[grp] = _dtw_stack(stack, window, max_dist)
    return out


def _dtw_stack(stack: np.ndarray, window: int, max_dist: float | None = None) -> np.ndarray:
    """Raw DTW_D of stack[0] against stack[1:] (a C-contiguous float64 (n + 1, L, M) array), one C call."""
    return np.asarray(dtw_ndim.distance_matrix_fast(stack, window=window, block=((0, 1), (1, len(stack))),
                                                    compact=True, parallel=False, max_dist=max_dist))


def _rerank(q: np.ndarray, xs: np.ndarray, avail: np.ndarray, wp: np.ndarray, k: int,
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
            d = _dtw_stack(buf, DTW_WINDOW) / norm
        else:
            d = _dtw_block(q, xs, avail, np.arange(n), None) / norm
        order = np.argsort(d, kind="stable")[:k]
        return [(float(d[i]), int(i)) for i in order], n
    d = np.full(n, np.inf)
    seed = np.arange(min(n, k + 6))
    d[seed] = _dtw_block(q, xs, avail, seed, None) / norm[seed]
    computed = len(seed)
    rest = np.arange(len(seed), n)
    if len(rest):
        kth = float(np.partition(d[seed], min(k, len(seed)) - 1)[min(k, len(seed)) - 1])
        qt = np.ascontiguousarray(q.T)
        xt = np.ascontiguousarray(xs[rest].transpose(0, 2, 1))
        mask = avail[rest].astype(np.float64)
        lb = np.sqrt(_lb_query_envelope(qt, xt, mask, DTW_WINDOW)) / norm[rest]
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
            d[sel] = _dtw_block(q, xs, avail, sel, float(kth * norm[sel].max() * (1 + 1e-9))) / norm[sel]
            computed += len(sel)
            pos += 64
            finite = d[np.isfinite(d)]
            kth = float(np.partition(finite, k - 1)[k - 1]) if len(finite) >= k else np.inf
    top = np.argsort(d, kind="stable")[:k]
    return [(float(d[i]), int(i)) for i in top if np.isfinite(d[i])], computed


def _load_query(session: Session, run: Run) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    rows = session.execute(
        select(Series.id, Series.key, Series.count, Series.sign, Series.semantics, MetricDefinition.name,
               MetricDefinition.quantity, MetricDefinition.layer)
        .join(MetricDefinition, Series.definition_id == MetricDefinition.id)
        .where(Series.run_id == run.id).order_by(Series.count.desc(), Series.key)
    ).all()
    available: dict[str, dict[str, Any]] = {}
    for r in rows:
        a = available.setdefault(r.name, {"quantity": r.quantity, "layer": r.layer, "count": r.count, "keys": [],
                                          "series_id": r.id, "sign": r.sign, "semantics": r.semantics or {}})
        a["keys"].append(r.key)
    from registry.hparams import restore_value

    params = {p.key: restore_value(p.value_type, p.num_value, p.text_value) for p in run.params}
    return available, params


def _filters(run: Run, where: str | None, same_task: bool, same_project: bool, same_algorithm: bool,
             outcome: Any) -> list[Any]:
    from registry.filters import compile_filter

    conds: list[Any] = []
    if where:
        conds.append(compile_filter(where))
    if same_task:
        conds.append(Run.task == run.task if run.task is not None else Run.task.is_(None))
    if same_project:
        conds.append(Run.project == run.project)
    if same_algorithm:
        conds.append(Run.algorithm == run.algorithm if run.algorithm is not None else Run.algorithm.is_(None))
    if outcome:
        verdicts = [outcome] if isinstance(outcome, str) else list(outcome)
        conds.append(Run.verdict.in_(verdicts))
    return conds


def _key_dict(key: str) -> dict[str, Any]:
    out = {}
    for part in key.split("|"):
        f, _, v = part.partition("=")
        out[f] = None if v == "-" else v
    return out


@dataclass
class _Eligible:
    runs: np.ndarray      # corpus run indices
    rows: np.ndarray      # (n, M) row positions, -1 where not compared
    s: np.ndarray         # (n, M) portion start fraction per row
    e: np.ndarray
    avail: np.ndarray     # (n, M) bool
    wp: np.ndarray        # (n,) compared weight


def _eligible(corpus: X.Corpus, qms: list[QueryMetric], portion: Portion, run_mask: np.ndarray,
              excluded: list[dict[str, Any]], counts: dict[str, int], report_semantics: bool = True) -> _Eligible:
    M = len(qms)
    R = len(corpus.run_ids)
    rows = np.full((R, M), -1, dtype=np.int64)
    s_all = np.zeros((R, M))
    e_all = np.ones((R, M))
    has_any = np.zeros(R, dtype=bool)
    reasons = {"semantics": np.zeros(R, bool), "too_short": np.zeros(R, bool), "too_coarse": np.zeros(R, bool)}
    for j, qm in enumerate(qms):
        pos, codes, keys, _, _ = corpus.dense(qm.name)
        present = (pos >= 0) & run_mask
        has_any |= present
        qcode = keys.index(qm.sem_key) if qm.sem_key in keys else -2
        wrong = present & (codes != qcode)
        reasons["semantics"] |= wrong
        if report_semantics and wrong.any():
            for code in np.unique(codes[wrong]):
                bad = np.flatnonzero(wrong & (codes == code))
                diffs = semantic_differences({f: qm.semantics.get(f) for f in X.STRICT_FIELDS}, _key_dict(keys[code]))
                excluded.append({"reason": "semantics", "metric": qm.name, "differences": diffs,
                                 "count": int(len(bad)), "run_ids": [str(corpus.run_ids[b]) for b in bad[:10]]})
        idx = np.flatnonzero(present & ~wrong)
        p = pos[idx]
        if portion.whole:
            ok = np.ones(len(p), dtype=bool)
            s, e = np.zeros(len(p)), np.ones(len(p))
        else:
            s, e = portion.fractions(corpus.first[p], corpus.last[p])
            short = (e > 1 + 1e-9) | (corpus.last[p] <= corpus.first[p])
            e = np.minimum(e, 1.0)
            lv = F.level_for(e)
            coarse = ~short & (F.portion_points(np.asarray(F.LEVELS)[lv], s, e) < F.MIN_PORTION_POINTS)
            reasons["too_short"][idx[short]] = True
            reasons["too_coarse"][idx[coarse]] = True
            ok = ~short & ~coarse
        rows[idx[ok], j] = p[ok]
        s_all[idx[ok], j] = s[ok]
        e_all[idx[ok], j] = e[ok]
    avail = rows >= 0
    w = np.array([qm.weight for qm in qms])
    wp = avail.astype(np.float64) @ w
    keep = wp > 0
    dropped = has_any & ~keep
    counts["no_comparable_metric"] = int(dropped.sum())
    for reason, flag in reasons.items():
        n = int((flag & dropped).sum())
        counts[reason] = n
        if n and reason != "semantics":
            bad = np.flatnonzero(flag & dropped)
            what = "its data ends before the query portion" if reason == "too_short" else \
                "the portion is under 8 points of its stored grids"
            excluded.append({"reason": reason, "metric": None, "differences": [what], "count": n,
                             "run_ids": [str(corpus.run_ids[b]) for b in bad[:10]]})
    runs = np.flatnonzero(keep)
    return _Eligible(runs, rows[runs], s_all[runs], e_all[runs], avail[runs], wp[runs])


def _scales(corpus: X.Corpus, qms: list[QueryMetric], normalize: str) -> list[float]:
    if normalize != "raw":
        return [1.0] * len(qms)
    out = []
    for qm in qms:
        rows = np.flatnonzero(corpus.metric == qm.name)
        std = corpus.stats[rows, -1, 1] if len(rows) else np.array([1.0])
        out.append(float(np.median(std)) or 1.0)
    return out


def _stage_grids(corpus: X.Corpus, el: _Eligible, sel: np.ndarray, portion: Portion, normalize: str,
                 scales: list[float], weights: np.ndarray, grids: np.ndarray | None = None) -> np.ndarray:
    """(len(sel), GRID, M) stage-2 grids of eligible runs ``sel``, sqrt(w)-scaled, zeros where not compared.

    ``grids``: (len(sel), M, levels, GRID) fetched for ``sel``, when the corpus holds none.
    """
    out = np.zeros((len(sel), F.GRID, len(scales)))
    for j in range(len(scales)):
        have = el.avail[sel, j]
        rows = el.rows[sel[have], j]
        g = None if grids is None else grids[have, j]
        feats = _row_features(corpus, rows, el.s[sel[have], j], el.e[sel[have], j], portion.whole, normalize,
                              scales[j], "grid", g)
        out[have, :, j] = feats * math.sqrt(weights[j])
    return out


def _whole_stack(corpus: X.Corpus, names: Sequence[str], kind: str) -> Any:
    """Per-run arrays of the metrics ``names`` (zeros where a run has no row), built once per
    corpus and metric list (the few most recent lists are kept), so a query never converts
    the corpus: it gathers its candidates with one ``np.take``.

    kind "grid": (R, GRID, M) C-contiguous float32 whole-run z-grids (None: grids not
    loaded), the values the corpus holds: stage 1c gathers its pool's rows once, and both
    its halved grids and the rerank's float64 buffer are made from those rows (see
    ``_gather``; half the bytes of a float64 stack to read cold, and the rerank reads no
    stack at all); "paa": (R, PAA * M + M) float32 rows, see ``_with_norms``: the PAA
    vectors laid out like the grids (point-major) and their squared norms per metric; and the same for PAA-8
    (means of 4 consecutive PAA-32 segments), transposed to (PAA / 4 * M + M, R): the
    coarse pass is a vector-matrix product over all runs, which BLAS runs ~2.5x faster on
    that layout than a matrix-vector product over 27-value rows. Stage 1 gathers its pool's
    rows from the PAA-32 matrix once and hands the survivors' vectors to stage 1b as they
    are (no second gather).
    """
    key = (kind, tuple(names))
    with _STACK_LOCK:
        cache = corpus.__dict__.setdefault("_stacks", {})
        hit = cache.pop(key, None)
        if hit is None:
            if kind == "grid" and corpus.grids is None:
                return None
            if kind == "grid":
                hit = np.zeros((len(corpus.run_ids), F.GRID, len(names)), dtype=np.float32)
                for j, name in enumerate(names):
                    hit[:, :, j] = corpus.whole_grids(name)
            else:
                x = np.stack([corpus.dense(n)[3] for n in names], axis=2)  # (R, PAA, M)
                x8 = _with_norms(x.reshape(len(x), F.PAA // 4, 4, len(names)).mean(axis=2))
                x_all = _with_norms(x)
                hit = (x_all, np.ascontiguousarray(x8.T))
            while len(cache) >= STACK_CACHE:
                cache.pop(next(iter(cache)))
        cache[key] = hit  # most recent last
    return hit


def _with_norms(x: np.ndarray) -> np.ndarray:
    """(R, P, M) float32 -> (R, P * M + M): each row's values, then its squared norm per
    metric, so that one matrix product over the rows gives the distances (``_paa_scores``)."""
    return np.concatenate([x.reshape(len(x), -1), np.einsum("rpm,rpm->rm", x, x)], axis=1, dtype=np.float32)


def _halve(x: np.ndarray) -> np.ndarray:
    """(..., GRID, M) -> (..., GRID / 2, M): means of consecutive pairs of points."""
    return 0.5 * (x[..., 0::2, :] + x[..., 1::2, :])


def _weight_mask(el: _Eligible, sel: np.ndarray, wvec: np.ndarray) -> np.ndarray | None:
    """(len(sel), M) per-channel factors sqrt(w) * compared, or None when all are 1."""
    avail = el.avail[sel]
    if avail.all() and (wvec == 1.0).all():
        return None
    return avail * np.sqrt(wvec)[None, :]


def _smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k smallest values, unordered (ties at the k-th: the first ones).

    A partition of the values plus one comparison pass: about half the time of
    ``np.argpartition`` on 10k scores, which moves an index array along with them."""
    if k >= len(values):
        return np.arange(len(values))
    kth = _kth_smallest(values, k)
    return np.flatnonzero(values <= kth)[:k]


def _kth_smallest(values: np.ndarray, k: int, stride: int = 8) -> Any:
    """The k-th smallest value (1-based), exactly.

    ``np.partition`` costs ~8 ns per value (80 us on 10k scores). When k is a small share,
    a threshold from every ``stride``-th value (its ``2 k / stride``-th smallest, so about
    2 k values fall under it) leaves ~2 k values to partition; all values under the
    threshold are kept, so when at least k are (else: the full partition) the k-th
    smallest among them is the k-th smallest of all. ~3x faster at 10k values, k = 600."""
    if len(values) < 8 * k:
        return np.partition(values, k - 1)[k - 1]
    sample = values[::stride]
    j = 2 * k // stride
    small = values[values <= np.partition(sample, j)[j]]
    if len(small) < k:
        return np.partition(values, k - 1)[k - 1]
    return np.partition(small, k - 1)[k - 1]


def _stage1(corpus: X.Corpus, el: _Eligible, qms: list[QueryMetric], qpaa: np.ndarray, portion: Portion,
            normalize: str, scales: list[float], wvec: np.ndarray, C: int) -> tuple[np.ndarray, np.ndarray]:
    """The C candidates (eligible positions) nearest by Euclidean distance of PAA-32
    vectors (weighted, per compared weight), best first, and their (C, PAA, M) float32
    PAA vectors (unweighted; channels a candidate does not compare may hold values).

    Whole-run z queries read the cached per-run PAA matrix in place; when the collection is
    larger than ``3 C``, a coarse pass over PAA-8 vectors (means of 4 PAA-32 segments: a
    quarter of the memory traffic, and ``4 x ED(PAA-8) <= ED(PAA-32)``) keeps ``3 C`` first.
    (Measured on the benchmark corpus at 10k runs: the coarse pass loses none of the PAA-32
    top C; an LB_PAA envelope term added to the score no longer paid for its cost once the
    grids were denoised.) Other portions cut every eligible row's PAA vector per query.
    """
    n, M = len(el.runs), len(qms)
    q = (qpaa / np.sqrt(wvec)[None, :]).astype(np.float32)  # (PAA, M) unweighted
    w = wvec.astype(np.float32)
    avail = None if el.avail.all() else el.avail
    if portion.whole and normalize == "z":
        x_all, x8 = _whole_stack(corpus, [qm.name for qm in qms], "paa")
        pool = np.arange(n)
        if 3 * C < n:
            coarse = _coarse_scores(x8, q.reshape(F.PAA // 4, 4, M).mean(axis=1), w, el.runs, avail)
            pool = _smallest(coarse, 3 * C)
        x = np.take(x_all, el.runs[pool], axis=0)  # (a fancy index reads these cold rows ~1.5x slower)
        ed = _paa_scores(x, q, w, None if avail is None else avail[pool])
        pos = np.arange(len(pool))
    else:
        pool = pos = np.arange(n)
        x = np.zeros((n, F.PAA, M), dtype=np.float32)
        for j in range(M):
            have = el.avail[:, j]
            x[have, :, j] = _row_features(corpus, el.rows[have, j], el.s[have, j], el.e[have, j], portion.whole,
                                          normalize, scales[j], "paa")
        x = _with_norms(x)
        ed = _paa_scores(x, q, w, avail)
    if avail is not None:
        ed /= el.wp[pool]
    if C < len(pool):
        pos = _smallest(ed, C)
    pos = pos[np.argsort(ed[pos], kind="stable")]
    return pool[pos], x[pos, :F.PAA * M].reshape(len(pos), F.PAA, M)


def _paa_scores(x: np.ndarray, q: np.ndarray, w: np.ndarray, avail: np.ndarray | None) -> np.ndarray:
    """Weighted squared Euclidean distance of each row of ``x`` ((R, P * M + M) float32 from
    ``_with_norms``) to the query's (P, M) vectors, over the metrics a row compares
    (``avail`` (R, M); None: all), as ||x||^2 - 2 x.q + ||q||^2. All compared: one
    matrix-vector product with the weights folded into the query (a single pass over the
    rows); else one product with a block-diagonal query matrix, per metric. (Both avoid
    reductions over the short metric axis, which cost more than the products at 10k rows.)"""
    if avail is None:
        vec, const = _query_vector(q, w)
        ed = x @ vec
        ed += const
        return np.maximum(ed, 0.0, out=ed)
    blocks, qq = _query_blocks(q)
    d = x @ blocks
    d += qq[None, :]
    np.maximum(d, 0.0, out=d)
    return (d * avail) @ w


def _query_vector(q: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """The (P * M + M,) float32 vector whose product with a ``_with_norms`` row is its weighted
    squared distance to the query minus ``||q||^2_w``, and that constant."""
    qq = np.einsum("pm,pm->m", q, q)
    return np.concatenate([-2.0 * (q * w[None, :]).reshape(-1), w]).astype(np.float32), float(qq @ w)


def _query_blocks(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (P * M + M, M) float32 block-diagonal matrix giving per-metric squared distances to
    the query minus ``||q_m||^2``, and those (M,) constants."""
    P, M = q.shape
    blocks = np.concatenate([(-2.0 * q[:, :, None] * np.eye(M)[None]).reshape(P * M, M), np.eye(M)])
    return blocks.astype(np.float32), np.einsum("pm,pm->m", q, q)


def _coarse_scores(xt: np.ndarray, q: np.ndarray, w: np.ndarray, runs: np.ndarray,
                   avail: np.ndarray | None) -> np.ndarray:
    """``_paa_scores`` of the eligible runs ``runs`` from the transposed (P * M + M, R)
    matrix of ``_whole_stack`` (the PAA-8 pass): the products run over every run (a
    contiguous pass; gathering the eligible columns first would copy the matrix), then the
    eligible entries are taken."""
    if avail is None:
        vec, const = _query_vector(q, w)
        ed = vec @ xt
        ed = ed[runs] if len(runs) < len(ed) else ed
        ed += const
        return np.maximum(ed, 0.0, out=ed)
    blocks, qq = _query_blocks(q)
    d = (blocks.T @ xt)[:, runs]  # (M, n)
    d += qq[:, None]
    np.maximum(d, 0.0, out=d)
    return w.astype(np.float32) @ (d * avail.T)


def _elastic_order(q: np.ndarray, buf: np.ndarray, avail: np.ndarray, wp: np.ndarray, keep: int,
                   window: int) -> np.ndarray:
    """Positions (into ``buf[1:]``) of the ``keep`` nearest by banded DTW_D at a coarse
    resolution, best first.

    ``q``: the query at that resolution (L, M); ``buf``: (C + 1, L, M), slot 0 free. The
    cascade runs it twice: on the PAA-32 vectors (32 points, band ``PAA_WINDOW``, ~1/16 of
    the exact DTW's cost) and on grids averaged over pairs of points (64 points, band
    ``HALF_WINDOW``, ~1/5). Both follow the warping, which the Euclidean stage 1 does not.
    """
    if avail.all():
        buf[0] = q
        d = _dtw_stack(buf, window)
    else:
        d = _dtw_block(q, buf[1:], avail, np.arange(len(avail)), None, window=window)
    d = d / np.sqrt(wp)
    if keep < len(d):
        part = np.argpartition(d, keep - 1)[:keep]
        return part[np.argsort(d[part], kind="stable")]
    return np.argsort(d, kind="stable")


def _candidate_grids(session: Session, corpus: X.Corpus, el: _Eligible, cand: np.ndarray, qms: list[QueryMetric],
                     portion: Portion, normalize: str, scales: list[float],
                     wvec: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Stage-2 grids of the candidates, (len(cand), GRID, M), and the per-channel factors
    still to apply to them (``_gather`` does): whole-run z queries with loaded grids
    get the cached float32 rows and ``_weight_mask``; other portions float64 grids already
    sqrt(w)-scaled with zeros where not compared, and None."""
    if portion.whole and normalize == "z" and corpus.grids is not None:
        base = _whole_stack(corpus, [qm.name for qm in qms], "grid")
        return np.take(base, el.runs[cand], axis=0), _weight_mask(el, cand, wvec)
    grids = _fetch_candidate_grids(session, corpus, el, cand) if corpus.grids is None else None
    return _stage_grids(corpus, el, cand, portion, normalize, scales, wvec, grids), None


def _gather(rows: np.ndarray, mask: np.ndarray | None, sel: np.ndarray | None = None,
            halve: bool = False) -> np.ndarray:
    """(len(sel) + 1, L, M) C-contiguous float64 for the C code: slot 0 free for the query,
    then rows[sel] (all rows for None) cast from their dtype (float32 PAA rows and grids),
    halved (means of pairs of points, stage 1c) or not, times mask[sel]. The halving sums
    are taken in float64 before the mask, as ``_halve`` on a float64 stack then masked."""
    if sel is not None:
        rows, mask = rows[sel], None if mask is None else mask[sel]
    n, L, M = rows.shape
    buf = np.empty((n + 1, L // 2 if halve else L, M))
    buf[0] = 0.0
    if halve:
        np.add(rows[:, 0::2], rows[:, 1::2], out=buf[1:], dtype=np.float64)
        buf[1:] *= 0.5
    else:
        buf[1:] = rows
    if mask is not None:
        buf[1:] *= mask[:, None, :]
    return buf


def _query_features(qms: list[QueryMetric], portion: Portion, total: float | None, origin: float,
                    normalize: str, scales: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Query grid (GRID, M) and PAA (PAA, M), sqrt(w)-scaled, prepared like the stored rows."""
    grid = np.zeros((F.GRID, len(qms)))
    paa = np.zeros((F.PAA, len(qms)))
    for j, qm in enumerate(qms):
        raw, noise = _query_grid(qm, portion, total, origin)
        if normalize == "raw":
            g = raw / scales[j]
            p = F.paa(g)
        else:
            g = F.shape(raw, noise)[0][0]
            # stored portions are cut at PAA resolution and normalised there: do the same
            p = F.paa(g) if portion.whole else F.shape(F.paa(raw), noise)[0][0]
        w = math.sqrt(qm.weight)
        grid[:, j], paa[:, j] = g * w, p * w
    return grid, paa


def _candidate_count(n: int, candidates: int | None) -> int:
    return n if candidates is None and n <= MIN_CANDIDATES else \
        int(candidates or max(MIN_CANDIDATES, math.ceil(CANDIDATE_SHARE * n)))


def _index_candidate_count(n: int, candidates: int | None) -> int:
    """Stage-1 pool size when the candidates come from the HNSW index (see INDEX_CANDIDATE_SQRT)."""
    return n if candidates is None and n <= MIN_CANDIDATES else \
        int(candidates or max(MIN_CANDIDATES, math.ceil(INDEX_CANDIDATE_SQRT * math.sqrt(n))))


def _rerank_count(n: int, C: int, k: int, candidates: int | None, rerank: int | None) -> int:
    """Size of the exact-DTW pool among C stage-1 candidates (see ``find_similar``)."""
    if rerank is not None:
        if not isinstance(rerank, int) or rerank < 1:
            raise InputError(f"rerank must be a positive integer, got {rerank!r}")
        return min(C, rerank)
    if candidates is None and n <= MIN_CANDIDATES:
        return C
    return min(C, max(RERANK_MIN, RERANK_PER_K * k, math.ceil(RERANK_SHARE * C)))


def find_similar(registry: Any, run_ref: str, metrics: Sequence[str] | str | None = None, k: int = 10,
                 prefix: float | int | None = None, window: tuple[float, float] | None = None,
                 align: str = "fraction", normalize: str = "z", where: str | None = None, same_task: bool = False,
                 same_project: bool = False, same_algorithm: bool = False, outcome: str | Sequence[str] | None = None,
                 weights: Mapping[str, float] | None = None, candidates: int | None = None, exact: bool = False,
                 total_steps: int | None = None, rerank: int | None = None, anywhere: bool = False,
                 _brute: bool = False) -> SimilarResult:
    """The k historical runs whose curves look most like this run's (see the package docstring).

    ``candidates``: stage-1 pool size (default ``max(MIN_CANDIDATES, CANDIDATE_SHARE * n)``);
    ``rerank``: how many of them, in stage-1c order, get the exact DTW (default
    ``max(RERANK_MIN, RERANK_PER_K * k, RERANK_SHARE * C)``; every candidate when the collection has at most
    ``MIN_CANDIDATES`` eligible runs and ``candidates`` is not given). ``anywhere``: match the
    window or prefix against windows of the same length anywhere in each run (``anywhere.py``).
    """
    t0 = time.perf_counter()
    if normalize not in ("z", "raw"):
        raise InputError(f"normalize must be 'z' or 'raw', got {normalize!r}")
    if not isinstance(k, int) or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}")
    with registry.read() as session:
        run = registry.resolve_run(session, run_ref)
        run = session.scalar(select(Run).where(Run.id == run.id).options(selectinload(Run.params)))
        available, qparams = _load_query(session, run)
        names = resolve_metrics(available, metrics, run.algorithm)
        w = dict(weights or {})
        qms = []
        for name in names:
            a = available[name]
            data = read_series_chunks(session, a["series_id"]).per_step()
            steps, values = data.steps, data.values
            qms.append(QueryMetric(name, float(w.get(name, 1.0)), X.semantics_key(a["semantics"]), a["semantics"],
                                   steps, values * a["sign"] if a["sign"] != 1.0 else values))
        if any(qm.weight <= 0 for qm in qms):
            raise InputError("metric weights must be positive")
        finite = [qm.steps[np.isfinite(qm.values)] for qm in qms]
        finite = [f for f in finite if len(f)]
        if not finite:
            raise InputError("the query run has no finite points in the chosen metrics")
        first, last = min(float(f[0]) for f in finite), max(float(f[-1]) for f in finite)
        total = float(total_steps) if total_steps else _params_total(qparams)
        portion = make_portion(prefix, window, align, run.status, first, last, total)
        if anywhere and portion.whole:
            raise InputError("anywhere needs a window or a prefix of the query run: a whole run only matches "
                             "whole runs")
        conds = _filters(run, where, same_task, same_project, same_algorithm, outcome)
        warnings: list[str] = []
        excluded: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        t_prep = time.perf_counter()

        use_pg = (X.has_vector_columns(session) and portion.kind == "fraction" and portion.start == 0.0
                  and normalize == "z" and not exact and not _brute and not anywhere)
        if use_pg:
            corpus, engine, n_filtered, index_s = _pgvector_pool(session, run, qms, portion, conds,
                                                        total if run.status == "running" else None, first,
                                                        candidates, excluded, counts)
            run_mask = corpus.run_ids != run.id
        else:
            index_s = 0.0
            corpus = X.load_corpus(session)
            engine = _numpy_engine_label(session, portion, normalize, exact or _brute, anywhere, corpus)
            run_mask = np.ones(len(corpus.run_ids), dtype=bool)
            if conds:
                ids = np.array(sorted(session.scalars(select(Run.id).where(*conds))), dtype=str)
                run_mask = np.isin(corpus.run_ids, ids)
            qi = corpus.run_index(run.id)
            if qi >= 0:
                run_mask[qi] = False
        t_load = time.perf_counter()
        el = _eligible(corpus, qms, WHOLE if anywhere else portion, run_mask, excluded, counts,
                       report_semantics=not use_pg)
        if use_pg:  # runs of other semantics on every metric, counted in SQL: the pool never holds them
            n_sem = counts.pop("semantics_pool")
            counts["semantics"] += n_sem
            counts["no_comparable_metric"] += n_sem
        scales = _scales(corpus, qms, normalize)
        wvec = np.array([qm.weight for qm in qms])
        qtotal = total if run.status == "running" else None
        qgrid, qpaa = _query_features(qms, portion, qtotal, first, normalize, scales)
        n_el = len(el.runs)

        # stage 1 (Euclidean on PAA vectors over all eligible runs), 1b (DTW on PAA-32), 1c (DTW on 64 points)
        t1 = time.perf_counter()
        n_half = n_paa = 0
        buf = None
        if anywhere:
            from registry.similarity.anywhere import search_anywhere

            el, ranked, computed, buf, C = search_anywhere(session, corpus, el, qms, qgrid, qpaa, portion, first,
                                                           normalize, scales, wvec, k, exact, excluded, counts)
            cand = np.arange(len(el.runs))
        elif exact or _brute:
            cand = np.arange(n_el)
            C = n_el
        else:
            n_all = n_filtered if use_pg else n_el
            C_scan = _candidate_count(n_all, candidates)  # what a full scan keeps: sizes the pools
            C = min(n_el, _index_candidate_count(n_all, candidates) if use_pg else C_scan)
            cand, cand_paa = _stage1(corpus, el, qms, qpaa, portion, normalize, scales, wvec, C)
            R2 = min(len(cand), _rerank_count(n_all, C_scan, k, candidates, rerank))
            R1 = max(R2, PAA_POOL_MIN, PAA_POOL_PER_K * k, math.ceil(PAA_POOL_SHARE * C_scan))
            if len(cand) > R1:
                paa_buf = _gather(cand_paa, _weight_mask(el, cand, wvec))
                cand = cand[_elastic_order(qpaa, paa_buf, el.avail[cand], el.wp[cand], R1, PAA_WINDOW)]
                n_paa = C
            if len(cand) > 1:  # (also when R2 covers them all: the order seeds the early abandoning)
                grids = _candidate_grids(session, corpus, el, cand, qms, portion, normalize, scales, wvec)
                best = _elastic_order(_halve(qgrid), _gather(*grids, halve=True), el.avail[cand], el.wp[cand],
                                      R2, HALF_WINDOW)
                n_half = len(cand)
                cand = cand[best]
        # stage 2 (exact banded DTW on the 128-point grids)
        t2 = time.perf_counter()
        if n_half:  # the rerank's rows are among stage 1c's, already read
            buf = _gather(*grids, sel=best)
        elif buf is None:
            buf = _gather(*_candidate_grids(session, corpus, el, cand, qms, portion, normalize, scales, wvec))
        xs = buf[1:]
        if not anywhere:
            ranked, computed = _rerank(qgrid, xs, el.avail[cand], el.wp[cand], k, brute=_brute, buf=buf,
                                       lb=n_half == 0)
        t3 = time.perf_counter()

        neighbours = _neighbours(session, corpus, el, cand, ranked, qms, qgrid, xs, portion, qparams, wvec)
        if anywhere:
            _place_matches(neighbours, corpus, el)
        t4 = time.perf_counter()
        others = corpus.other_versions if not use_pg else X.other_version_runs(session)
        if others:
            warnings.append(f"{others} run(s) only have embeddings of another version and are not compared; "
                            "run `rlreg reindex` to recompute them")
    objective = next((qm.name for qm in qms if available[qm.name]["layer"] == "objective"), None)
    result = SimilarResult(
        query={"run_id": run.id, "name": run.name, "status": run.status, "verdict": run.verdict,
               "portion_kind": portion.mode, "anywhere": anywhere,
               "portion_label": f"{portion.label}, anywhere in each run" if anywhere else portion.label,
               "align": portion.kind, "start": portion.start, "end": portion.end,
               "normalize": normalize, "first_step": int(first), "last_step": int(last),
               "compared_steps": {qm.name: [int(round(b)) for b in _query_span(qm, portion, qtotal, first)[2:]]
                                  for qm in qms},
               "planned_total_steps": total, "params": qparams},
        metrics=names, weights={qm.name: qm.weight for qm in qms}, k=k, engine=engine,
        embedding_version=F.EMBEDDING_VERSION, neighbours=neighbours, excluded=excluded, excluded_counts=counts,
        warnings=warnings,
        stats={"eligible_runs": int(n_el), "candidates": int(C), "paa_dtw_computed": int(n_paa),
               "half_dtw_computed": int(n_half),
               "reranked": int(len(cand)), "dtw_computed": int(computed), "corpus_rows": int(corpus.n)},
        # the pgvector index search is the candidate stage's first step, though it runs before
        # the eligibility pass: it counts as search, not as loading
        timings={"prepare_ms": (t_prep - t0) * 1e3, "load_ms": (t_load - t_prep - index_s) * 1e3,
                 "index_ms": index_s * 1e3, "candidates_ms": (t2 - t1 + index_s) * 1e3, "rerank_ms": (t3 - t2) * 1e3,
                 "search_ms": (t3 - t1 + index_s) * 1e3, "results_ms": (t4 - t3) * 1e3,
                 "total_ms": (time.perf_counter() - t0) * 1e3},
    )
    _name_exclusions(registry, result)
    summarize(result, objective)
    if anywhere and neighbours:
        starts = sorted(n.match_start for n in neighbours if n.match_start is not None)
        if starts:
            where = f" (in this run: {portion.start:.0%})" if portion.kind == "fraction" else ""
            result.summary += (f" The pattern sat at a median {starts[len(starts) // 2]:.0%} of their "
                               f"training{where}.")
    return result


def _place_matches(neighbours: list[Neighbour], corpus: X.Corpus, el: _Eligible) -> None:
    """Where each neighbour's matched window starts, as a fraction of its training (first compared metric)."""
    starts = {}
    for i, r in enumerate(el.runs):
        j = int(np.argmax(el.avail[i]))
        starts[str(corpus.run_ids[r])] = float(el.s[i, j])
    for n in neighbours:
        n.match_start = starts.get(n.run_id)


def brute_force(registry: Any, run_ref: str, **kwargs: Any) -> SimilarResult:
    """Ground truth: banded DTW_D against every eligible run, no pruning (tests, benchmark)."""
    return find_similar(registry, run_ref, _brute=True, **kwargs)


def _numpy_engine_label(session: Session, portion: Portion, normalize: str, exact: bool, anywhere: bool = False,
                        corpus: X.Corpus | None = None) -> str:
    if anywhere:
        scan = "128-point grids" if corpus is not None and corpus.grids is not None else \
            "PAA-32 vectors (grids not kept in memory)"
        return (f"numpy subsequence (every start scored on the {scan}, "
                f"{'DTW at every start' if exact else 'DTW at the best starts'})")
    if X._engine_of(session).dialect.name != "postgresql":
        return "numpy"
    status = X.pgvector_status(X._engine_of(session))
    if status != "ready":
        return {"missing": "numpy (pgvector not installed)",
                X.NEEDS_SUPERUSER: "numpy (pgvector not created in this database: needs a superuser)",
                }.get(status, "numpy (pgvector available but not enabled: run `rlreg reindex`)")
    why = ("exact mode" if exact else "raw-scale queries" if normalize == "raw" else
           "step-aligned queries" if portion.kind == "step" else "window queries")
    return f"numpy ({why} are not served by the pgvector index)"


def _fetch_candidate_grids(session: Session, corpus: X.Corpus, el: _Eligible, cand: np.ndarray) -> np.ndarray:
    """(len(cand), M, levels, GRID) stored z-grids of the candidates' rows."""
    rows = el.rows[cand]
    out = np.zeros((*rows.shape, F.N_LEVELS, F.GRID), dtype=np.float16)
    have = rows >= 0
    out[have] = X.fetch_grids(session, corpus.ids[rows[have]])
    return out


def _neighbours(session: Session, corpus: X.Corpus, el: _Eligible, cand: np.ndarray, ranked: list[tuple[float, int]],
                qms: list[QueryMetric], qgrid: np.ndarray, xs: np.ndarray, portion: Portion,
                qparams: dict[str, Any], wvec: np.ndarray) -> list[Neighbour]:
    from registry.store import run_to_dict

    if not ranked:
        return []
    picks = [(d, int(cand[i]), i) for d, i in ranked]
    run_ids = [str(corpus.run_ids[el.runs[e]]) for _, e, _ in picks]
    runs = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(run_ids)).options(
        selectinload(Run.params), selectinload(Run.tags), selectinload(Run.scores)))}
    objective_j = 0
    # per-metric DTW of each pick: one C call per metric
    per_metric_d = np.full((len(picks), len(qms)), np.nan)
    for j in range(len(qms)):
        have = [i for i, (_, e, _) in enumerate(picks) if el.rows[e, j] >= 0]
        if have:
            sw = math.sqrt(wvec[j])
            stack = np.empty((len(have) + 1, F.GRID))
            stack[0] = qgrid[:, j] / sw
            stack[1:] = xs[[picks[i][2] for i in have], :, j] / sw
            per_metric_d[have, j] = np.asarray(dtw.distance_matrix_fast(
                stack, window=DTW_WINDOW, block=((0, 1), (1, len(stack))), compact=True,
                parallel=False)) / math.sqrt(F.GRID)
    out = []
    for rank, ((dist, e, ci), rid) in enumerate(zip(picks, run_ids), 1):
        pi = rank - 1
        r = runs.get(rid)
        if r is None:
            continue  # deleted meanwhile
        info = run_to_dict(r)
        per_metric: dict[str, float | None] = {}
        compared: dict[str, list[int]] = {}
        warnings: list[str] = []
        for j, qm in enumerate(qms):
            row = el.rows[e, j]
            if row < 0:
                per_metric[qm.name] = None
                continue
            per_metric[qm.name] = float(per_metric_d[pi, j])
            f0, f1 = corpus.first[row], corpus.last[row]
            compared[qm.name] = [int(round(f0 + el.s[e, j] * (f1 - f0))), int(round(f0 + el.e[e, j] * (f1 - f0)))]
            lp = corpus.log_point[row]
            if lp != qm.semantics.get("logging_point"):
                warnings.append(f"{qm.name}: logging point {lp or 'unspecified'} vs "
                                f"{qm.semantics.get('logging_point') or 'unspecified'} (compared anyway)")
        for j, qm in enumerate(qms):
            if el.rows[e, j] < 0:
                pos = corpus.positions(qm.name)[el.runs[e]]
                why = "not logged" if pos < 0 else (
                    "semantics differ: " + "; ".join(semantic_differences(
                        {f: qm.semantics.get(f) for f in X.STRICT_FIELDS}, _key_dict(corpus.sem_key[pos])))
                    if corpus.sem_key[pos] != qm.sem_key else "outside the stored portion")
                warnings.append(f"{qm.name} not compared ({why})")
        prow = el.rows[e, objective_j]
        peak = None
        if prow >= 0:
            st = corpus.stats[prow, -1]
            peak = int(round(corpus.first[prow] + st[4] * (corpus.last[prow] - corpus.first[prow])))
        diff = {key: [qparams.get(key), val] for key, val in info["params"].items() if qparams.get(key) != val}
        diff.update({key: [val, None] for key, val in qparams.items() if key not in info["params"]})
        out.append(Neighbour(
            rank=rank, run_id=rid, name=info["name"], project=info["project"], task=info["task"],
            algorithm=info["algorithm"], status=info["status"], verdict=info["verdict"], scores=info["scores"],
            params=info["params"], param_diff=diff, distance=float(dist), metric_distances=per_metric,
            metrics_compared=int(el.avail[e].sum()), compared_steps=compared, peak_step=peak, warnings=warnings))
    for i, n in enumerate(out, 1):
        n.rank = i
    return out


def _name_exclusions(registry: Any, result: SimilarResult) -> None:
    ids = sorted({rid for g in result.excluded for rid in g["run_ids"]})
    if not ids:
        return
    with registry.read() as session:
        names = dict(session.execute(select(Run.id, Run.name).where(Run.id.in_(ids))).all())
    for g in result.excluded:
        g["runs"] = [{"id": rid, "name": names.get(rid)} for rid in g.pop("run_ids")]


# --- pgvector candidate pool --------------------------------------------------------------

def _pgvector_pool(session: Session, run: Run, qms: list[QueryMetric], portion: Portion, conds: list[Any],
                   total: float | None, origin: float, candidates: int | None,
                   excluded: list[dict[str, Any]], counts: dict[str, int]) -> tuple[X.Corpus, str, int, float]:
    """Candidate runs from the HNSW indexes, as a small Corpus; also the engine label, the
    collection size the pool is sized by, and the seconds the index search and scoring took
    (the candidate stage's part inside the database).

    One index search per metric gives its nearest ``HNSW_PER_METRIC * C`` rows; the union of
    those runs is then scored in SQL by the weighted mean squared distance over the metrics
    each compares (as stage 1 scores them), and the best ``2 * C`` are loaded. (The union
    alone is several times larger; scoring a run missing from one list by that list's
    largest distance, a lower bound, promotes runs near on one metric over runs near on all.)
    """
    CE = CurveEmbedding
    level_i = int(np.argmin(np.abs(np.log(np.asarray(F.LEVELS) / max(portion.end, 1e-6)))))
    col = X.VECTOR_COLUMNS[level_i]
    n_filtered = _semantic_groups(session, run, qms, conds, excluded, counts)
    t_index = time.perf_counter()
    C = _index_candidate_count(n_filtered, candidates)
    if F.LEVELS[level_i] != portion.end:
        C *= 2  # the stored level only approximates this prefix: widen the pool
    limit = HNSW_PER_METRIC * C
    ef = min(max(limit, 40), 1000)
    session.execute(text(f"SET LOCAL hnsw.ef_search = {ef}"))
    session.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
    session.execute(text(f"SET LOCAL hnsw.max_scan_tuples = {max(20000, 20 * limit)}"))
    vectors = []
    union: set[str] = set()
    for qm in qms:
        raw, noise = _query_grid(qm, portion, total, origin)
        vectors.append(X.vector_literal(F.paa(F.shape(raw, noise)[0][0])))
        stmt = select(CE.run_id).where(CE.version == F.EMBEDDING_VERSION, CE.metric == qm.name,
                                       CE.semantics_key == qm.sem_key, CE.run_id != run.id)
        if conds:
            stmt = stmt.join(Run, Run.id == CE.run_id).where(*conds)
        union.update(session.scalars(stmt.order_by(text(f"curve_embeddings.{col} <-> CAST(:qv AS vector)")
                                                   .bindparams(qv=vectors[-1])).limit(limit)))
    pool = sorted(union)
    ids = bindparam("pool_ids", pool, type_=ARRAY(String))
    runs: Any = CE.run_id == any_(ids)
    if len(pool) > 2 * C:
        runs = CE.run_id.in_(_nearest_by_vectors(col, qms, vectors, ids, 2 * C))
    # PAA vectors and level statistics only: the grids of the few runs left after the PAA-32
    # DTW stage are fetched for those alone. One statement: the pool's ids go to the server
    # once, as one array, and the scoring and the fetch share its plan.
    corpus = X.fetch_rows(session, runs & CE.metric.in_([qm.name for qm in qms]), with_grids=False)
    engine = (f"pgvector hnsw ({col}, ef_search={ef}, iterative_scan=relaxed_order, "
              f"{len(union)} runs from the index, {len(corpus.run_ids)} compared)")
    return corpus, engine, n_filtered, time.perf_counter() - t_index


def _nearest_by_vectors(col: str, qms: list[QueryMetric], vectors: list[str], run_ids: Any, keep: int) -> Any:
    """A subquery of the ``keep`` of ``run_ids`` (an array parameter) nearest to the query by
    the weighted mean squared distance of their ``col`` vectors over the metrics (of the
    query's semantics) each has."""
    values = ", ".join(f"(:m{j}, :k{j}, CAST(:q{j} AS vector), CAST(:w{j} AS double precision))"
                       for j in range(len(qms)))
    params: dict[str, Any] = {"version": F.EMBEDDING_VERSION, "keep": keep}
    for j, (qm, vec) in enumerate(zip(qms, vectors)):
        params.update({f"m{j}": qm.name, f"k{j}": qm.sem_key, f"q{j}": vec, f"w{j}": qm.weight})
    # Each pool run's rows are reached through the (run_id, metric, version) index, by a
    # LATERAL lookup per id: with ``e.run_id = ANY(:pool_ids)`` or a plain join the planner
    # chose a scan of the whole table (12 of the statement's 15 ms at 10k runs, growing with
    # the collection) over about 3 index probes per pool run.
    scored = text(
        "SELECT p.run_id FROM unnest(:pool_ids) AS p(run_id) CROSS JOIN LATERAL ("
        f"SELECT SUM(q.weight * power(e.{col} <-> q.vec, 2)) / SUM(q.weight) AS score "
        f"FROM curve_embeddings e JOIN (VALUES {values}) AS q(metric, key, vec, weight) "
        "ON e.metric = q.metric AND e.semantics_key = q.key "
        "WHERE e.run_id = p.run_id AND e.version = :version) s "
        "WHERE s.score IS NOT NULL ORDER BY s.score, p.run_id LIMIT :keep"
    ).bindparams(run_ids, **params).columns(run_id=String).subquery("nearest")
    return select(scored.c.run_id)


def _semantic_groups(session: Session, run: Run, qms: list[QueryMetric], conds: list[Any],
                     excluded: list[dict[str, Any]], counts: dict[str, int]) -> int:
    """Count, per compared metric, the other runs (passing the filters) with embeddings of
    each semantics; record those of other semantics in ``excluded``, the runs comparable on
    none of the metrics in ``counts`` (they never reach the index's pool), and return the
    largest number of runs having one of the metrics (the collection size the pool is sized by).

    Without filters the counts come from the (version, metric, semantics_key) index alone
    (``_group_sizes``), the query run's own rows subtracted afterwards; an example run is
    looked up per excluded group."""
    CE = CurveEmbedding
    names = [qm.name for qm in qms]
    where = [CE.version == F.EMBEDDING_VERSION, CE.metric.in_(names)]
    if conds:  # the join reads the rows anyway
        stmt = select(CE.metric, CE.semantics_key, func.count()).where(*where) \
            .join(Run, Run.id == CE.run_id).where(*conds, CE.run_id != run.id)
        groups = {(m, key): int(n) for m, key, n in session.execute(stmt.group_by(CE.metric, CE.semantics_key))}
    else:
        groups = _group_sizes(session, qms)
        for m, key in session.execute(select(CE.metric, CE.semantics_key).where(*where, CE.run_id == run.id)):
            if (m, key) in groups:
                groups[(m, key)] -= 1
    per_metric: dict[str, int] = {}
    for (m, key), n in groups.items():
        per_metric[m] = per_metric.get(m, 0) + n
    for qm in qms:
        for (m, key), n in sorted(groups.items()):
            if m != qm.name or key == qm.sem_key or n <= 0:
                continue
            example = select(func.min(CE.run_id)).where(*where, CE.metric == m, CE.semantics_key == key,
                                                        CE.run_id != run.id)
            if conds:
                example = example.join(Run, Run.id == CE.run_id).where(*conds)
            excluded.append({"reason": "semantics", "metric": m, "count": n, "run_ids": [session.scalar(example)],
                             "differences": semantic_differences({f: qm.semantics.get(f) for f in X.STRICT_FIELDS},
                                                                 _key_dict(key))})
    counts["semantics_pool"] = 0
    if any(e["reason"] == "semantics" for e in excluded):
        match = or_(*[(CE.metric == qm.name) & (CE.semantics_key == qm.sem_key) for qm in qms])
        none_match = select(CE.run_id).where(*where, CE.run_id != run.id).group_by(CE.run_id) \
            .having(func.max(case((match, 1), else_=0)) == 0)
        if conds:
            none_match = none_match.join(Run, Run.id == CE.run_id).where(*conds)
        counts["semantics_pool"] = int(session.scalar(select(func.count()).select_from(none_match.subquery())) or 0)
    return max(per_metric.values(), default=0)


def _group_sizes(session: Session, qms: list[QueryMetric]) -> dict[tuple[str, str], int]:
    """Rows per (metric, semantics key) of the query's metrics, in one statement whose cost
    does not grow with the collection: the keys come from a skip scan of the (version,
    metric, semantics_key) index (one probe per key), the other semantics' groups (runs to
    name as excluded, usually few) are counted exactly, and the query's own group up to
    ``GROUP_COUNT_CAP`` rows; a larger one is taken as the planner's estimate of the number
    of runs (``pg_class.reltuples``, kept by autovacuum; counted when it is missing or
    below the cap), which only sizes the candidate pool (C grows with its square root)."""
    values = ", ".join(f"(CAST(:m{j} AS text), CAST(:k{j} AS text))" for j in range(len(qms)))
    params: dict[str, Any] = {"v": F.EMBEDDING_VERSION, "cap": GROUP_COUNT_CAP}
    for j, qm in enumerate(qms):
        params.update({f"m{j}": qm.name, f"k{j}": qm.sem_key})
    first_key = "SELECT min(semantics_key) FROM curve_embeddings WHERE version = :v AND metric = "
    rows = session.execute(text(
        f"WITH RECURSIVE q(metric, own) AS (VALUES {values}), "
        f"k(metric, own, key) AS (SELECT metric, own, ({first_key}q.metric) FROM q "
        f"UNION ALL SELECT metric, own, ({first_key}k.metric AND semantics_key > k.key) "
        "FROM k WHERE key IS NOT NULL) "
        "SELECT metric, key, key = own, (SELECT count(*) FROM (SELECT 1 FROM curve_embeddings c "
        "WHERE c.version = :v AND c.metric = k.metric AND c.semantics_key = k.key "
        "LIMIT CASE WHEN k.key = k.own THEN :cap END) s), "
        "(SELECT reltuples FROM pg_class WHERE oid = CAST('runs' AS regclass)) "
        "FROM k WHERE key IS NOT NULL"), params)
    out = {}
    for m, key, own, n, estimate in rows.all():
        if own and n >= GROUP_COUNT_CAP:
            # no usable estimate (never analysed, or stale below the cap): count after all
            n = estimate if estimate and estimate > n else session.scalar(
                select(func.count()).where(CurveEmbedding.version == F.EMBEDDING_VERSION,
                                           CurveEmbedding.metric == m, CurveEmbedding.semantics_key == key))
        out[(m, key)] = int(n)
    return out


def find_similar_for_run(registry: Any, run_id: str, *, status: str | None = None, **query: Any) -> Any:
    """``find_similar``, and for a running run whose fraction-of-plan prefix cannot be cut, the steps so far.

    A running run with a planned length (``total_timesteps``) is matched by default on the
    same fraction of training, up to its last step. When one of the compared metrics stopped
    well before that step (logged only early on, or at a much coarser cadence), that portion
    cannot be cut for it and the search refuses; the run is then matched, as a run without a
    planned length is, on the steps every metric has reached (a warning says so).
    """
    try:
        return find_similar(registry, run_id, **query)
    except InputError as exc:
        default = (query.get("prefix") is None and query.get("window") is None
                   and query.get("align", "fraction") == "fraction")
        if status != "running" or not default or "only reaches step" not in str(exc):
            raise
        reason = str(exc)
    last = _last_common_step(registry, run_id)
    result = find_similar(registry, run_id, **{**query, "prefix": last, "align": "step"})
    result.warnings.append(f"matched on the first {last:,} steps logged so far: the same fraction of the planned "
                           f"training cannot be cut for every metric ({reason})")
    return result


def _last_common_step(registry: Any, run_id: str) -> int:
    with registry.read() as session:
        return int(session.scalar(select(func.min(Series.last_step)).where(
            Series.run_id == run_id, Series.definition_id.is_not(None), Series.count > 0)) or 0)
