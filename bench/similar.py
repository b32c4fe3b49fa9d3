"""Similar-run search benchmark: fidelity and latency at 1k/10k/100k runs, retrieval quality.

Part 1, per corpus size N (``--sizes``, default 1000,10000; 100000 takes about 15 minutes
on 2 cores): a corpus of N synthetic PPO runs from ``registry.demo.synthetic.generate_run``
(every PPO kind: healthy and 12 anomaly families; 200-20,000 logged points, step strides
1/128/2048; CartPole-, Pendulum- and Acrobot-like tasks) x 3 metrics (episode return, KL,
entropy). Corpus runs are written in bulk: a ``runs`` row and the ``curve_embeddings``
rows computed from the full-resolution curves, with the same semantics a registration
binds; their raw series are *not* stored (the engine never reads them). The query runs
(``--queries``, default 60, held out: other seeds) are registered through the real API,
series and all. For each query it runs ``find_similar`` (k=10) and ``brute_force``
(banded DTW_D against every run, dtaidistance C, grids in memory) and prints recall@10
of the engine against brute force, the engine's end-to-end latency p50/p95 (the wall time
of the ``find_similar`` call), the speedup of the search itself (candidate stages + exact
rerank, ``timings.search_ms``; on pgvector that includes the index searches and the pool's
scoring inside the database) over the brute-force search (one batched C DTW call over
every eligible run, from the same cached arrays), and the end-to-end wall-time ratio.
The speedup target applies to the search speedup; both are printed. Then the latency of
anywhere searches (the first 10 queries' 30-50% window matched wherever it lies in each run)
and, up to 1,000 runs, their recall@10 against the DTW at every start of every run.

Part 2, quality on labeled runs: the 4 real SB3 PPO runs (shared/data/sb3_ppo) plus
labeled synthetic PPO runs of four families (healthy, entropy_collapse and kl_blowup as
"collapse", stagnant), registered with SB3 keys so they bind like the real ones.
precision@5: share of each run's 5 nearest neighbours with its family. Outcome prediction:
from each synthetic run's first 25%, the majority verdict of its 10 nearest (matched on
their first 25%) against the run's final verdict, next to always guessing the most common
verdict.

Backends (``--backend``): ``sqlite`` (default; a temporary file per size), ``postgresql``
(plain PostgreSQL: NumPy candidate stage) and ``pgvector`` (PostgreSQL with pgvector: the
candidate stage is an HNSW search inside the database; the run fails unless
``SimilarResult.engine`` says ``pgvector hnsw``). For the PostgreSQL backends ``--db`` is an
admin URL (default: the CI server's test roles: rlreg plain, rlreg_vec with pgvector); each size gets its
own throwaway database (``rlreg_bench_<pid>_<N>``), dropped afterwards. On pgvector the HNSW
indexes are dropped for the bulk load and rebuilt after it (the build time is printed). The
table ends with the growth of the p50 latency from each size to the next (and the
corresponding factor in N), which shows whether latency grows sub-linearly.

Targets (exit status 1 when one is missed): at 10,000 runs recall@10 >= 0.95, p50 < 50 ms
(SQLite), search speedup >= 100x; precision@5 above the share of the largest family; the
prefix prediction beats the majority-verdict baseline.

    .venv/bin/python bench/similar.py [--sizes 1000,10000,100000] [--queries 60] [--procs 2]
        [--backend sqlite|postgresql|pgvector] [--db postgresql+psycopg://user:pw@host:port/db]
"""
from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry, open_registry  # noqa: E402
from registry.dictionary.binding import AliasIndex  # noqa: E402
from registry.db.models import Run  # noqa: E402
from registry.analysis.similarity import brute_force, find_similar, refresh_embeddings  # noqa: E402
from registry.analysis.similarity import features as F  # noqa: E402
from registry.analysis.similarity import index as X  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SB3_RUNS = REPO.parent / "shared" / "data" / "sb3_ppo"
METRICS = ("episode_return_mean", "kl_old_mean", "entropy")
PPO_KINDS = ("healthy", "kl_blowup", "entropy_collapse", "reward_std_zero", "value_loss_flat", "grad_norm_spikes",
             "reward_zero", "nan", "clip_high", "clip_low", "policy_loss_growing", "advantage_mean_drift", "stagnant")
