"""MLflow: a tracking database (SQLite file or SQLAlchemy URL) or a legacy ``mlruns/`` file store.

Read directly, without MLflow installed or a tracking server. One registry run per MLflow run
(deleted runs skipped), its MLflow run id as the idempotency key; the experiment's name is the
project, params become hyperparameters (typed: ``"1e-6"`` -> 1e-06), tags other than MLflow's
own ``mlflow.*`` become ``key=value`` tags, ``mlflow.runName`` the name.

Values: MLflow stores NaN as 0 with ``is_nan`` set and +-Inf as +-1.7976931348623157e308
(``SqlAlchemyStore.sanitize_metric_value``, mlflow/store/tracking/sqlalchemy_store.py, 2.x-3.x);
both are turned back. verl's MLflow adapter rewrites ``@`` in keys to ``_at_``
(``_MlflowLoggingAdapter.log``, verl/utils/tracking.py; since 2025 it also turns other characters
MLflow refuses into ``_`` and runs of ``/`` into one, which cannot be undone and is left as is)
and flattens its config with ``/``
(``_compute_mlflow_params_from_objects``); for a run whose params are verl's
(``actor_rollout_ref/...``, ``trainer/...``) both are undone: ``val-core/x/acc/mean_at_4`` ->
``val-core/x/acc/mean@4``, ``actor_rollout_ref/actor/optim/lr`` -> ``actor_rollout_ref.actor.optim.lr``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from registry.core.errors import InputError
from registry.importers.tracker_base import HistoryRun, check_sqlite, series_from_columns, sqlite_tables
from registry.importers.params import parse_value
from registry.core.series import SeriesData
from registry.db.engine import normalize_url, redact_url

FORMAT = "mlflow"
_TABLES = {"experiments", "runs", "metrics", "params"}
_MAX_DOUBLE = 1.7976931348623157e308
# MLflow's RunStatus (mlflow/entities/run_status.py): the file store keeps the number, the database the name.
_STATUS = {"RUNNING": "running", "SCHEDULED": "running", "FINISHED": "finished", "FAILED": "crashed",
           "KILLED": "crashed", "1": "running", "2": "running", "3": "finished", "4": "crashed", "5": "crashed"}
_VERL_PARAM_PREFIXES = ("actor_rollout_ref/", "trainer/", "algorithm/", "critic/", "data/")
_VERL_AT = re.compile(r"_at_(?=\d)")


def sniff(path: Path) -> bool:
    if path.is_dir():
        return _is_file_store(path)
    return check_sqlite(path) and _TABLES <= sqlite_tables(path)


def open_runs(path: Path | str) -> Iterator[HistoryRun]:
    """Every run of an MLflow store: a database file or URL, or an ``mlruns`` directory.

    A ``sqlite:///`` URL is read as the file it names (which must exist: opening a missing one
    would create it); any other URL (``postgresql://``, ``mysql://``) through SQLAlchemy, with
    ``postgresql://`` pinned to the psycopg 3 driver the registry itself uses. The password
    never appears in messages or in the runs' recorded source.
    """
    text = str(path)
    if isinstance(path, str) and "://" in text:
        shown = redact_url(text)
        try:
            url = make_url(normalize_url(text))
        except ArgumentError as exc:
            raise InputError(f"not a database URL ({exc})", shown) from None
        if url.get_backend_name() == "sqlite":
            if not url.database or url.database == ":memory:":
                raise InputError("an MLflow database URL must name a file", shown)
            return open_runs(Path(url.database))
        return _database_runs(url, shown)
    path = Path(path)
    if path.is_dir():
        return _file_store_runs(path)
    if not check_sqlite(path):
        raise InputError("not an MLflow tracking database (no SQLite header)", str(path))
    missing = _TABLES - sqlite_tables(path)
    if missing:
        raise InputError(f"not an MLflow tracking database (no table {', '.join(sorted(missing))})", str(path))
    # Read-only: importing never writes to (or creates a journal beside) the tracker's database.
    return _database_runs(f"sqlite:///file:{path.resolve()}?mode=ro&uri=true", path)


# --- tracking database ---------------------------------------------------------------------

def _database_runs(url: Any, label: Path | str) -> Iterator[HistoryRun]:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            style = engine.dialect.paramstyle
            q = (lambda sql: sql) if style == "qmark" else (lambda sql: sql.replace("?", "%s"))
            try:
                cur = raw.cursor()
                cur.execute("select experiment_id, name from experiments")
                experiments = {str(e): n for e, n in cur.fetchall()}
                cur.execute("select run_uuid, name, status, experiment_id, lifecycle_stage from runs "
                            "order by start_time, run_uuid")
                runs = cur.fetchall()
                metrics_sql = _metrics_query(cur, engine.dialect.name)
            except Exception as exc:  # noqa: BLE001 - the driver's own DatabaseError
                raise InputError(f"cannot read the MLflow runs ({exc})", str(label)) from None
            for run_uuid, name, status, experiment_id, stage in runs:
                if stage == "deleted":
                    continue
                try:
                    cur.execute(q("select key, value from params where run_uuid = ?"), (run_uuid,))
                    params = dict(cur.fetchall())
                    cur.execute(q("select key, value from tags where run_uuid = ?"), (run_uuid,))
                    tags = dict(cur.fetchall())
                except Exception as exc:  # noqa: BLE001
                    raise InputError(f"run {run_uuid}: cannot read its params or tags ({exc})", str(label)) from None

                def load(run_uuid: str = run_uuid, verl: bool = _is_verl(params)) -> dict[str, SeriesData]:
                    return _database_metrics(engine, q, metrics_sql, run_uuid, label, verl)

                yield _history_run(label, run_uuid, name or tags.get("mlflow.runName") or run_uuid,
                                   experiments.get(str(experiment_id)), params, tags, status, load)
    except SQLAlchemyError as exc:
        raise InputError(f"cannot open the MLflow database ({exc})", str(label)) from None
    finally:
        engine.dispose()


_METRICS = "select step, timestamp, value, is_nan from metrics{hint} where run_uuid = ? and key = ?"
_RUN_KEY_STEP_INDEX = "index_metrics_run_uuid_key_step"   # MLflow's own, since its 1.x migrations
# A metric row as numbers: steps and times stay exact integers (no trip through float64).
_ROW = np.dtype([("step", np.int64), ("timestamp", np.int64), ("value", np.float64), ("is_nan", np.int8)])


def _metrics_query(cur: Any, dialect: str) -> str:
    """One metric of one run. On SQLite, through MLflow's (run_uuid, key, step) index by name: left to
    itself SQLite's planner takes the primary key (key, timestamp, ...) and scans the metric's rows of
    every run to find one run's, which makes importing a store quadratic in its number of runs."""
    if dialect == "sqlite":
        cur.execute("select 1 from sqlite_master where type = 'index' and name = ?", (_RUN_KEY_STEP_INDEX,))
        if cur.fetchone() is not None:
            return _METRICS.format(hint=f" indexed by {_RUN_KEY_STEP_INDEX}")
        return _METRICS.format(hint="")
    return _METRICS.format(hint="").replace("?", "%s")


def _database_metrics(engine, q, metrics_sql: str, run_uuid: str, label: Path | str,
                      verl: bool) -> dict[str, SeriesData]:
    """One query per metric over MLflow's (run_uuid, key, step) index, its rows (four numbers each, no
    key string) read straight into one structured array; sorted by step, then logging time, only when
    the index order (step, then insertion) is not already that."""
    data: dict[str, SeriesData] = {}
    with engine.connect() as conn:
        cur = conn.connection.dbapi_connection.cursor()
        try:
            cur.execute(q("select distinct key from metrics where run_uuid = ?"), (run_uuid,))
            keys = sorted(row[0] for row in cur.fetchall())
            for key in keys:
                cur.execute(metrics_sql, (run_uuid, key))
                rows = np.fromiter(cur, dtype=_ROW)
                steps = rows["step"]
                if len(rows) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
                    rows = rows[np.lexsort((rows["timestamp"], steps))]
                    steps = rows["step"]
                values = _restore_values(rows["value"], rows["is_nan"] != 0)
                data[_VERL_AT.sub("@", key) if verl else key] = SeriesData(
                    np.ascontiguousarray(steps), values, rows["timestamp"] / 1000.0)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the driver's own DatabaseError
            raise InputError(f"run {run_uuid}: cannot read its metrics ({exc}): a partially written or "
                             "truncated database?", str(label)) from None
    return data


def _restore_values(values: np.ndarray, nans: np.ndarray) -> np.ndarray:
    values = values.copy()
    values[nans] = np.nan
    values[values >= _MAX_DOUBLE] = np.inf
    values[values <= -_MAX_DOUBLE] = -np.inf
    return values


# --- legacy file store --------------------------------------------------------------------

def _is_file_store(path: Path) -> bool:
    """An ``mlruns`` directory: experiment folders with ``meta.yaml`` holding run folders with ``metrics/``."""
    for experiment in _experiment_dirs(path):
        for run in experiment.iterdir():
            if run.is_dir() and (run / "meta.yaml").is_file() and (run / "metrics").is_dir():
                return True
    return False


def _experiment_dirs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir() and (d / "meta.yaml").is_file()
                  and d.name not in (".trash", "models"))


