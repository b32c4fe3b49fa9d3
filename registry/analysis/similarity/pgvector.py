"""The PostgreSQL candidate stage: nearest rows from pgvector's HNSW index, and group sizes."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from sqlalchemy import ARRAY, String, any_, bindparam, case, func, or_, select, text
from sqlalchemy.orm import Session

from registry.db.models import CurveEmbedding, Run
from registry.core.semantics import semantic_differences
from registry.analysis.similarity import features as F
from registry.analysis.similarity import index as X
from registry.analysis.similarity import query as QP
from registry.analysis.similarity import candidates as CS


HNSW_PER_METRIC = 2  # nearest rows per metric from the index, as a multiple of C


#: Above this many rows the query's own semantics group is sized by the planner's estimate
#: of the number of runs rather than counted (see ``group_sizes``): counting would be the one
#: per-query cost on the team server that grows linearly with the collection.
GROUP_COUNT_CAP = 10_000


def pgvector_pool(session: Session, run: Run, qms: list[QP.QueryMetric], portion: QP.Portion, conds: list[Any],
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
    n_filtered = semantic_groups(session, run, qms, conds, excluded, counts)
    t_index = time.perf_counter()
    C = CS.index_candidate_count(n_filtered, candidates)
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
        raw, noise = QP.query_grid(qm, portion, total, origin)
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
        runs = CE.run_id.in_(nearest_by_vectors(col, qms, vectors, ids, 2 * C))
    # PAA vectors and level statistics only: the grids of the few runs left after the PAA-32
    # DTW stage are fetched for those alone. One statement: the pool's ids go to the server
    # once, as one array, and the scoring and the fetch share its plan.
    corpus = X.fetch_rows(session, runs & CE.metric.in_([qm.name for qm in qms]), with_grids=False)
    engine = (f"pgvector hnsw ({col}, ef_search={ef}, iterative_scan=relaxed_order, "
              f"{len(union)} runs from the index, {len(corpus.run_ids)} compared)")
    return corpus, engine, n_filtered, time.perf_counter() - t_index


def nearest_by_vectors(col: str, qms: list[QP.QueryMetric], vectors: list[str], run_ids: Any, keep: int) -> Any:
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


def semantic_groups(session: Session, run: Run, qms: list[QP.QueryMetric], conds: list[Any],
                     excluded: list[dict[str, Any]], counts: dict[str, int]) -> int:
    """Count, per compared metric, the other runs (passing the filters) with embeddings of
    each semantics; record those of other semantics in ``excluded``, the runs comparable on
    none of the metrics in ``counts`` (they never reach the index's pool), and return the
    largest number of runs having one of the metrics (the collection size the pool is sized by).

    Without filters the counts come from the (version, metric, semantics_key) index alone
    (``group_sizes``), the query run's own rows subtracted afterwards; an example run is
    looked up per excluded group."""
    CE = CurveEmbedding
    names = [qm.name for qm in qms]
    where = [CE.version == F.EMBEDDING_VERSION, CE.metric.in_(names)]
    if conds:  # the join reads the rows anyway
        stmt = select(CE.metric, CE.semantics_key, func.count()).where(*where) \
            .join(Run, Run.id == CE.run_id).where(*conds, CE.run_id != run.id)
        groups = {(m, key): int(n) for m, key, n in session.execute(stmt.group_by(CE.metric, CE.semantics_key))}
    else:
        groups = group_sizes(session, qms)
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
                                                                 QP.key_dict(key))})
    counts["semantics_pool"] = 0
    if any(e["reason"] == "semantics" for e in excluded):
        match = or_(*[(CE.metric == qm.name) & (CE.semantics_key == qm.sem_key) for qm in qms])
        none_match = select(CE.run_id).where(*where, CE.run_id != run.id).group_by(CE.run_id) \
            .having(func.max(case((match, 1), else_=0)) == 0)
        if conds:
            none_match = none_match.join(Run, Run.id == CE.run_id).where(*conds)
        counts["semantics_pool"] = int(session.scalar(select(func.count()).select_from(none_match.subquery())) or 0)
    return max(per_metric.values(), default=0)


def group_sizes(session: Session, qms: list[QP.QueryMetric]) -> dict[tuple[str, str], int]:
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
