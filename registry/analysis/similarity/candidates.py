"""The NumPy candidate stages: eligible rows, coarse (PAA) scores, the candidate pool and its grids."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.core.errors import InputError
from registry.db.models import Run
from registry.core.semantics import semantic_differences
from registry.analysis.similarity import concepts as CO
from registry.analysis.similarity import features as F
from registry.analysis.similarity import index as X
from registry.analysis.similarity import ranking as RK
from registry.analysis.similarity import query as QP


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


#: With the HNSW index every candidate costs database work (index steps, a rescored row, a
#: fetched row), so there C grows as INDEX_CANDIDATE_SQRT * sqrt(n) instead of with n, while
#: the elastic pools keep their size for the collection (shares of the in-process C). At 100k
#: runs: C = 633, recall@10 0.965, p50 446 ms; C = 2,000 gave 0.990 but 981 ms.
INDEX_CANDIDATE_SQRT = 2.0


STACK_LOCK = threading.Lock()


def renorm(raw: np.ndarray, noise: np.ndarray | float, normalize: str, raw_scale: float) -> np.ndarray:
    """Rows of raw values (a cut portion, or PAA): their shape (z mode), or values / raw_scale."""
    if normalize == "raw":
        return raw / raw_scale
    return F.shape(raw, noise)[0]


def row_features(corpus: X.Corpus, rows: np.ndarray, s: np.ndarray, e: np.ndarray, whole: bool,
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
    return renorm(raw, stats[:, 7], normalize, scale)


@dataclass
class Eligible:
    runs: np.ndarray      # corpus run indices
    rows: np.ndarray      # (n, M) row positions, -1 where not compared
    s: np.ndarray         # (n, M) portion start fraction per row
    e: np.ndarray
    avail: np.ndarray     # (n, M) bool
    wp: np.ndarray        # (n,) compared weight


def eligible(corpus: X.Corpus, qms: list[QP.QueryMetric], portion: QP.Portion, run_mask: np.ndarray,
              excluded: list[dict[str, Any]], counts: dict[str, int], report_semantics: bool = True) -> Eligible:
    M = len(qms)
    R = len(corpus.run_ids)
    rows = np.full((R, M), -1, dtype=np.int64)
    s_all = np.zeros((R, M))
    e_all = np.ones((R, M))
    has_any = np.zeros(R, dtype=bool)
    reasons = {"semantics": np.zeros(R, bool), "too_short": np.zeros(R, bool), "too_coarse": np.zeros(R, bool)}
    for j, qm in enumerate(qms):
        pos, codes, keys = CO.merged_view(corpus, qm.name, qm.alternatives, qm.sem_key)
        present = (pos >= 0) & run_mask
        has_any |= present
        qcode = keys.index(qm.sem_key) if qm.sem_key in keys else -2
        wrong = present & (codes != qcode)
        reasons["semantics"] |= wrong
        if report_semantics and wrong.any():
            for code in np.unique(codes[wrong]):
                bad = np.flatnonzero(wrong & (codes == code))
                diffs = semantic_differences({f: qm.semantics.get(f) for f in X.STRICT_FIELDS}, QP.key_dict(keys[code]))
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
    return Eligible(runs, rows[runs], s_all[runs], e_all[runs], avail[runs], wp[runs])


def metric_scales(corpus: X.Corpus, qms: list[QP.QueryMetric], normalize: str) -> list[float]:
    if normalize != "raw":
        return [1.0] * len(qms)
    out = []
    for qm in qms:
        rows = np.flatnonzero(corpus.metric == qm.name)
        std = corpus.stats[rows, -1, 1] if len(rows) else np.array([1.0])
        out.append(float(np.median(std)) or 1.0)
    return out


def stage_grids(corpus: X.Corpus, el: Eligible, sel: np.ndarray, portion: QP.Portion, normalize: str,
                 scales: list[float], weights: np.ndarray, grids: np.ndarray | None = None) -> np.ndarray:
    """(len(sel), GRID, M) stage-2 grids of eligible runs ``sel``, sqrt(w)-scaled, zeros where not compared.

    ``grids``: (len(sel), M, levels, GRID) fetched for ``sel``, when the corpus holds none.
    """
    out = np.zeros((len(sel), F.GRID, len(scales)))
    for j in range(len(scales)):
        have = el.avail[sel, j]
        rows = el.rows[sel[have], j]
        g = None if grids is None else grids[have, j]
        feats = row_features(corpus, rows, el.s[sel[have], j], el.e[sel[have], j], portion.whole, normalize,
                              scales[j], "grid", g)
        out[have, :, j] = feats * math.sqrt(weights[j])
    return out


def whole_stack(corpus: X.Corpus, names: Sequence[tuple[str, tuple[str, ...]]], kind: str) -> Any:
    """Per-run arrays of the metrics ``names`` (zeros where a run has no row), built once per
    corpus and metric list (the few most recent lists are kept), so a query never converts
    the corpus: it gathers its candidates with one ``np.take``.

    kind "grid": (R, GRID, M) C-contiguous float32 whole-run z-grids (None: grids not
    loaded), the values the corpus holds: stage 1c gathers its pool's rows once, and both
    its halved grids and the rerank's float64 buffer are made from those rows (see
    ``gather``; half the bytes of a float64 stack to read cold, and the rerank reads no
    stack at all); "paa": (R, PAA * M + M) float32 rows, see ``with_norms``: the PAA
    vectors laid out like the grids (point-major) and their squared norms per metric; and the same for PAA-8
    (means of 4 consecutive PAA-32 segments), transposed to (PAA / 4 * M + M, R): the
    coarse pass is a vector-matrix product over all runs, which BLAS runs ~2.5x faster on
    that layout than a matrix-vector product over 27-value rows. Stage 1 gathers its pool's
    rows from the PAA-32 matrix once and hands the survivors' vectors to stage 1b as they
    are (no second gather).
    """
    key = (kind, tuple(names))
    with STACK_LOCK:
        cache = corpus.__dict__.setdefault("_stacks", {})
        hit = cache.pop(key, None)
        if hit is None:
            if kind == "grid" and corpus.grids is None:
                return None
            if kind == "grid":
                hit = np.zeros((len(corpus.run_ids), F.GRID, len(names)), dtype=np.float32)
                for j, (name, alts) in enumerate(names):
                    hit[:, :, j] = CO.whole_rows(corpus, name, alts, "grid")
            else:
                x = np.stack([CO.whole_rows(corpus, n, alts, "paa") for n, alts in names], axis=2)  # (R, PAA, M)
                x8 = with_norms(x.reshape(len(x), F.PAA // 4, 4, len(names)).mean(axis=2))
                x_all = with_norms(x)
                hit = (x_all, np.ascontiguousarray(x8.T))
            while len(cache) >= STACK_CACHE:
                cache.pop(next(iter(cache)))
        cache[key] = hit  # most recent last
    return hit


def with_norms(x: np.ndarray) -> np.ndarray:
    """(R, P, M) float32 -> (R, P * M + M): each row's values, then its squared norm per
    metric, so that one matrix product over the rows gives the distances (``paa_scores``)."""
    flat = x.reshape(x.shape[0], x.shape[1] * x.shape[2])  # explicit: -1 is ambiguous for an empty corpus
    return np.concatenate([flat, np.einsum("rpm,rpm->rm", x, x)], axis=1, dtype=np.float32)


def halved(x: np.ndarray) -> np.ndarray:
    """(..., GRID, M) -> (..., GRID / 2, M): means of consecutive pairs of points."""
    return 0.5 * (x[..., 0::2, :] + x[..., 1::2, :])


def weight_mask(el: Eligible, sel: np.ndarray, wvec: np.ndarray) -> np.ndarray | None:
    """(len(sel), M) per-channel factors sqrt(w) * compared, or None when all are 1."""
    avail = el.avail[sel]
    if avail.all() and (wvec == 1.0).all():
        return None
    return avail * np.sqrt(wvec)[None, :]


def smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k smallest values, unordered (ties at the k-th: the first ones).

    A partition of the values plus one comparison pass: about half the time of
    ``np.argpartition`` on 10k scores, which moves an index array along with them."""
    if k >= len(values):
        return np.arange(len(values))
    kth = kth_smallest(values, k)
    return np.flatnonzero(values <= kth)[:k]


