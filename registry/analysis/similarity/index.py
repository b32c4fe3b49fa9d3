"""Storing, refreshing and loading the per-series embeddings (table ``curve_embeddings``).

Refresh rule (``refresh_embeddings``, called by the store after every write to a run): a
series' row is recomputed when it has none, when the series grew by at least 5% since the
row was computed (``GROWTH``), when the run has ended (status no longer ``running``) and
the row is not from the final data, or when its binding (series or semantics) changed.
Otherwise the call costs two small indexed SELECTs and writes nothing. Over a run's life
that is about log(n)/log(1.05) recomputations, each decoding the series once: amortised
O(points). Rows are replaced (delete + insert, new ``id``), never updated in place, except
the ``complete`` flag.

Per-process cache (``load_corpus``): the candidate stage on SQLite (and on PostgreSQL
without pgvector) scans every row's PAA vectors in NumPy. They are loaded once per engine
and version, and the cache is reused while ``embedding_state`` (max id and row count of the
version, the count kept by triggers on SQLite) is unchanged; new rows (higher ids) are
merged in incrementally, and a count mismatch (deletions) reloads. The rerank grids are
loaded with the rest when the version has at most ``GRID_PRELOAD_ROWS`` rows (about 1 KB
each), else fetched per query for the candidates only.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from sqlalchemy import (
    BigInteger, Engine, MetaData, String, column, delete, exists, func, or_, select, table,
    text, true, update,
)
from sqlalchemy.orm import Session

from registry.db.dialect import engine_of, id_chunks, is_postgresql, is_sqlite
from registry.db.models import CurveEmbedding, MetricDefinition, Run, Series, utcnow
from registry.store.reader import read_series_chunks
from registry.analysis.similarity import features as F

GROWTH = 1.05
GRID_PRELOAD_ROWS = 60_000
VECTOR_COLUMNS = ("v010", "v025", "v050", "v100")  # one per features.LEVELS entry
#: Semantic fields that must agree for two series to be compared; others only warn.
STRICT_FIELDS = ("quantity", "averaging", "kl_estimator", "normalization_axis")
WARN_FIELDS = ("logging_point",)


def semantics_key(semantics: dict[str, Any] | None) -> str:
    s = semantics or {}
    return "|".join(f"{f}={s.get(f) or '-'}" for f in STRICT_FIELDS)


# --- pgvector ---------------------------------------------------------------------------

_vector_support: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


def has_vector_columns(bind: Session | Engine) -> bool:
    """Whether this PostgreSQL database has the pgvector columns (checked once per engine)."""
    engine = engine_of(bind)
    if not is_postgresql(engine):
        return False
    known = _vector_support.get(engine)
    if known is None:
        with engine.connect() as conn:
            known = bool(conn.execute(text(
                "SELECT 1 FROM information_schema.columns WHERE table_name = 'curve_embeddings' "
                "AND column_name = 'v100' AND table_schema = current_schema()")).scalar())
        _vector_support[engine] = known
    return known


# pgvector is not a trusted extension: only a superuser can create it in a database, so an
# application role can use it only once it is created there (or if the role is a superuser)
VECTOR_USABLE_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')
    OR EXISTS (SELECT 1 FROM pg_available_extension_versions v
               WHERE v.name = 'vector'
                 AND ((SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
                      OR (v.trusted AND has_database_privilege(current_database(), 'CREATE'))))
"""

NEEDS_SUPERUSER = "needs superuser"
NOT_ENABLED_HINT = ("pgvector is installed on the server but not created in this database, and this role may not "
                    "create it: a superuser must run CREATE EXTENSION vector in it, then `rlreg reindex`")


