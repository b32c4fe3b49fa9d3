"""Similar-run search on SQLite and PostgreSQL: exactness, prefixes, semantics, versions, real runs."""
from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
from sqlalchemy import func, select, text, update

from registry import Registry, open_registry
from registry.core.errors import InputError
from registry.db.models import CurveEmbedding
from registry.analysis.similarity import (
    EMBEDDING_VERSION, brute_force, find_similar, rebuild_embeddings, refresh_embeddings, resolve_metrics,
)
from registry.analysis.similarity import index as X
from registry.analysis.similarity import search as S
from registry.analysis.similarity import pgvector as PG
from registry.analysis.similarity.candidates import PAA_POOL_MIN

from conftest import reset_postgres

METRICS = ("episode_return_mean", "kl_old_mean", "entropy")
SB3_KEYS = {"episode_return_mean": ("rollout/ep_rew_mean", 1.0), "kl_old_mean": ("train/approx_kl", 1.0),
            "entropy": ("train/entropy_loss", -1.0)}


@functools.lru_cache(maxsize=None)
def synthetic(kind: str, seed: int, n_steps: int, anomaly_at: float | None = None, stride: int | None = None):
    import registry.analysis.diagnosis.fixtures as fx
    from registry.demo.synthetic import generate_run

    cached = functools.lru_cache()(fx.default_metric_infos)  # generate_run re-reads the YAML otherwise
    original, fx.default_metric_infos = fx.default_metric_infos, cached
    try:
        return generate_run(kind, seed=seed, algorithm="ppo", n_steps=n_steps, task="synthetic-cartpole",
                            anomaly_at=anomaly_at, step_stride=stride)
    finally:
        fx.default_metric_infos = original


def register(reg: Registry, name: str, run, sb3: bool = False, **fields) -> str:
    if sb3:
        data = {key: (run.curves[m].steps, sign * run.curves[m].values) for m, (key, sign) in SB3_KEYS.items()}
        fields.setdefault("framework", "stable-baselines3")
    else:
        data = {m: (run.curves[m].steps, run.curves[m].values) for m in METRICS}
        fields.setdefault("framework", "custom")
    res = reg.register_arrays(name, data, algorithm="ppo", task=run.task, params=run.params,
                              outcome={"verdict": run.outcome.verdict}, **fields)
    with reg.transaction() as s:
        refresh_embeddings(s, res.run_id)
    return res.run_id


def family_corpus(reg: Registry, per_kind: int = 6, sb3: bool = False) -> dict[str, str]:
    """Runs of four families with varied lengths; collapse onsets early (2-15%, as with a too-high lr)."""
    rng = np.random.default_rng(7)
    kinds = {}
    for kind in ("healthy", "entropy_collapse", "kl_blowup", "stagnant"):
        for seed in range(per_kind):
            at = round(float(rng.uniform(0.02, 0.15)), 3) if kind in ("entropy_collapse", "kl_blowup") else None
            run = synthetic(kind, seed, int(rng.integers(48, 600)), at)
            kinds[register(reg, f"{kind}-{seed}", run, sb3=sb3)] = kind
    return kinds


def test_two_stage_and_exact_modes_equal_brute_force(registry: Registry):
    kinds = family_corpus(registry)
    queries = list(kinds)[::5]
    for q in queries:
        for kwargs in ({}, {"prefix": 0.25}, {"prefix": 0.3}, {"window": (0.2, 0.7)}, {"normalize": "raw"},
                       {"metrics": "reward,entropy"}):
            truth = brute_force(registry, q, k=5, **kwargs)
            for mode in ({"candidates": 8}, {"exact": True}, {}):
                got = find_similar(registry, q, k=5, **kwargs, **mode)
                if "candidates" in mode:
                    assert got.stats["candidates"] == 8
                    continue  # a small pool is approximate by design; the others must be exact
                assert [n.run_id for n in got] == [n.run_id for n in truth], (q, kwargs, mode)
                assert [n.distance for n in got] == pytest.approx([n.distance for n in truth], rel=1e-9)
    res = find_similar(registry, queries[0], k=5)
    assert res.engine.startswith("numpy")
    assert res.stats["dtw_computed"] <= res.stats["candidates"]
    assert res.neighbours[0].distance <= res.neighbours[-1].distance
    assert set(res.neighbours[0].metric_distances) == set(METRICS)
    json.dumps(res.to_dict())