def _file_store_runs(root: Path) -> Iterator[HistoryRun]:
    for experiment in _experiment_dirs(root):
        meta = _yaml(experiment / "meta.yaml")
        if meta.get("lifecycle_stage") == "deleted":
            continue
        project = meta.get("name")
        for run_dir in sorted(d for d in experiment.iterdir() if d.is_dir() and (d / "meta.yaml").is_file()):
            run_meta = _yaml(run_dir / "meta.yaml")
            if run_meta.get("lifecycle_stage") == "deleted":
                continue
            run_id = str(run_meta.get("run_id") or run_meta.get("run_uuid") or run_dir.name)
            params = _file_values(run_dir / "params")
            tags = _file_values(run_dir / "tags")

            def load(run_dir: Path = run_dir, verl: bool = _is_verl(params)) -> dict[str, SeriesData]:
                return _file_metrics(run_dir / "metrics", verl)

            yield _history_run(root, run_id, run_meta.get("run_name") or tags.get("mlflow.runName") or run_id,
                               project, params, tags, str(run_meta.get("status", "")), load)


def _file_values(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {f.relative_to(directory).as_posix(): f.read_text(encoding="utf-8")
            for f in sorted(directory.rglob("*")) if f.is_file()}


def _file_metrics(directory: Path, verl: bool) -> dict[str, SeriesData]:
    """Each metric file: one ``timestamp value step`` line per point (mlflow/store/tracking/file_store.py)."""
    if not directory.is_dir():
        return {}
    keys: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    for file in sorted(f for f in directory.rglob("*") if f.is_file()):
        key = file.relative_to(directory).as_posix()
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    stamp, value = int(parts[0]), float(parts[1])
                    step = int(parts[2]) if len(parts) > 2 else 0
                except (ValueError, IndexError):
                    raise InputError(f"expected 'timestamp value step', got {line.strip()[:60]!r}", str(file),
                                     f"line {number}") from None
                keys.append(key)
                steps.append(step)
                values.append(value)
                walls.append(stamp / 1000.0)
    data = series_from_columns(keys, steps, values, walls)
    return _undo_verl_keys(data) if verl else data


def _yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InputError(f"bad meta.yaml ({exc})", str(path)) from None
    return data if isinstance(data, dict) else {}


# --- shared --------------------------------------------------------------------------------

def _is_verl(params: dict[str, str]) -> bool:
    return any(k.startswith(_VERL_PARAM_PREFIXES) for k in params) and any(
        k.startswith("actor_rollout_ref/") for k in params)


def _undo_verl_keys(data: dict[str, SeriesData]) -> dict[str, SeriesData]:
    return {_VERL_AT.sub("@", key): sd for key, sd in data.items()}


def _typed(text: str) -> Any:
    """A param's text typed (``"1e-6"`` -> 1e-06, ``"true"`` -> True); anything structured stays text."""
    try:
        value = parse_value(text)
    except InputError:
        return text
    return text if isinstance(value, dict) else value


def _history_run(path: Path | str, run_id: str, name: str, project: str | None, params: dict[str, str],
                 tags: dict[str, str], status: str | None, load) -> HistoryRun:
    verl = _is_verl(params)
    typed = {(k.replace("/", ".") if verl else k): _typed(v) for k, v in params.items()}
    return HistoryRun(
        format=FORMAT, path=path, key=run_id, name=name, load=load, project=project, params=typed,
        tags=sorted(f"{k}={v}" for k, v in tags.items() if not k.startswith("mlflow.") and len(v) < 200),
        status=_STATUS.get(str(status).upper(), "finished"), framework="verl" if verl else None,
    )