def pgvector_status(engine: Engine) -> str:
    """The candidate stage's footing on this database.

    'ready' (vector columns present), 'available' (this role can add them: ``rebuild_embeddings``),
    'needs superuser' (pgvector installed on the server, not created in this database, and this
    role may not create it), 'missing' (not installed) or 'not postgresql'.
    """
    if not is_postgresql(engine):
        return "not postgresql"
    if has_vector_columns(engine):
        return "ready"
    with engine.connect() as conn:
        if conn.execute(text(VECTOR_USABLE_SQL)).scalar():
            return "available"
        installed = conn.execute(text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")).scalar()
    return NEEDS_SUPERUSER if installed else "missing"


def ensure_vector_columns(engine: Engine) -> bool:
    """Add the pgvector columns and HNSW indexes when the server gained pgvector after migration."""
    if pgvector_status(engine) != "available":
        return has_vector_columns(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        for col in VECTOR_COLUMNS:
            conn.execute(text(f"ALTER TABLE curve_embeddings ADD COLUMN IF NOT EXISTS {col} vector({F.PAA})"))
            conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_curve_embeddings_{col}_hnsw ON curve_embeddings "
                              f"USING hnsw ({col} vector_l2_ops) WITH (m = 16, ef_construction = 64)"))
    _vector_support.pop(engine, None)
    return has_vector_columns(engine)


def vector_literal(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(v, dtype=np.float64)) + "]"


def _vector_table():
    """``curve_embeddings`` with the (unmapped) vector columns, for inserts on pgvector servers."""
    from pgvector.sqlalchemy import Vector
    from sqlalchemy import Column

    table = CurveEmbedding.__table__.to_metadata(MetaData())
    for col in VECTOR_COLUMNS:
        table.append_column(Column(col, Vector(F.PAA)))
    return table


_VECTOR_TABLE = None


def insert_rows(session_or_conn: Any, rows: Sequence[dict[str, Any]], with_vectors: bool) -> None:
    """Bulk insert embedding rows (dicts of column values plus ``_paa`` (levels, 32) when vectors)."""
    global _VECTOR_TABLE
    if not rows:
        return
    if with_vectors:
        if _VECTOR_TABLE is None:
            _VECTOR_TABLE = _vector_table()
        out = []
        for r in rows:
            r = dict(r)
            p = r.pop("_paa")
            for i, col in enumerate(VECTOR_COLUMNS):
                r[col] = np.asarray(p[i], dtype=np.float32)
            out.append(r)
        session_or_conn.execute(_VECTOR_TABLE.insert(), out)
    else:
        session_or_conn.execute(CurveEmbedding.__table__.insert(), [{k: v for k, v in r.items() if k != "_paa"}
                                                                     for r in rows])


def feature_row(run_id: str, metric: str, feats: F.SeriesFeatures, *, semantics: dict[str, Any] | None,
                series_id: int | None, complete: bool, version: str = F.EMBEDDING_VERSION) -> dict[str, Any]:
    full = feats.stats[-1]
    return {
        "run_id": run_id, "version": version, "metric": metric, "series_id": series_id,
        "semantics": dict(semantics or {}), "semantics_key": semantics_key(semantics),
        "point_count": feats.point_count, "complete": complete,
        "first_step": feats.first_step, "last_step": feats.last_step,
        "flat": bool(full[5]), "mean": float(full[0]), "std": float(full[1]), "final": float(full[2]),
        "max": float(full[3]), "argmax": float(full[4]),
        "level_stats": F.encode_stats(feats.stats), "paa": F.encode_paa(feats.paa),
        "grid": F.encode_grid(feats.zgrid), "created_at": utcnow(), "_paa": feats.paa,
    }


# --- refresh ----------------------------------------------------------------------------