def test_neighbours_share_family_and_summary_reports_outcomes(registry: Registry):
    kinds = family_corpus(registry)
    hits = []
    for q, kind in kinds.items():
        res = find_similar(registry, q, k=3)
        group = {"entropy_collapse": "collapse", "kl_blowup": "collapse"}
        hits += [group.get(kinds[n.run_id], kinds[n.run_id]) == group.get(kind, kind) for n in res]
    assert np.mean(hits) >= 0.7
    res = find_similar(registry, next(q for q, k in kinds.items() if k == "stagnant"), k=5)
    verdict, count = next(iter(res.verdict_counts.items()))
    assert res.summary.startswith(f"{count} of the 5 nearest runs")
    assert res.predicted_verdict == verdict
    first = res.neighbours[0]
    assert first.params and first.verdict and "final" not in first.param_diff


def test_prefix_query_on_running_run_finds_same_family(registry: Registry):
    kinds = family_corpus(registry)
    full = synthetic("stagnant", 99, 400)
    planned = int(full.curves["entropy"].steps[-1])
    handle = registry.create_run("live-stagnant", algorithm="ppo", framework="custom", task=full.task,
                                 params={"total_timesteps": planned})
    cut = 120  # 30% of the planned run so far
    for m in METRICS:
        handle.log_series(m, full.curves[m].steps[:cut], full.curves[m].values[:cut])
    with registry.transaction() as s:
        refresh_embeddings(s, handle.id)
    res = find_similar(registry, handle.id, k=5)
    assert res.query["portion_kind"] == "prefix" and res.query["align"] == "fraction"
    assert res.query["end"] == pytest.approx(0.3, abs=0.01)  # placed by total_timesteps
    assert sum(kinds[n.run_id] == "stagnant" for n in res) >= 4
    assert "went on to" in res.summary or "ended" in res.summary or "failed" in res.summary
    # the neighbours were compared over their own first 30%, and report how they ended
    n = res.neighbours[0]
    first, last = n.compared_steps["entropy"]
    with registry.read() as s:
        row = s.scalar(select(CurveEmbedding).where(CurveEmbedding.run_id == n.run_id,
                                                    CurveEmbedding.metric == "entropy"))
    assert (last - row.first_step) / (row.last_step - row.first_step) == pytest.approx(0.3, abs=0.02)
    assert n.verdict is not None
    # aligned by absolute step instead: the historical runs' first N steps
    by_step = find_similar(registry, handle.id, k=5, align="step")
    assert by_step.query["align"] == "step"
    assert by_step.query["end"] == full.curves["entropy"].steps[cut - 1]
    with pytest.raises(InputError, match="only reaches step"):
        find_similar(registry, handle.id, window=(0.5, 0.9))


def test_step_alignment_excludes_runs_that_end_earlier(registry: Registry):
    long = synthetic("healthy", 1, 500, stride=128)
    q = register(registry, "long", long)
    step = int(long.curves["entropy"].steps[300])
    ends = {}
    for seed, n, stride in ((2, 60, 128), (3, 500, 128), (4, 400, 2048), (6, 200, 1)):
        run = synthetic("healthy", seed, n, stride=stride)
        ends[register(registry, f"h{seed}", run)] = int(run.curves["entropy"].steps[-1])
    short = {rid for rid, end in ends.items() if end < step}
    assert len(short) == 2
    res = find_similar(registry, q, prefix=step, align="step")
    assert {n.run_id for n in res} == set(ends) - short
    assert all(n.compared_steps["entropy"][1] == pytest.approx(step, rel=0.01) for n in res)
    group = next(g for g in res.excluded if g["reason"] == "too_short")
    assert {r["id"] for r in group["runs"]} == short and res.excluded_counts["too_short"] == len(short)


def test_semantic_incompatibility_excludes_with_reason(registry: Registry):
    check_semantic_exclusions(registry)


