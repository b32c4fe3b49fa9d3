"""Result assembly: neighbours with their distances, coverage, closeness and the excluded groups."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from dtaidistance import dtw
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from registry.db.dialect import engine_of, is_postgresql
from registry.db.models import Run
from registry.core.semantics import semantic_differences
from registry.analysis.similarity import closeness as CL
from registry.analysis.similarity import outcome as OC
from registry.analysis.similarity import features as F
from registry.analysis.similarity import index as X
from registry.analysis.similarity import ranking as RK
from registry.analysis.similarity.result import Neighbour, SimilarResult
from registry.analysis.similarity import query as QP
from registry.analysis.similarity import dtw as DT
from registry.analysis.similarity import candidates as CS
from registry.store.reader import run_to_dict


def reference_distances(session: Session, corpus: X.Corpus, run_mask: np.ndarray, qms: list[QP.QueryMetric],
                         portion: QP.Portion, normalize: str, scales: list[float],
                         wvec: np.ndarray) -> np.ndarray | None:
    """Nearest-neighbour distances of a sample of the collection's runs compared on every query
    metric, computed like the query's (``closeness``), cached on the corpus."""
    el = CS.eligible(corpus, qms, portion, run_mask, [], {}, report_semantics=False)
    full = np.flatnonzero(el.avail.all(axis=1))
    if len(full) < 2:
        return None
    sub = CS.Eligible(el.runs[full], el.rows[full], el.s[full], el.e[full], el.avail[full], el.wp[full])
    key = (tuple((qm.name, qm.alternatives, qm.sem_key, qm.weight) for qm in qms), portion.kind, portion.start,
           portion.end, normalize, hash(sub.runs.tobytes()), len(sub.runs))

    def compute() -> np.ndarray:
        n, M = len(sub.runs), len(qms)
        if portion.whole and normalize == "z":
            x_all, _ = CS.whole_stack(corpus, [(qm.name, qm.alternatives) for qm in qms], "paa")
            x = x_all[sub.runs, :F.PAA * M].reshape(n, F.PAA, M).astype(np.float64)
        else:
            x = np.zeros((n, F.PAA, M))
            for j in range(M):
                x[:, :, j] = CS.row_features(corpus, sub.rows[:, j], sub.s[:, j], sub.e[:, j], portion.whole,
                                           normalize, scales[j], "paa")
        x *= np.sqrt(wvec)[None, None, :]

        def grids_of(pos: np.ndarray) -> np.ndarray:
            return CS.gather(*CS.candidate_grids(session, corpus, sub, pos, qms, portion, normalize, scales, wvec))[1:]

        flat = x.reshape(n, -1)
        return CL.nearest_distances(flat, CL.sample_positions(flat), grids_of,
                                    math.sqrt(F.GRID * float(wvec.sum())), DT.DTW_WINDOW)

    return CL.cached_reference(corpus, key, compute)


def trust(session: Session, corpus: X.Corpus, run_mask: np.ndarray, qms: list[QP.QueryMetric], portion: QP.Portion,
           normalize: str, scales: list[float], wvec: np.ndarray, neighbours: list[Neighbour], anywhere: bool,
           conds: list[Any], query_id: str) -> tuple[CL.Closeness, OC.OutcomePrediction]:
    """Whether the nearest run is close for this collection, and the distance-weighted outcome."""
    counts = dict(session.execute(select(Run.verdict, func.count()).where(*conds, Run.id != query_id)
                                  .group_by(Run.verdict)).all())
    if anywhere:
        # window-to-window distances have no whole-collection reference: no judgement, no prediction
        closeness = CL.Closeness("unknown", neighbours[0].distance if neighbours else None, 0, None, None, None,
                                 "Closeness is not judged for anywhere searches.")
        return closeness, OC.predict([], [], [], None, counts)
    reference = reference_distances(session, corpus, run_mask, qms, portion, normalize, scales, wvec) \
        if neighbours else None
    first = neighbours[0] if neighbours else None
    closeness = CL.judge(first.distance if first else None, first.metrics_compared if first else 0, len(qms),
                         reference)
    bandwidth = closeness.median if closeness.median is not None else (
        float(np.median(reference)) if reference is not None and len(reference) >= CL.MIN_REFERENCE else None)
    prediction = OC.predict([n.verdict for n in neighbours], [n.distance for n in neighbours],
                            [n.metrics_compared / len(qms) for n in neighbours], bandwidth, counts)
    return closeness, prediction


def place_matches(neighbours: list[Neighbour], corpus: X.Corpus, el: CS.Eligible) -> None:
    """Where each neighbour's matched window starts, as a fraction of its training (first compared metric)."""
    starts = {}
    for i, r in enumerate(el.runs):
        j = int(np.argmax(el.avail[i]))
        starts[str(corpus.run_ids[r])] = float(el.s[i, j])
    for n in neighbours:
        n.match_start = starts.get(n.run_id)


def numpy_engine_label(session: Session, portion: QP.Portion, normalize: str, exact: bool, anywhere: bool = False,
                        corpus: X.Corpus | None = None) -> str:
    if anywhere:
        scan = "128-point grids" if corpus is not None and corpus.grids is not None else \
            "PAA-32 vectors (grids not kept in memory)"
        return (f"numpy subsequence (every start scored on the {scan}, "
                f"{'DTW at every start' if exact else 'DTW at the best starts'})")
    if not is_postgresql(session):
        return "numpy"
    status = X.pgvector_status(engine_of(session))
    if status != "ready":
        return {"missing": "numpy (pgvector not installed)",
                X.NEEDS_SUPERUSER: "numpy (pgvector not created in this database: needs a superuser)",
                }.get(status, "numpy (pgvector available but not enabled: run `rlreg reindex`)")
    why = ("exact mode" if exact else "raw-scale queries" if normalize == "raw" else
           "step-aligned queries" if portion.kind == "step" else "window queries")
    return f"numpy ({why} are not served by the pgvector index)"


def build_neighbours(session: Session, corpus: X.Corpus, el: CS.Eligible, cand: np.ndarray, ranked: list[tuple[float, int]],
                qms: list[QP.QueryMetric], qgrid: np.ndarray, xs: np.ndarray, portion: QP.Portion,
                qparams: dict[str, Any], wvec: np.ndarray) -> list[Neighbour]:
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
                stack, window=DT.DTW_WINDOW, block=((0, 1), (1, len(stack))), compact=True,
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
            if corpus.metric[row] != qm.name:
                warnings.append(f"{qm.name}: compared with its {corpus.metric[row]} (the same per-episode value, "
                                "one point per episode on one side, a mean over a window of episodes on the other)")
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
                        {f: qm.semantics.get(f) for f in X.STRICT_FIELDS}, QP.key_dict(corpus.sem_key[pos])))
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
            metrics_compared=int(el.avail[e].sum()), compared_steps=compared, peak_step=peak, warnings=warnings,
            metrics_total=len(qms), coverage=RK.coverage_label(int(el.avail[e].sum()), len(qms))))
    for i, n in enumerate(out, 1):
        n.rank = i
    return out


def name_exclusions(registry: Any, result: SimilarResult) -> None:
    ids = sorted({rid for g in result.excluded for rid in g["run_ids"]})
    if not ids:
        return
    with registry.read() as session:
        names = dict(session.execute(select(Run.id, Run.name).where(Run.id.in_(ids))).all())
    for g in result.excluded:
        g["runs"] = [{"id": rid, "name": names.get(rid)} for rid in g.pop("run_ids")]