FAMILIES = {"healthy": "healthy", "entropy_collapse": "collapse", "kl_blowup": "collapse", "stagnant": "stagnant"}
SB3_LABELS = {"cartpole_healthy_s0": "healthy", "cartpole_lr_too_high_5e-2": "collapse",
              "cartpole_tiny_lr_1e-6": "stagnant", "pendulum_default_s0": "stagnant"}
ANYWHERE_WINDOW = (0.3, 0.5)
ANYWHERE_QUERIES = 10
ANYWHERE_EXACT_MAX = 1000  # the DTW at every start of every run: ~2 s a query at 1k runs
PG_DEFAULT = {"postgresql": "postgresql+psycopg://rlreg:rlreg@127.0.0.1:5432/rlreg_test",
              "pgvector": "postgresql+psycopg://rlreg_vec:rlreg@127.0.0.1:5432/rlreg_vec"}
SB3_KEYS = {"episode_return_mean": ("rollout/ep_rew_mean", 1.0), "kl_old_mean": ("train/approx_kl", 1.0),
            "entropy": ("train/entropy_loss", -1.0)}


def _fast_synthetic() -> None:
    """generate_run re-reads the dictionary YAML on every call (~0.5 s); cache it for the corpus."""
    import registry.analysis.diagnosis.fixtures as fx

    if not hasattr(fx.default_metric_infos, "cache_info"):
        fx.default_metric_infos = functools.lru_cache()(fx.default_metric_infos)


def _generate(kind: str, seed: int):
    from registry.demo.synthetic import generate_run

    return generate_run(kind, seed=seed, algorithm="ppo")


# --- corpus -------------------------------------------------------------------------------

def _corpus_chunk(args: tuple[int, int, int]) -> list[tuple[dict, list[dict]]]:
    start, stop, base_seed = args
    _fast_synthetic()
    out = []
    for i in range(start, stop):
        kind = PPO_KINDS[i % len(PPO_KINDS)]
        r = _generate(kind, base_seed + i)
        run_id = uuid.UUID(int=(base_seed << 64) + i).hex
        run = {"id": run_id, "name": f"{kind}-{i}", "project": "bench", "algorithm": "PPO", "framework": "custom",
               "task": r.task, "status": "finished", "verdict": r.outcome.verdict}
        rows = []
        for m in METRICS:
            c = r.curves[m]
            feats = F.compute_features(c.steps, c.values)
            if feats is not None:
                rows.append((m, feats))
        out.append((run, rows))
    return out


def _hnsw_indexes(reg: Registry) -> list[tuple[str, str]]:
    from sqlalchemy import text

    with reg.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'curve_embeddings' "
            "AND indexdef ILIKE '%USING hnsw%' AND schemaname = current_schema()"))]


def build_corpus(reg: Registry, n: int, procs: int, base_seed: int = 1) -> tuple[float, float]:
    """Bulk-load n runs; returns seconds taken for the load and for (re)building HNSW indexes."""
    from sqlalchemy import text

    t0 = time.perf_counter()
    vectors = X.has_vector_columns(reg.engine)
    hnsw = _hnsw_indexes(reg) if vectors else []
    if hnsw:  # bulk load without the graph indexes, build them once afterwards
        with reg.engine.begin() as conn:
            for name, _ in hnsw:
                conn.execute(text(f'DROP INDEX "{name}"'))
    with reg.read() as s:
        index = AliasIndex.load(s)
    semantics = {m: index.bind(m).semantics for m in METRICS}
    chunk = 500
    tasks = [(a, min(a + chunk, n), base_seed) for a in range(0, n, chunk)]
    ctx = mp.get_context("fork")
    with ctx.Pool(procs) as pool:
        for part in pool.imap_unordered(_corpus_chunk, tasks):
            with reg.engine.begin() as conn:
                conn.execute(Run.__table__.insert(), [run for run, _ in part])
                rows = [X.feature_row(run["id"], m, feats, semantics=semantics[m], series_id=None, complete=True)
                        for run, feats_list in part for m, feats in feats_list]
                X.insert_rows(conn, rows, vectors)
    t1 = time.perf_counter()
    if hnsw:
        with reg.engine.begin() as conn:
            conn.execute(text("SET LOCAL maintenance_work_mem = '512MB'"))
            conn.execute(text(f"SET LOCAL max_parallel_maintenance_workers = {max(procs - 1, 0)}"))
            for _, ddl in hnsw:
                conn.execute(text(ddl))
        with reg.engine.begin() as conn:
            conn.execute(text("ANALYZE curve_embeddings"))
            conn.execute(text("ANALYZE runs"))
    return t1 - t0, time.perf_counter() - t1