def check_semantic_exclusions(registry: Registry) -> None:
    run = synthetic("healthy", 0, 200)
    k3 = register(registry, "sb3-k3", run, sb3=True)
    k1 = register(registry, "sb3-k1", synthetic("healthy", 1, 200), sb3=True,
                  semantics={"train/approx_kl": {"kl_estimator": "k1"}})
    other = register(registry, "sb3-k3-b", synthetic("stagnant", 2, 200), sb3=True)
    only_kl = find_similar(registry, k3, metrics=["kl"])
    assert [n.run_id for n in only_kl] == [other]
    group = next(g for g in only_kl.excluded if g["reason"] == "semantics")
    assert group["metric"] == "kl_old_mean" and group["runs"][0]["id"] == k1
    assert "KL estimator: k3 vs k1" in group["differences"]
    assert only_kl.excluded_counts["semantics"] == 1
    # with other metrics to compare, the run stays, its KL is not compared, and it says why
    multi = find_similar(registry, k3)
    n = next(n for n in multi if n.run_id == k1)
    assert n.metric_distances["kl_old_mean"] is None and n.metrics_compared == 2
    assert any("KL estimator: k3 vs k1" in w for w in n.warnings)


def test_versions_are_never_mixed_and_rebuild_recomputes(registry: Registry):
    kinds = family_corpus(registry, per_kind=2)
    q, old = list(kinds)[:2]
    with registry.transaction() as s:
        s.execute(update(CurveEmbedding).where(CurveEmbedding.run_id == old).values(version="paa16-v0"))
    res = find_similar(registry, q, k=10)
    assert old not in {n.run_id for n in res}
    assert any("another version" in w for w in res.warnings)
    report = rebuild_embeddings(registry)
    assert report["old_version_rows_dropped"] == 3 and report["runs"] == len(kinds)
    with registry.read() as s:
        versions = set(s.scalars(select(CurveEmbedding.version).distinct()))
    assert versions == {EMBEDDING_VERSION}
    res = find_similar(registry, q, k=10)
    assert old in {n.run_id for n in res} and not res.warnings


def test_refresh_rule_and_cache_reuse(registry: Registry):
    run = synthetic("healthy", 5, 400)
    handle = registry.create_run("streaming", algorithm="ppo", framework="custom")
    steps, values = run.curves["entropy"].steps, run.curves["entropy"].values

    def rows():
        with registry.read() as s:
            return s.execute(select(CurveEmbedding.id, CurveEmbedding.point_count, CurveEmbedding.complete)
                             .where(CurveEmbedding.run_id == handle.id)).one()

    # The store refreshes embeddings after every write; a manual refresh then has nothing to do.
    handle.log_series("entropy", steps[:200], values[:200])
    first = rows()
    assert first.point_count == 200 and not first.complete
    with registry.transaction() as s:
        assert refresh_embeddings(s, handle.id) == 0
    handle.log_series("entropy", steps[200:209], values[200:209])  # +4.5%: kept
    assert rows() == first
    handle.log_series("entropy", steps[209:211], values[209:211])  # +5.5%: recomputed
    second = rows()
    assert second.point_count == 211 and second.id > first.id
    handle.log_series("entropy", steps[211:215], values[211:215])  # +2%: kept while running
    assert rows() == second
    handle.finish()  # finished with unseen points: final recompute
    assert rows().complete and rows().point_count == 215
    with registry.transaction() as s:
        assert refresh_embeddings(s, handle.id) == 0
    # the per-process cache is reused until the table changes
    register(registry, "other", synthetic("stagnant", 5, 300))
    loads = X.CACHE.loads
    find_similar(registry, handle.id, metrics="entropy")
    find_similar(registry, handle.id, metrics="entropy")
    assert X.CACHE.loads <= loads + 1
    third = register(registry, "third", synthetic("stagnant", 6, 300))
    res = find_similar(registry, handle.id, metrics="entropy")
    assert third in {n.run_id for n in res}  # new rows merged in without a full reload
    assert X.CACHE.loads <= loads + 1