def refresh_embeddings(session: Session, run_id: str, *, force: bool = False) -> int:
    """Bring one run's embeddings up to date inside the caller's transaction; rows written.

    Cheap when nothing changed enough (see the module docstring for the rule), so the store
    can call it after every append and on finish.
    """
    run = session.get(Run, run_id)
    if run is None:
        return 0
    done = run.status != "running"
    series = session.execute(
        select(Series.id, Series.count, Series.sign, Series.semantics, MetricDefinition.name)
        .join(MetricDefinition, Series.definition_id == MetricDefinition.id)
        .where(Series.run_id == run_id).order_by(Series.count.desc(), Series.key)
    ).all()
    chosen: dict[str, Any] = {}
    for s in series:  # the series with most points wins, as in Registry.canonical_curves
        chosen.setdefault(s.name, s)
    existing = {r.metric: r for r in session.execute(
        select(CurveEmbedding.id, CurveEmbedding.metric, CurveEmbedding.point_count, CurveEmbedding.complete,
               CurveEmbedding.semantics_key, CurveEmbedding.series_id)
        .where(CurveEmbedding.run_id == run_id, CurveEmbedding.version == F.EMBEDDING_VERSION))}
    new_rows, stale, mark_complete = [], [], []
    for name, s in chosen.items():
        old = existing.pop(name, None)
        if old is not None and not force and old.series_id == s.id and old.semantics_key == semantics_key(s.semantics):
            if old.point_count == s.count:
                if done and not old.complete:
                    mark_complete.append(old.id)
                continue
            if not done and s.count < GROWTH * old.point_count:
                continue
        if old is not None:
            stale.append(old.id)
        data = read_series_chunks(session, s.id).per_step()  # shapes compare one value per step
        steps, values = data.steps, data.values
        feats = F.compute_features(steps, values * s.sign if s.sign != 1.0 else values)
        if feats is None:
            continue
        # point_count is the series' own count (NaNs included), so the growth rule compares like with like.
        feats.point_count = int(s.count)
        new_rows.append(feature_row(run_id, name, feats, semantics=s.semantics, series_id=s.id, complete=done))
    stale += [r.id for r in existing.values()]
    if stale:
        session.execute(delete(CurveEmbedding).where(CurveEmbedding.id.in_(stale)))
    if mark_complete:
        session.execute(update(CurveEmbedding).where(CurveEmbedding.id.in_(mark_complete)).values(complete=True))
    insert_rows(session, new_rows, has_vector_columns(session))
    return len(new_rows)


def rebuild_embeddings(registry: Any, *, run_ids: Iterable[str] | None = None, batch: int = 200) -> dict[str, int]:
    """Recompute every run's embeddings for the current version, then drop other versions.

    Run after changing the method (``features.EMBEDDING_VERSION``) or after installing
    pgvector on the server (this also adds the vector columns). Queries filter on the
    current version, so they never mix versions, also while this runs.
    """
    ensure_vector_columns(registry.engine)
    with registry.read() as session:
        ids = list(run_ids) if run_ids is not None else list(session.scalars(select(Run.id).order_by(Run.id)))
    written = 0
    for start in range(0, len(ids), batch):
        with registry.transaction() as session:
            for rid in ids[start:start + batch]:
                written += refresh_embeddings(session, rid, force=True)
    with registry.transaction() as session:
        dropped = session.execute(delete(CurveEmbedding).where(CurveEmbedding.version != F.EMBEDDING_VERSION)).rowcount
    return {"runs": len(ids), "rows_written": written, "old_version_rows_dropped": int(dropped or 0)}


# --- loading ----------------------------------------------------------------------------

# the logging point is the only semantics field read per row: extracted in SQL, not parsed as JSON
LOAD_COLUMNS = (CurveEmbedding.id, CurveEmbedding.run_id, CurveEmbedding.metric, CurveEmbedding.semantics_key,
                CurveEmbedding.semantics["logging_point"].as_string(), CurveEmbedding.first_step,
                CurveEmbedding.last_step, CurveEmbedding.point_count, CurveEmbedding.level_stats, CurveEmbedding.paa)


@dataclass
class Corpus:
    """Embedding rows of one version as arrays (one entry per row)."""

    ids: np.ndarray          # row ids
    run_ids: np.ndarray      # (R,) unique run ids (str), sorted
    run_idx: np.ndarray      # row -> index into run_ids
    metric: np.ndarray       # (n,) canonical names (object)
    sem_key: np.ndarray      # (n,) strict semantics key (object)
    log_point: np.ndarray    # (n,) logging point (object)
    first: np.ndarray        # (n,) float
    last: np.ndarray
    count: np.ndarray
    stats: np.ndarray        # (n, levels, stats)
    paa: np.ndarray          # (n, levels, PAA) float32
    grids: np.ndarray | None  # (n, levels, GRID) float16, when preloaded or fetched
    state: tuple[int, int] = (0, 0)
    other_versions: int = 0   # runs that only have rows of other versions (checked at load)

    @property
    def n(self) -> int:
        return len(self.ids)

    def positions(self, metric: str) -> np.ndarray:
        """(R,) row position of ``metric`` for each run, -1 where the run has none."""
        return self.dense(metric)[0]

    def dense(self, metric: str) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray]:
        """Per-run view of one metric, built once per corpus: (positions, semantics codes
        (-1: none), the codes' keys, whole-run PAA (R, PAA) float32 with zeros where missing,
        and the squared norms of those PAA rows)."""
        cache = self.__dict__.setdefault("_dense", {})
        if metric not in cache:
            R = len(self.run_ids)
            pos = np.full(R, -1, dtype=np.int64)
            rows = np.flatnonzero(self.metric == metric)
            pos[self.run_idx[rows]] = rows
            keys, inverse = np.unique(self.sem_key[rows].astype(str), return_inverse=True)
            codes = np.full(R, -1, dtype=np.int64)
            codes[self.run_idx[rows]] = inverse
            whole = np.zeros((R, F.PAA), dtype=np.float32)
            whole[self.run_idx[rows]] = self.paa[rows, -1]
            cache[metric] = (pos, codes, [str(k) for k in keys], whole, np.einsum("rp,rp->r", whole, whole))
        return cache[metric]

    def whole_grids(self, metric: str) -> np.ndarray | None:
        """(R, GRID) float32 whole-run z-grids of one metric (zeros where missing), when loaded."""
        if self.grids is None:
            return None
        cache = self.__dict__.setdefault("_whole_grids", {})
        if metric not in cache:
            pos = self.positions(metric)
            out = np.zeros((len(self.run_ids), F.GRID), dtype=np.float32)
            have = pos >= 0
            out[have] = self.grids[pos[have], -1]
            cache[metric] = out
        return cache[metric]

    def run_index(self, run_id: str) -> int:
        i = int(np.searchsorted(self.run_ids, run_id))
        return i if i < len(self.run_ids) and self.run_ids[i] == run_id else -1