def register_queries(reg: Registry, n: int, seed0: int) -> list[str]:
    _fast_synthetic()
    ids = []
    for i in range(n):
        kind = PPO_KINDS[i % len(PPO_KINDS)]
        r = _generate(kind, seed0 + i)
        res = reg.register_arrays(f"query-{kind}-{i}", {m: (r.curves[m].steps, r.curves[m].values) for m in METRICS},
                                  project="bench", algorithm="PPO", framework="custom", task=r.task, params=r.params,
                                  outcome={"verdict": r.outcome.verdict})
        with reg.transaction() as s:
            refresh_embeddings(s, res.run_id)
        ids.append(res.run_id)
    return ids


def times(ratio: float) -> str:
    """A speedup for the table: whole numbers from 10x, one decimal below (0.4x, not 0x)."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def bench_size(n: int, args: argparse.Namespace, url: str) -> dict:
    reg = open_registry(url)
    if args.backend == "pgvector" and X.pgvector_status(reg.engine) != "ready":
        raise SystemExit(f"--backend pgvector: {url} has no pgvector columns ({X.pgvector_status(reg.engine)})")
    load_s, index_s = build_corpus(reg, n, args.procs)
    queries = register_queries(reg, args.queries, seed0=10_000_000)
    t = time.perf_counter()
    find_similar(reg, queries[0], k=10)  # fills the per-process cache
    cache_s = time.perf_counter() - t
    engines: Counter = Counter()
    recalls, totals, searches, brute_searches, brute_totals, dtws, cands = [], [], [], [], [], [], []
    reranked: list[int] = []
    stages: dict[str, list[float]] = {}
    for q in queries:
        t = time.perf_counter()
        res = find_similar(reg, q, k=10)
        wall = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        truth = brute_force(reg, q, k=10)
        brute_wall = (time.perf_counter() - t) * 1e3
        engines[res.engine.split(" (")[0] if res.engine.startswith("pgvector") else res.engine] += 1
        got = {x.run_id for x in res.neighbours}
        want = {x.run_id for x in truth.neighbours}
        recalls.append(len(got & want) / max(1, len(want)))
        totals.append(wall)  # end-to-end: find_similar's wall time, as a caller sees it
        searches.append(res.timings["search_ms"])
        brute_searches.append(truth.timings["search_ms"])
        brute_totals.append(brute_wall)
        dtws.append(res.stats["dtw_computed"])
        cands.append(res.stats["candidates"])
        reranked.append(res.stats.get("reranked", res.stats["candidates"]))
        for key, v in res.timings.items():
            stages.setdefault(key, []).append(v)
    engine = res.engine
    anywhere = bench_anywhere(reg, queries[:ANYWHERE_QUERIES], exact=n <= ANYWHERE_EXACT_MAX)
    reg.close()
    return {**anywhere,
        "n": n, "load_s": load_s, "index_s": index_s, "cache_s": cache_s, "engines": dict(engines),
        "recall": float(np.mean(recalls)),
        "min_recall": float(np.min(recalls)), "p50": pct(totals, 50), "p95": pct(totals, 95),
        "search_p50": pct(searches, 50), "brute_p50": pct(brute_searches, 50),
        "speedup": statistics.median(brute_searches) / statistics.median(searches),
        "speedup_total": statistics.median(brute_totals) / statistics.median(totals),
        "brute_total_p50": pct(brute_totals, 50), "stage_ms": {key: statistics.median(v) for key, v in stages.items()},
        "candidates": int(np.median(cands)), "reranked": int(np.median(reranked)), "dtw": int(np.median(dtws)),
        "engine": engine,
    }


def bench_anywhere(reg: Registry, queries: list[str], exact: bool) -> dict:
    """Latency of anywhere searches (the 30-50% window matched wherever it lies), and on small
    collections their recall@10 against the DTW at every start of every run."""
    walls, recalls = [], []
    for q in queries:
        t = time.perf_counter()
        res = find_similar(reg, q, k=10, window=ANYWHERE_WINDOW, anywhere=True)
        walls.append((time.perf_counter() - t) * 1e3)
        if exact:
            truth = find_similar(reg, q, k=10, window=ANYWHERE_WINDOW, anywhere=True, exact=True)
            want = {x.run_id for x in truth.neighbours}
            recalls.append(len({x.run_id for x in res.neighbours} & want) / max(1, len(want)))
    return {"any_p50": pct(walls, 50), "any_p95": pct(walls, 95),
            "any_recall": float(np.mean(recalls)) if recalls else None}


# --- quality ------------------------------------------------------------------------------

def bench_quality(url: str, per_family_kind: int) -> dict:
    _fast_synthetic()
    reg = open_registry(url)
    labels: dict[str, str] = {}
    verdicts: dict[str, str] = {}
    synthetic: list[str] = []
    if SB3_RUNS.is_dir():
        for d in sorted(SB3_RUNS.iterdir()):
            if d.name in SB3_LABELS:
                res = reg.register(d, name=d.name, project="sb3", algorithm="PPO", framework="stable-baselines3")
                with reg.transaction() as s:
                    refresh_embeddings(s, res.run_id)
                labels[res.run_id] = SB3_LABELS[d.name]
    for kind in FAMILIES:
        for seed in range(per_family_kind):
            r = _generate(kind, 500_000 + seed)
            data = {key: (r.curves[m].steps, sign * r.curves[m].values) for m, (key, sign) in SB3_KEYS.items()}
            res = reg.register_arrays(f"{kind}-{seed}", data, project="labeled", algorithm="PPO",
                                      framework="stable-baselines3", task=r.task, params=r.params,
                                      outcome={"verdict": r.outcome.verdict})
            with reg.transaction() as s:
                refresh_embeddings(s, res.run_id)
            labels[res.run_id] = FAMILIES[kind]
            verdicts[res.run_id] = r.outcome.verdict
            synthetic.append(res.run_id)
    precisions, real_hits = [], {}
    for rid, label in labels.items():
        res = find_similar(reg, rid, k=5)
        share = [labels.get(nb.run_id) == label for nb in res.neighbours]
        precisions.append(float(np.mean(share)) if share else 0.0)
        if rid not in verdicts:
            real_hits[res.query["name"]] = (label, [labels.get(nb.run_id) for nb in res.neighbours][:1])
    biggest = max(Counter(labels.values()).values()) / len(labels)
    most_common = Counter(verdicts.values()).most_common(1)[0][0]
    hits, base = [], []
    for rid in synthetic:
        res = find_similar(reg, rid, k=10, prefix=0.25, where="project=labeled")
        hits.append(res.predicted_verdict == verdicts[rid])
        base.append(most_common == verdicts[rid])
    reg.close()
    return {"precision5": float(np.mean(precisions)), "chance": biggest, "runs": len(labels),
            "prefix_acc": float(np.mean(hits)), "baseline_acc": float(np.mean(base)), "baseline_verdict": most_common,
            "verdicts": dict(Counter(verdicts.values())), "real_nearest": real_hits}


class _Database:
    """A URL for one corpus size: a temporary SQLite file, or a throwaway PostgreSQL database."""

    def __init__(self, args: argparse.Namespace, tmp: str, name: str) -> None:
        self.admin = None
        if args.backend == "sqlite":
            self.url = f"sqlite:///{Path(tmp) / f'{name}.db'}"
            return
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        admin_url = make_url(args.db or PG_DEFAULT[args.backend])
        self.db = f"rlreg_bench_{os.getpid()}_{name}"
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.db}"'))
        self.url = admin_url.set(database=self.db).render_as_string(hide_password=False)

    def drop(self) -> None:
        if self.admin is None:
            return
        from sqlalchemy import text

        X._vector_support.clear()
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)'))
        self.admin.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="corpus sizes, comma-separated (e.g. 1000,10000,100000)")
    ap.add_argument("--queries", type=int, default=60, help="held-out query runs per size (>= 50)")
    ap.add_argument("--procs", type=int, default=2, help="processes generating the corpus")
    ap.add_argument("--per-kind", type=int, default=30, help="labeled synthetic runs per kind (quality part)")
    ap.add_argument("--preload-grids", type=int, default=None,
                    help=f"override index.GRID_PRELOAD_ROWS (default {X.GRID_PRELOAD_ROWS})")
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "pgvector"), default="sqlite",
                    help="where the corpus lives (PostgreSQL: a throwaway database per size on --db's server)")
    ap.add_argument("--db", default=None, help="admin URL of the PostgreSQL server (default: "
                    f"{PG_DEFAULT['postgresql']} / {PG_DEFAULT['pgvector']})")
    ap.add_argument("--skip-quality", action="store_true")
    args = ap.parse_args()
    if args.preload_grids is not None:
        X.GRID_PRELOAD_ROWS = args.preload_grids
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    failures = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            db = _Database(args, tmp, f"corpus{n}")
            try:
                r = bench_size(n, args, db.url)
            finally:
                db.drop()
            rows.append(r)
            print(f"N={n:>7,} [{args.backend}]: load {r['load_s']:.0f}s, HNSW build {r['index_s']:.0f}s, "
                  f"cache fill {r['cache_s'] * 1e3:.0f} ms, "
                  f"recall@10 {r['recall']:.3f} (min {r['min_recall']:.1f}), p50 {r['p50']:.1f} ms, "
                  f"p95 {r['p95']:.1f} ms, search p50 {r['search_p50']:.2f} ms vs brute {r['brute_p50']:.0f} ms "
                  f"= {times(r['speedup'])} search (end-to-end wall {r['p50']:.1f} vs {r['brute_total_p50']:.0f} ms "
                  f"= {times(r['speedup_total'])}), C={r['candidates']}, exact pool {r['reranked']}, "
                  f"DTWs {r['dtw']}, engine {r['engine']}", flush=True)
            print("          stage p50 ms: " + ", ".join(f"{k} {v:.2f}" for k, v in r["stage_ms"].items()), flush=True)
            recall = "" if r["any_recall"] is None else f", recall@10 {r['any_recall']:.3f} against every start"
            print(f"          anywhere (window {ANYWHERE_WINDOW[0]:.0%}-{ANYWHERE_WINDOW[1]:.0%}, {ANYWHERE_QUERIES} "
                  f"queries): p50 {r['any_p50']:.0f} ms, p95 {r['any_p95']:.0f} ms{recall}", flush=True)
            if args.backend == "pgvector" and set(r["engines"]) != {"pgvector hnsw"}:
                failures.append(f"N={n}: not every query used the pgvector index: {r['engines']}")
            if n == 10_000:
                if r["recall"] < 0.95:
                    failures.append(f"recall@10 {r['recall']:.3f} < 0.95 at 10k")
                if r["p50"] >= 50 and args.backend == "sqlite":
                    failures.append(f"p50 {r['p50']:.1f} ms >= 50 ms at 10k")
                if r["speedup"] < 100:
                    failures.append(f"speedup {times(r['speedup'])} < 100x at 10k")
        print()
        print("| runs | recall@10 | p50 ms (wall) | p95 ms | search p50 ms | brute-force search ms | "
              "speedup (search; target) | brute-force wall ms | speedup (end-to-end wall) | candidates | "
              "exact pool | DTWs |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['n']:,} | {r['recall']:.3f} | {r['p50']:.1f} | {r['p95']:.1f} | {r['search_p50']:.2f} | "
                  f"{r['brute_p50']:.0f} | {times(r['speedup'])} | {r['brute_total_p50']:.0f} | "
                  f"{times(r['speedup_total'])} | {r['candidates']} | {r['reranked']} | {r['dtw']} |")
        if len(rows) > 1:
            print()
            print(f"latency growth [{args.backend}, engine {rows[-1]['engine'].split(' (')[0]}]:")
            print("| from -> to | N factor | p50 wall growth | p95 growth | search p50 growth | brute-force growth |")
            print("|---|---|---|---|---|---|")
            for a, b in zip(rows, rows[1:]):
                print(f"| {a['n']:,} -> {b['n']:,} | {b['n'] / a['n']:.0f}x | {b['p50'] / a['p50']:.2f}x | "
                      f"{b['p95'] / a['p95']:.2f}x | {b['search_p50'] / a['search_p50']:.2f}x | "
                      f"{b['brute_p50'] / a['brute_p50']:.2f}x |")
        if not args.skip_quality:
            q = bench_quality(f"sqlite:///{Path(tmp) / 'quality.db'}", args.per_kind)
            print()
            print(f"quality on {q['runs']} labeled runs: precision@5 {q['precision5']:.3f} "
                  f"(largest family share {q['chance']:.3f})")
            print(f"outcome from a 25% prefix: neighbours' majority verdict {q['prefix_acc']:.3f} vs always "
                  f"'{q['baseline_verdict']}' {q['baseline_acc']:.3f} (verdicts {q['verdicts']})")
            for name, (label, nearest) in q["real_nearest"].items():
                print(f"  real run {name} ({label}): nearest neighbour's family {nearest}")
            if q["precision5"] <= q["chance"]:
                failures.append("precision@5 not above the largest family's share")
            if q["prefix_acc"] <= q["baseline_acc"]:
                failures.append("prefix outcome prediction does not beat the majority baseline")
    for f in failures:
        print("MISSED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