def test_cache_state_follows_every_change_of_the_embeddings(registry: Registry):
    """(max id, row count) per version, the cache's signal to reload, stays exact through
    registration, a streaming replacement, a run deleted (rows removed by the foreign-key
    cascade), a rebuild that drops another version, and (SQLite, where the count is kept by
    triggers) a downgrade and upgrade that recount the rows already there."""
    from registry.db.migrate import downgrade, upgrade

    def counted(version: str = EMBEDDING_VERSION) -> tuple[int, int]:
        with registry.read() as s:
            max_id, n = s.execute(select(func.max(CurveEmbedding.id), func.count())
                                  .where(CurveEmbedding.version == version)).one()
        return int(max_id or 0), int(n)

    def state(version: str = EMBEDDING_VERSION) -> tuple[int, int]:
        with registry.read() as s:
            return X.embedding_state(s, version)

    assert state() == (0, 0)
    ids = [register(registry, f"r{i}", synthetic("healthy", i, 300)) for i in range(3)]
    assert state() == counted() and counted()[1] == 3 * len(METRICS)
    run = synthetic("healthy", 9, 400)
    handle = registry.create_run("streaming", algorithm="ppo", framework="custom")
    handle.log_series("entropy", run.curves["entropy"].steps[:200], run.curves["entropy"].values[:200])
    before = state()
    handle.log_series("entropy", run.curves["entropy"].steps[200:], run.curves["entropy"].values[200:])
    assert state() == counted() and state()[0] > before[0] and state()[1] == before[1]  # replaced
    find_similar(registry, ids[0], metrics="entropy")  # cache filled
    registry.delete_run(ids[1])
    assert state() == counted() and state()[1] == before[1] - len(METRICS)
    res = find_similar(registry, ids[0], metrics="entropy")
    assert ids[1] not in {n.run_id for n in res} and handle.id in {n.run_id for n in res}
    with registry.transaction() as s:
        s.execute(update(CurveEmbedding).where(CurveEmbedding.run_id == ids[2]).values(version="old-method"))
    assert state() == counted() and state("old-method") == counted("old-method") != (0, 0)
    rebuild_embeddings(registry)
    assert state() == counted() and state("old-method") == counted("old-method") == (0, 0)
    if registry.engine.dialect.name == "sqlite":
        rows = counted()[1]
        # A writer that predates the counting triggers (revision 0004): the triggers are dropped by
        # hand rather than by downgrading, because the run is written through today's models (later
        # revisions add columns); going down to 0004 and up again then rebuilds the counts.
        with registry.engine.begin() as conn:
            for trigger in ("insert", "delete", "version"):
                conn.exec_driver_sql(f"DROP TRIGGER curve_embeddings_count_{trigger}")
        register(registry, "written-without-triggers", synthetic("stagnant", 1, 300))
        downgrade(registry.engine, "0004")
        upgrade(registry.engine)
        assert state() == counted() and counted()[1] == rows + len(METRICS)


def test_metric_names_resolve_by_quantity(registry: Registry):
    run_id = register(registry, "sb3", synthetic("healthy", 0, 100), sb3=True)
    with registry.read() as s:
        from registry.analysis.similarity.query import load_query

        available, _ = load_query(s, registry.resolve_run(s, run_id))
    assert resolve_metrics(available, None) == list(METRICS)
    assert resolve_metrics(available, "reward,kl,entropy") == list(METRICS)
    assert resolve_metrics(available, ["train/approx_kl", "return"]) == ["kl_old_mean", "episode_return_mean"]
    with pytest.raises(InputError, match="no metric 'grad_norm'"):
        resolve_metrics(available, ["grad_norm"])
    with pytest.raises(InputError, match="prefix"):
        find_similar(registry, run_id, prefix=1.5)


def test_sb3_real_runs_find_their_kind(registry: Registry, sb3_runs):
    kinds = family_corpus(registry, per_kind=6, sb3=True)
    names = {}
    for d in sorted(sb3_runs.iterdir()):
        res = registry.register(d, name=d.name, algorithm="ppo", framework="stable-baselines3")
        with registry.transaction() as s:
            refresh_embeddings(s, res.run_id)
        names[res.run_id] = d.name
    res = find_similar(registry, "cartpole_lr_too_high_5e-2", k=3)
    assert res.metrics == list(METRICS)
    assert kinds[res.neighbours[0].run_id] in ("entropy_collapse", "kl_blowup")
    tiny = find_similar(registry, "cartpole_tiny_lr_1e-6", k=3)
    assert kinds.get(tiny.neighbours[0].run_id, "real") == "stagnant"
    healthy = find_similar(registry, "cartpole_healthy_s0", k=1, where="name ~ healthy")
    assert kinds[healthy.neighbours[0].run_id] == "healthy"


NUMPY_LABELS = {"missing": "numpy (pgvector not installed)",
                X.NEEDS_SUPERUSER: "numpy (pgvector not created in this database: needs a superuser)"}


