"""Similar-run search: candidate stage over stored embeddings, exact banded-DTW rerank.

Stage 0 (SQL): the filters (project / task / algorithm of the query run, a filter-language
expression, verdicts) and the embedding version.

Stage 1 (candidates): per run, the weighted squared Euclidean distance between PAA-32
vectors of the compared portion, summed over the metrics both runs have with compatible
semantics (``sqrt(w)`` scaling, i.e. one L2 distance over the concatenated vectors). The
``C = max(200, 2% of the eligible runs)`` nearest go on. SQLite, and PostgreSQL without
pgvector: a NumPy scan over the per-process cache (``index.load_corpus``); whole-run
queries read cached (runs, metrics x 32) float32 matrices in place, with a coarse PAA-8
pass first (see ``CS.stage1``). PostgreSQL with pgvector: C = ``max(200, 2 sqrt(n))``
(every candidate costs database work there, see ``CS.INDEX_CANDIDATE_SQRT``); an HNSW search
per metric in the database for its ``2 C`` nearest (``SET LOCAL hnsw.ef_search``,
``hnsw.iterative_scan = relaxed_order`` so filters do not starve the scan), the union
rescored in SQL on every metric and cut to ``2 C`` runs, whose PAA rows are loaded and
scored as above (see ``PV.pgvector_pool``; measured at 10k runs: recall@10 0.96 end to end,
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
import time
from typing import Any, Mapping, Sequence

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload

from registry.core.errors import InputError
from registry.db.models import Run, Series
from registry.store.reader import read_series_chunks
from registry.analysis.similarity import concepts as CO
from registry.analysis.similarity import features as F
from registry.analysis.similarity import index as X
from registry.analysis.similarity import query as QP
from registry.analysis.similarity import dtw as DT
from registry.analysis.similarity import candidates as CS
from registry.analysis.similarity import pgvector as PV
from registry.analysis.similarity import assembly as AS
from registry.analysis.similarity.result import SimilarResult, summarize
from registry.analysis.similarity.anywhere import search_anywhere


# --- query preparation ------------------------------------------------------------------


# --- the search ---------------------------------------------------------------------------


def find_similar(registry: Any, run_ref: str, metrics: Sequence[str] | str | None = None, k: int = 10,
                 prefix: float | int | None = None, window: tuple[float, float] | None = None,
                 align: str = "fraction", normalize: str = "z", where: str | None = None, same_task: bool = False,
                 same_project: bool = False, same_algorithm: bool = False, outcome: str | Sequence[str] | None = None,
                 weights: Mapping[str, float] | None = None, candidates: int | None = None, exact: bool = False,
                 total_steps: int | None = None, rerank: int | None = None, anywhere: bool = False,
                 _brute: bool = False) -> SimilarResult:
    """The k historical runs whose curves look most like this run's (see the package docstring).

    ``candidates``: stage-1 pool size (default ``max(CS.MIN_CANDIDATES, CS.CANDIDATE_SHARE * n)``);
    ``rerank``: how many of them, in stage-1c order, get the exact DTW (default
    ``max(CS.RERANK_MIN, CS.RERANK_PER_K * k, CS.RERANK_SHARE * C)``; every candidate when the collection has at most
    ``CS.MIN_CANDIDATES`` eligible runs and ``candidates`` is not given). ``anywhere``: match the
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
        available, qparams = QP.load_query(session, run)
        names = QP.resolve_metrics(available, metrics, run.algorithm)
        w = dict(weights or {})
        equivalents = CO.load_equivalents(session)
        qms = []
        for name in names:
            a = available[name]
            data = read_series_chunks(session, a["series_id"]).per_step()
            steps, values = data.steps, data.values
            qms.append(QP.QueryMetric(name, float(w.get(name, 1.0)), X.semantics_key(a["semantics"]), a["semantics"],
                                   steps, values * a["sign"] if a["sign"] != 1.0 else values,
                                   equivalents.get(name, ())))
        if any(qm.weight <= 0 for qm in qms):
            raise InputError("metric weights must be positive")
        finite = [qm.steps[np.isfinite(qm.values)] for qm in qms]
        finite = [f for f in finite if len(f)]
        if not finite:
            raise InputError("the query run has no finite points in the chosen metrics")
        first, last = min(float(f[0]) for f in finite), max(float(f[-1]) for f in finite)
        total = float(total_steps) if total_steps else QP.params_total(qparams)
        portion = QP.make_portion(prefix, window, align, run.status, first, last, total)
        if anywhere and portion.whole:
            raise InputError("anywhere needs a window or a prefix of the query run: a whole run only matches "
                             "whole runs")
        conds = QP.filters(run, where, same_task, same_project, same_algorithm, outcome)
        warnings: list[str] = []
        excluded: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        t_prep = time.perf_counter()

        use_pg = (X.has_vector_columns(session) and portion.kind == "fraction" and portion.start == 0.0
                  and normalize == "z" and not exact and not _brute and not anywhere)
        if use_pg:
            corpus, engine, n_filtered, index_s = PV.pgvector_pool(session, run, qms, portion, conds,
                                                        total if run.status == "running" else None, first,
                                                        candidates, excluded, counts)
            run_mask = corpus.run_ids != run.id
        else:
            index_s = 0.0
            corpus = X.load_corpus(session)
            engine = AS.numpy_engine_label(session, portion, normalize, exact or _brute, anywhere, corpus)
            run_mask = np.ones(len(corpus.run_ids), dtype=bool)
            if conds:
                ids = np.array(sorted(session.scalars(select(Run.id).where(*conds))), dtype=str)
                run_mask = np.isin(corpus.run_ids, ids)
            qi = corpus.run_index(run.id)
            if qi >= 0:
                run_mask[qi] = False
        t_load = time.perf_counter()
        el = CS.eligible(corpus, qms, QP.WHOLE if anywhere else portion, run_mask, excluded, counts,
                       report_semantics=not use_pg)
        if use_pg:  # runs of other semantics on every metric, counted in SQL: the pool never holds them
            n_sem = counts.pop("semantics_pool")
            counts["semantics"] += n_sem
            counts["no_comparable_metric"] += n_sem
        scales = CS.metric_scales(corpus, qms, normalize)
        wvec = np.array([qm.weight for qm in qms])
        qtotal = total if run.status == "running" else None
        qgrid, qpaa = QP.query_features(qms, portion, qtotal, first, normalize, scales)
        n_el = len(el.runs)

        # stage 1 (Euclidean on PAA vectors over all eligible runs), 1b (DTW on PAA-32), 1c (DTW on 64 points)
        t1 = time.perf_counter()
        n_half = n_paa = 0
        buf = None
        if anywhere:
            el, ranked, computed, buf, C = search_anywhere(session, corpus, el, qms, qgrid, qpaa, portion, first,
                                                           normalize, scales, wvec, k, exact, excluded, counts)
            cand = np.arange(len(el.runs))
        elif exact or _brute:
            cand = np.arange(n_el)
            C = n_el
        else:
            n_all = n_filtered if use_pg else n_el
            C_scan = CS.candidate_count(n_all, candidates)  # what a full scan keeps: sizes the pools
            C = min(n_el, CS.index_candidate_count(n_all, candidates) if use_pg else C_scan)
            cand, cand_paa = CS.stage1(corpus, el, qms, qpaa, portion, normalize, scales, wvec, C)
            R2 = min(len(cand), CS.rerank_count(n_all, C_scan, k, candidates, rerank))
            R1 = max(R2, CS.PAA_POOL_MIN, CS.PAA_POOL_PER_K * k, math.ceil(CS.PAA_POOL_SHARE * C_scan))
            if len(cand) > R1:
                paa_buf = CS.gather(cand_paa, CS.weight_mask(el, cand, wvec))
                cand = cand[DT.elastic_order(qpaa, paa_buf, el.avail[cand], el.wp[cand], R1, CS.PAA_WINDOW)]
                n_paa = C
            if len(cand) > 1:  # (also when R2 covers them all: the order seeds the early abandoning)
                grids = CS.candidate_grids(session, corpus, el, cand, qms, portion, normalize, scales, wvec)
                best = DT.elastic_order(CS.halved(qgrid), CS.gather(*grids, halve=True), el.avail[cand], el.wp[cand],
                                      R2, CS.HALF_WINDOW)
                n_half = len(cand)
                cand = cand[best]
        # stage 2 (exact banded DTW on the 128-point grids)
        t2 = time.perf_counter()
        if n_half:  # the rerank's rows are among stage 1c's, already read
            buf = CS.gather(*grids, sel=best)
        elif buf is None:
            buf = CS.gather(*CS.candidate_grids(session, corpus, el, cand, qms, portion, normalize, scales, wvec))
        xs = buf[1:]
        if not anywhere:
            ranked, computed = DT.rerank_coverage_first(qgrid, xs, el.avail[cand], el.wp[cand], k, brute=_brute,
                                                      buf=buf, lb=n_half == 0)
        t3 = time.perf_counter()

        neighbours = AS.build_neighbours(session, corpus, el, cand, ranked, qms, qgrid, xs, portion, qparams, wvec)
        if anywhere:
            AS.place_matches(neighbours, corpus, el)
        t4 = time.perf_counter()
        if use_pg:
            ref_corpus = X.load_corpus(session)
            ref_mask = CS.filter_mask(session, ref_corpus, conds)
        else:
            ref_corpus, ref_mask = corpus, run_mask.copy()
            if qi >= 0:
                ref_mask[qi] = True  # the same reference for every query of this collection and filters
        closeness, prediction = AS.trust(session, ref_corpus, ref_mask, qms, portion, normalize, scales, wvec,
                                       neighbours, anywhere, conds, run.id)
        t5 = time.perf_counter()
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
               "compared_steps": {qm.name: [int(round(b)) for b in QP.query_span(qm, portion, qtotal, first)[2:]]
                                  for qm in qms},
               "planned_total_steps": total, "params": qparams},
        metrics=names, weights={qm.name: qm.weight for qm in qms}, k=k, engine=engine,
        embedding_version=F.EMBEDDING_VERSION, neighbours=neighbours, excluded=excluded, excluded_counts=counts,
        warnings=warnings, closeness=closeness.to_dict(), prediction=prediction.to_dict(),
        stats={"eligible_runs": int(n_el), "candidates": int(C), "paa_dtw_computed": int(n_paa),
               "half_dtw_computed": int(n_half),
               "reranked": int(len(cand)), "dtw_computed": int(computed), "corpus_rows": int(corpus.n)},
        # the pgvector index search is the candidate stage's first step, though it runs before
        # the eligibility pass: it counts as search, not as loading
        timings={"prepare_ms": (t_prep - t0) * 1e3, "load_ms": (t_load - t_prep - index_s) * 1e3,
                 "index_ms": index_s * 1e3, "candidates_ms": (t2 - t1 + index_s) * 1e3, "rerank_ms": (t3 - t2) * 1e3,
                 "search_ms": (t3 - t1 + index_s) * 1e3, "results_ms": (t4 - t3) * 1e3,
                 "reference_ms": (t5 - t4) * 1e3,
                 "total_ms": (time.perf_counter() - t0) * 1e3},
    )
    AS.name_exclusions(registry, result)
    summarize(result, objective)
    if anywhere and neighbours:
        starts = sorted(n.match_start for n in neighbours if n.match_start is not None)
        if starts:
            where = f" (in this run: {portion.start:.0%})" if portion.kind == "fraction" else ""
            result.summary += (f" The pattern sat at a median {starts[len(starts) // 2]:.0%} of their "
                               f"training{where}.")
    return result


def brute_force(registry: Any, run_ref: str, **kwargs: Any) -> SimilarResult:
    """Ground truth: banded DTW_D against every eligible run, no pruning (tests, benchmark)."""
    return find_similar(registry, run_ref, _brute=True, **kwargs)


# --- pgvector candidate pool --------------------------------------------------------------


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