def kth_smallest(values: np.ndarray, k: int, stride: int = 8) -> Any:
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


def stage1(corpus: X.Corpus, el: Eligible, qms: list[QP.QueryMetric], qpaa: np.ndarray, portion: QP.Portion,
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
        x_all, x8 = whole_stack(corpus, [(qm.name, qm.alternatives) for qm in qms], "paa")
        pool = np.arange(n)
        if 3 * C < n:
            coarse = coarse_scores(x8, q.reshape(F.PAA // 4, 4, M).mean(axis=1), w, el.runs, avail)
            pool = smallest(coarse, 3 * C) if avail is None else \
                RK.coverage_first(coarse / el.wp, RK.coverage_counts(avail), 3 * C)
        x = np.take(x_all, el.runs[pool], axis=0)  # (a fancy index reads these cold rows ~1.5x slower)
        ed = paa_scores(x, q, w, None if avail is None else avail[pool])
        pos = np.arange(len(pool))
    else:
        pool = pos = np.arange(n)
        x = np.zeros((n, F.PAA, M), dtype=np.float32)
        for j in range(M):
            have = el.avail[:, j]
            x[have, :, j] = row_features(corpus, el.rows[have, j], el.s[have, j], el.e[have, j], portion.whole,
                                          normalize, scales[j], "paa")
        x = with_norms(x)
        ed = paa_scores(x, q, w, avail)
    if avail is not None:
        ed /= el.wp[pool]
        pos = RK.coverage_first(ed, RK.coverage_counts(avail[pool]), C)
    else:
        if C < len(pool):
            pos = smallest(ed, C)
        pos = pos[np.argsort(ed[pos], kind="stable")]
    return pool[pos], x[pos, :F.PAA * M].reshape(len(pos), F.PAA, M)


def paa_scores(x: np.ndarray, q: np.ndarray, w: np.ndarray, avail: np.ndarray | None) -> np.ndarray:
    """Weighted squared Euclidean distance of each row of ``x`` ((R, P * M + M) float32 from
    ``with_norms``) to the query's (P, M) vectors, over the metrics a row compares
    (``avail`` (R, M); None: all), as ||x||^2 - 2 x.q + ||q||^2. All compared: one
    matrix-vector product with the weights folded into the query (a single pass over the
    rows); else one product with a block-diagonal query matrix, per metric. (Both avoid
    reductions over the short metric axis, which cost more than the products at 10k rows.)"""
    if avail is None:
        vec, const = query_vector(q, w)
        ed = x @ vec
        ed += const
        return np.maximum(ed, 0.0, out=ed)
    blocks, qq = query_blocks(q)
    d = x @ blocks
    d += qq[None, :]
    np.maximum(d, 0.0, out=d)
    return (d * avail) @ w


def query_vector(q: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """The (P * M + M,) float32 vector whose product with a ``with_norms`` row is its weighted
    squared distance to the query minus ``||q||^2_w``, and that constant."""
    qq = np.einsum("pm,pm->m", q, q)
    return np.concatenate([-2.0 * (q * w[None, :]).reshape(-1), w]).astype(np.float32), float(qq @ w)


def query_blocks(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (P * M + M, M) float32 block-diagonal matrix giving per-metric squared distances to
    the query minus ``||q_m||^2``, and those (M,) constants."""
    P, M = q.shape
    blocks = np.concatenate([(-2.0 * q[:, :, None] * np.eye(M)[None]).reshape(P * M, M), np.eye(M)])
    return blocks.astype(np.float32), np.einsum("pm,pm->m", q, q)


def coarse_scores(xt: np.ndarray, q: np.ndarray, w: np.ndarray, runs: np.ndarray,
                   avail: np.ndarray | None) -> np.ndarray:
    """``paa_scores`` of the eligible runs ``runs`` from the transposed (P * M + M, R)
    matrix of ``whole_stack`` (the PAA-8 pass): the products run over every run (a
    contiguous pass; gathering the eligible columns first would copy the matrix), then the
    eligible entries are taken."""
    if avail is None:
        vec, const = query_vector(q, w)
        ed = vec @ xt
        ed = ed[runs] if len(runs) < len(ed) else ed
        ed += const
        return np.maximum(ed, 0.0, out=ed)
    blocks, qq = query_blocks(q)
    d = (blocks.T @ xt)[:, runs]  # (M, n)
    d += qq[:, None]
    np.maximum(d, 0.0, out=d)
    return w.astype(np.float32) @ (d * avail.T)


def candidate_grids(session: Session, corpus: X.Corpus, el: Eligible, cand: np.ndarray, qms: list[QP.QueryMetric],
                     portion: QP.Portion, normalize: str, scales: list[float],
                     wvec: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Stage-2 grids of the candidates, (len(cand), GRID, M), and the per-channel factors
    still to apply to them (``gather`` does): whole-run z queries with loaded grids
    get the cached float32 rows and ``weight_mask``; other portions float64 grids already
    sqrt(w)-scaled with zeros where not compared, and None."""
    if portion.whole and normalize == "z" and corpus.grids is not None:
        base = whole_stack(corpus, [(qm.name, qm.alternatives) for qm in qms], "grid")
        return np.take(base, el.runs[cand], axis=0), weight_mask(el, cand, wvec)
    grids = fetch_candidate_grids(session, corpus, el, cand) if corpus.grids is None else None
    return stage_grids(corpus, el, cand, portion, normalize, scales, wvec, grids), None


def gather(rows: np.ndarray, mask: np.ndarray | None, sel: np.ndarray | None = None,
            halve: bool = False) -> np.ndarray:
    """(len(sel) + 1, L, M) C-contiguous float64 for the C code: slot 0 free for the query,
    then rows[sel] (all rows for None) cast from their dtype (float32 PAA rows and grids),
    halved (means of pairs of points, stage 1c) or not, times mask[sel]. The halving sums
    are taken in float64 before the mask, as ``halved`` on a float64 stack then masked."""
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


def candidate_count(n: int, candidates: int | None) -> int:
    return n if candidates is None and n <= MIN_CANDIDATES else \
        int(candidates or max(MIN_CANDIDATES, math.ceil(CANDIDATE_SHARE * n)))


def index_candidate_count(n: int, candidates: int | None) -> int:
    """Stage-1 pool size when the candidates come from the HNSW index (see INDEX_CANDIDATE_SQRT)."""
    return n if candidates is None and n <= MIN_CANDIDATES else \
        int(candidates or max(MIN_CANDIDATES, math.ceil(INDEX_CANDIDATE_SQRT * math.sqrt(n))))


def rerank_count(n: int, C: int, k: int, candidates: int | None, rerank: int | None) -> int:
    """Size of the exact-DTW pool among C stage-1 candidates (see ``find_similar``)."""
    if rerank is not None:
        if not isinstance(rerank, int) or rerank < 1:
            raise InputError(f"rerank must be a positive integer, got {rerank!r}")
        return min(C, rerank)
    if candidates is None and n <= MIN_CANDIDATES:
        return C
    return min(C, max(RERANK_MIN, RERANK_PER_K * k, math.ceil(RERANK_SHARE * C)))


def filter_mask(session: Session, corpus: X.Corpus, conds: list[Any]) -> np.ndarray:
    """(R,) the corpus runs that pass the query's filters."""
    if not conds:
        return np.ones(len(corpus.run_ids), dtype=bool)
    return np.isin(corpus.run_ids, np.array(sorted(session.scalars(select(Run.id).where(*conds))), dtype=str))


def fetch_candidate_grids(session: Session, corpus: X.Corpus, el: Eligible, cand: np.ndarray) -> np.ndarray:
    """(len(cand), M, levels, GRID) stored z-grids of the candidates' rows."""
    rows = el.rows[cand]
    out = np.zeros((*rows.shape, F.N_LEVELS, F.GRID), dtype=np.float16)
    have = rows >= 0
    out[have] = X.fetch_grids(session, corpus.ids[rows[have]])
    return out