def test_engine_label_on_postgres_without_pgvector(pg_url: str):
    reg = open_registry(pg_url)
    try:
        status = X.pgvector_status(reg.engine)
        if status not in NUMPY_LABELS:
            pytest.skip(f"the plain test server's role can use pgvector ({status})")
        a = register(reg, "a", synthetic("healthy", 0, 100))
        register(reg, "b", synthetic("healthy", 1, 100))
        res = find_similar(reg, a)
        assert res.engine == NUMPY_LABELS[status]
    finally:
        reg.close()


def test_application_role_on_a_pgvector_server_migrates_then_uses_it_once_a_superuser_enables_it():
    """pgvector is not a trusted extension: a role that is not a superuser cannot create it, and
    migrating must not fail for that; once a superuser creates it, ``reindex`` moves the search in."""
    from click.testing import CliRunner
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from registry.cli.main import cli

    url = os.environ.get("RLREG_TEST_PGVECTOR_URL")
    if not url:
        pytest.skip("no pgvector server (set RLREG_TEST_PGVECTOR_URL)")
    tag = os.urandom(4).hex()
    role, db = f"rlreg_app_{tag}", f"rlreg_app_{tag}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'app' NOSUPERUSER"))
        conn.execute(text(f"CREATE DATABASE {db} OWNER {role}"))
    app_url = make_url(url).set(username=role, password="app", database=db).render_as_string(hide_password=False)
    def reindex() -> str:
        out = CliRunner().invoke(cli, ["--db", app_url, "reindex"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    try:
        with open_registry(app_url) as reg:
            assert X.pgvector_status(reg.engine) == X.NEEDS_SUPERUSER
            a = register(reg, "a", synthetic("healthy", 0, 100))
            register(reg, "b", synthetic("healthy", 1, 100))
            register(reg, "c", synthetic("stagnant", 0, 100))
            assert find_similar(reg, a).engine == NUMPY_LABELS[X.NEEDS_SUPERUSER]
        before = reindex()
        assert "candidate stage: in-process NumPy (pgvector needs superuser)" in before
        assert "a superuser must run CREATE EXTENSION vector" in before
        superuser_in_db = create_engine(make_url(url).set(database=db), isolation_level="AUTOCOMMIT")
        with superuser_in_db.connect() as conn:
            conn.execute(text("CREATE EXTENSION vector"))
        superuser_in_db.dispose()
        with open_registry(app_url) as reg:
            assert X.pgvector_status(reg.engine) == "available"
        after = reindex()
        assert "embeddings rebuilt for 3 runs" in after
        assert "candidate stage: inside PostgreSQL (pgvector HNSW)" in after
        with open_registry(app_url) as reg:
            assert X.pgvector_status(reg.engine) == "ready"
            res = find_similar(reg, a, k=2)
            assert res.engine.startswith("pgvector hnsw")
            assert [n.run_id for n in res] == [n.run_id for n in brute_force(reg, a, k=2)]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()


@pytest.fixture
def pgvector_registry():
    url = os.environ.get("RLREG_TEST_PGVECTOR_URL")
    if not url:
        if os.environ.get("CI"):
            raise RuntimeError("CI needs RLREG_TEST_PGVECTOR_URL: a PostgreSQL server with pgvector")
        pytest.skip("no pgvector server (set RLREG_TEST_PGVECTOR_URL)")
    reset_postgres(url)
    reg = open_registry(url)
    yield reg
    reg.close()


def test_pgvector_candidate_stage_in_the_database(pgvector_registry: Registry):
    reg = pgvector_registry
    assert X.pgvector_status(reg.engine) == "ready"
    kinds = family_corpus(reg, per_kind=4)
    with reg.read() as s:
        assert s.scalar(select(func.count()).select_from(CurveEmbedding).where(
            CurveEmbedding.version == EMBEDDING_VERSION)) == 3 * len(kinds)
    q = list(kinds)[3]
    res = find_similar(reg, q, k=5)
    assert res.engine.startswith("pgvector hnsw (v100")
    # the index search in the database is the candidate stage's first step: timed as search
    t = res.timings
    assert 0 < t["index_ms"] <= t["candidates_ms"] <= t["search_ms"]
    truth = brute_force(reg, q, k=5)
    assert truth.timings["index_ms"] == 0
    assert [n.run_id for n in res] == [n.run_id for n in truth]
    pre = find_similar(reg, q, k=5, prefix=0.25)
    assert "(v025" in pre.engine
    assert [n.run_id for n in pre] == [n.run_id for n in brute_force(reg, q, k=5, prefix=0.25)]
    filtered = find_similar(reg, q, k=5, where="name ~ stagnant")
    assert filtered.neighbours and all(kinds[n.run_id] == "stagnant" for n in filtered)
    stepwise = find_similar(reg, q, k=5, align="step")
    assert stepwise.engine == "numpy (step-aligned queries are not served by the pgvector index)"


def test_cascade_equals_brute_force_when_its_pools_cover_the_corpus(registry: Registry):
    kinds = family_corpus(registry)
    n = len(kinds) - 1  # eligible runs: all but the query
    for q in list(kinds)[::6]:
        for kwargs in ({}, {"prefix": 0.25}, {"window": (0.2, 0.7)}, {"normalize": "raw"},
                       {"metrics": "reward,entropy"}, {"weights": {"entropy": 2.0}}):
            truth = brute_force(registry, q, k=5, **kwargs)
            # stage 1 keeps every run, stage 1b (DTW on 64 points) orders them, the exact DTW sees them all
            got = find_similar(registry, q, k=5, candidates=n, rerank=n, **kwargs)
            assert got.stats["candidates"] == n and got.stats["half_dtw_computed"] == n
            assert got.stats["reranked"] == n
            assert [x.run_id for x in got] == [x.run_id for x in truth], (q, kwargs)
            assert [x.distance for x in got] == pytest.approx([x.distance for x in truth], rel=1e-9)
            # a smaller exact pool is approximate, but exact over its final candidates
            small = find_similar(registry, q, k=5, candidates=n, rerank=8, **kwargs)
            assert small.stats["reranked"] == 8 and small.stats["dtw_computed"] <= 8
            every = {x.run_id: x.distance for x in brute_force(registry, q, k=n, **kwargs)}
            assert [x.distance for x in small] == pytest.approx([every[x.run_id] for x in small], rel=1e-9)
            assert [x.distance for x in small] == sorted(x.distance for x in small)
    with pytest.raises(InputError, match="rerank"):
        find_similar(registry, list(kinds)[0], rerank=0)


def test_paa_dtw_stage_orders_a_pool_larger_than_its_keep(registry: Registry):
    """Stage 1b (DTW on the PAA-32 vectors) runs once stage 1 keeps more runs than its pool
    (at least PAA_POOL_MIN): the neighbours are still exact over the runs it passes on, for
    whole runs, cut portions, raw scale and weights."""
    kinds = family_corpus(registry, per_kind=11)
    n = len(kinds) - 1
    assert n > PAA_POOL_MIN
    for q in list(kinds)[::11]:
        for kwargs in ({}, {"prefix": 0.25}, {"normalize": "raw"}, {"weights": {"entropy": 2.0}}):
            got = find_similar(registry, q, k=5, candidates=n, rerank=8, **kwargs)
            assert got.stats["paa_dtw_computed"] == n and got.stats["half_dtw_computed"] == PAA_POOL_MIN
            every = {x.run_id: x.distance for x in brute_force(registry, q, k=n, **kwargs)}
            assert [x.distance for x in got] == pytest.approx([every[x.run_id] for x in got], rel=1e-9)
            assert [x.distance for x in got] == sorted(x.distance for x in got)


def test_running_run_whose_metrics_start_at_different_steps_is_matched_on_the_fraction_of_its_plan(
        registry: Registry):
    # SB3 logs rollout/* from the first rollout and train/* from the second: the KL and the
    # entropy start one rollout later than the return
    kinds = family_corpus(registry)
    full = synthetic("stagnant", 98, 400)
    planned = int(full.curves["entropy"].steps[-1])
    handle = registry.create_run("live-late-start", algorithm="ppo", framework="custom", task=full.task,
                                 params={"total_timesteps": planned})
    cut = 60  # 15% of the plan: a one-rollout offset is a large share of what has been logged
    for m in METRICS:
        start = 0 if m == "episode_return_mean" else 8
        handle.log_series(m, full.curves[m].steps[start:cut], full.curves[m].values[start:cut])
    with registry.transaction() as s:
        refresh_embeddings(s, handle.id)
    res = find_similar(registry, handle.id, k=5)
    assert res.query["align"] == "fraction" and res.query["portion_kind"] == "prefix"
    assert res.query["end"] == pytest.approx((full.curves["entropy"].steps[cut - 1] - full.curves["entropy"].steps[0])
                                             / (planned - full.curves["entropy"].steps[0]), abs=1e-6)
    assert not any("logged so far" in w for w in res.warnings)
    assert sum(kinds[n.run_id] == "stagnant" for n in res) >= 3


def test_pgvector_semantic_exclusions_are_counted_and_named(pgvector_registry: Registry):
    check_semantic_exclusions(pgvector_registry)


def test_pgvector_pool_keeps_the_runs_nearest_on_every_metric(pgvector_registry: Registry):
    """With 2 candidates, each metric's index list holds 4 runs and the lists overlap only in
    part: the 4 runs loaded are those of the union nearest by the distance summed over all
    three metrics (the whole-run PAA vectors), not the first of each list."""
    reg = pgvector_registry
    kinds = family_corpus(reg, per_kind=4)
    q = list(kinds)[3]
    with reg.read() as s:
        corpus = X.fetch_rows(s, True, with_grids=False)
    vec = {(r, m): corpus.paa[i, -1].astype(np.float64)
           for i, (r, m) in enumerate(zip(corpus.run_ids[corpus.run_idx], corpus.metric))}

    def d2(r: str, m: str) -> float:
        return float(np.sum((vec[r, m] - vec[q, m]) ** 2))

    others = sorted(set(kinds) - {q})
    union = set().union(*(sorted(others, key=lambda r: d2(r, m))[:4] for m in METRICS))
    assert len(union) > 4
    expected = sorted(union, key=lambda r: sum(d2(r, m) for m in METRICS))[:4]
    res = find_similar(reg, q, k=2, candidates=2)
    assert f"{len(union)} runs from the index, 4 compared" in res.engine
    assert res.stats["eligible_runs"] == 4 and {n.run_id for n in res} <= set(expected)


def test_pgvector_pool_size_past_the_count_cap_is_the_planners_estimate(pgvector_registry: Registry,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """The query's own semantics group is counted only up to GROUP_COUNT_CAP rows; past it the
    pool is sized by the planner's estimate of the number of runs, or by a count when that
    estimate is missing or below the cap. Here the cap is 3: the first query finds a stale
    estimate (0 runs) and counts, the second uses the estimate of the last ANALYZE although
    two runs came after it (so the pool is sized for the runs ANALYZE saw)."""
    reg = pgvector_registry

    def analyze() -> None:
        with reg.engine.begin() as c:
            c.execute(text("ANALYZE runs"))

    analyze()  # of the empty table: an estimate of 0 runs
    kinds = family_corpus(reg, per_kind=4)
    q = list(kinds)[3]
    monkeypatch.setattr(PG, "GROUP_COUNT_CAP", 3)
    counted = find_similar(reg, q, k=5)
    assert counted.stats["candidates"] == len(kinds) - 1
    assert [n.run_id for n in counted] == [n.run_id for n in brute_force(reg, q, k=5)]
    analyze()
    for i in range(2):
        register(reg, f"late-{i}", synthetic("healthy", 100 + i, 200))
    estimated = find_similar(reg, q, k=5)
    assert estimated.stats["eligible_runs"] == len(kinds) + 1
    assert estimated.stats["candidates"] == len(kinds) - 1  # the estimate (len(kinds)), less the query run
    monkeypatch.setattr(PG, "GROUP_COUNT_CAP", 10_000)
    assert find_similar(reg, q, k=5).stats["candidates"] == len(kinds) + 1


def test_features_of_values_near_the_float64_limit_are_those_of_the_same_curve_at_unit_scale():
    from registry.analysis.similarity import features as F

    rng = np.random.default_rng(3)
    steps = np.arange(0, 5000, 7)
    curve = np.tanh(steps / 1500.0) + 0.05 * rng.standard_normal(len(steps))
    scale = 2.0 ** 1020  # ~1.1e307: sums and squares of these overflow float64
    with np.errstate(all="raise"):
        big = F.compute_features(steps, curve * scale)
    unit = F.compute_features(steps, curve)
    assert np.array_equal(big.zgrid, unit.zgrid) and np.array_equal(big.paa, unit.paa)
    assert np.isfinite(big.stats).all()
    np.testing.assert_array_equal(big.stats[:, [0, 1, 2, 3, 6, 7]], unit.stats[:, [0, 1, 2, 3, 6, 7]] * scale)
    assert not big.flat