def _columns_from_rows(rows: Sequence[Any], with_grids: bool) -> dict[str, np.ndarray]:
    n = len(rows)
    cols = {
        "ids": np.fromiter((r[0] for r in rows), dtype=np.int64, count=n),
        "run_id": np.array([r[1] for r in rows], dtype=object),
        "metric": np.array([r[2] for r in rows], dtype=object),
        "sem_key": np.array([r[3] for r in rows], dtype=object),
        "log_point": np.array([r[4] for r in rows], dtype=object),
        "first": np.fromiter((r[5] for r in rows), dtype=np.float64, count=n),
        "last": np.fromiter((r[6] for r in rows), dtype=np.float64, count=n),
        "count": np.fromiter((r[7] for r in rows), dtype=np.float64, count=n),
        "stats": np.frombuffer(b"".join(r[8] for r in rows), dtype="<f8").reshape(n, F.N_LEVELS, len(F.STATS)),
        "paa": np.frombuffer(b"".join(r[9] for r in rows), dtype="<f4").reshape(n, F.N_LEVELS, F.PAA),
    }
    if with_grids:
        cols["grids"] = np.frombuffer(b"".join(r[10] for r in rows), dtype="<f2").reshape(n, F.N_LEVELS, F.GRID)
    return cols


def _build(cols: dict[str, np.ndarray], state: tuple[int, int]) -> Corpus:
    run_ids, run_idx = np.unique(cols["run_id"].astype(str), return_inverse=True)
    return Corpus(cols["ids"], run_ids, run_idx.astype(np.int64), cols["metric"], cols["sem_key"], cols["log_point"],
                  cols["first"], cols["last"], cols["count"], cols["stats"], cols["paa"], cols.get("grids"), state)


def fetch_rows(session: Session, where: Any, with_grids: bool = True, version: str = F.EMBEDDING_VERSION) -> Corpus:
    """A Corpus of the rows matching ``where`` (a SQL condition on CurveEmbedding)."""
    columns = LOAD_COLUMNS + ((CurveEmbedding.grid,) if with_grids else ())
    rows = session.execute(select(*columns).where(CurveEmbedding.version == version, true() if where is True else where)
                           .order_by(CurveEmbedding.id)).all()
    return _build(_columns_from_rows(rows, with_grids), (0, len(rows)))


def fetch_grids(session: Session, ids: np.ndarray) -> np.ndarray:
    """(len(ids), levels, GRID) z-grids of the given rows, in the order given."""
    out = np.zeros((len(ids), F.N_LEVELS, F.GRID), dtype=np.float16)
    where = {int(i): j for j, i in enumerate(ids)}
    for match in id_chunks(session, CurveEmbedding.id, [int(i) for i in ids]):
        for rid, blob in session.execute(select(CurveEmbedding.id, CurveEmbedding.grid).where(match)):
            out[where[rid]] = F.decode_grid(blob)
    return out


class _CorpusCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_engine: weakref.WeakKeyDictionary[Engine, dict[str, Corpus]] = weakref.WeakKeyDictionary()
        self.loads = 0  # full loads, for tests and the benchmark

    def get(self, session: Session, version: str = F.EMBEDDING_VERSION) -> Corpus:
        engine = engine_of(session)
        state = embedding_state(session, version)
        with self._lock:
            per_engine = self._by_engine.setdefault(engine, {})
            cached = per_engine.get(version)
            if cached is not None and cached.state == state:
                return cached
            corpus = None
            if cached is not None and state[0] > cached.state[0]:
                corpus = self._merge(session, cached, version, state)
            if corpus is None:
                with_grids = state[1] <= GRID_PRELOAD_ROWS
                corpus = fetch_rows(session, True, with_grids, version)
                corpus.state = state
                self.loads += 1
            corpus.other_versions = other_version_runs(session, version)
            per_engine[version] = corpus
            return corpus

    @staticmethod
    def _merge(session: Session, old: Corpus, version: str, state: tuple[int, int]) -> Corpus | None:
        with_grids = old.grids is not None and state[1] <= GRID_PRELOAD_ROWS
        columns = LOAD_COLUMNS + ((CurveEmbedding.grid,) if with_grids else ())
        rows = session.execute(select(*columns).where(CurveEmbedding.version == version,
                                                      CurveEmbedding.id > old.state[0])
                               .order_by(CurveEmbedding.id)).all()
        new = _columns_from_rows(rows, with_grids)
        replaced = {(r, m) for r, m in zip(new["run_id"], new["metric"])}
        keep = np.array([(rid, m) not in replaced for rid, m in zip(old.run_ids[old.run_idx], old.metric)], dtype=bool)
        merged = {
            "ids": old.ids[keep], "run_id": old.run_ids[old.run_idx][keep].astype(object), "metric": old.metric[keep],
            "sem_key": old.sem_key[keep], "log_point": old.log_point[keep], "first": old.first[keep],
            "last": old.last[keep], "count": old.count[keep], "stats": old.stats[keep], "paa": old.paa[keep],
        }
        if with_grids:
            merged["grids"] = old.grids[keep]
        cols = {k: np.concatenate([merged[k], new[k]]) for k in merged}
        if len(cols["ids"]) != state[1]:
            return None  # rows were also deleted: reload
        return _build(cols, state)


CACHE = _CorpusCache()

#: Per-version row counts kept by triggers on SQLite (migration 0005); not mapped, so that
#: exports leave it alone.
ROW_COUNTS = table("embedding_row_counts", column("version", String), column("n_rows", BigInteger))


def embedding_state(session: Session, version: str = F.EMBEDDING_VERSION) -> tuple[int, int]:
    """``(max(id), row count)`` of one embedding version: changes whenever a row of it is
    added, replaced or removed (ids only grow), so it tells the per-process cache when to
    reload. On SQLite the count comes from the trigger-kept table (one lookup instead of a
    walk of the version index); on PostgreSQL it is counted."""
    max_id = session.scalar(select(func.max(CurveEmbedding.id)).where(CurveEmbedding.version == version))
    if is_sqlite(session):
        count = session.scalar(select(ROW_COUNTS.c.n_rows).where(ROW_COUNTS.c.version == version))
    else:
        count = session.scalar(select(func.count()).where(CurveEmbedding.version == version))
    return int(max_id or 0), int(count or 0)


def other_version_runs(session: Session, version: str = F.EMBEDDING_VERSION) -> int:
    """Runs with embeddings of another version only (they are not compared until rebuilt)."""
    # "<" or ">" rather than "!=": two range scans of the version index, so the usual answer
    # (no other version at all) costs a lookup, not a pass over the table
    other = or_(CurveEmbedding.version < version, CurveEmbedding.version > version)
    if not session.scalar(select(exists().where(other))):
        return 0
    current = select(CurveEmbedding.run_id).where(CurveEmbedding.version == version)
    return int(session.scalar(select(func.count(func.distinct(CurveEmbedding.run_id)))
                              .where(other, CurveEmbedding.run_id.not_in(current))) or 0)


def load_corpus(session: Session, version: str = F.EMBEDDING_VERSION) -> Corpus:
    return CACHE.get(session, version)
