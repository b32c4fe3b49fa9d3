"""trackio: its per-project SQLite database (``~/.cache/huggingface/trackio/<project>.db``).

Tables read (trackio/sqlite_storage.py, 0.2-0.43): ``metrics(run_id, run_name, step, timestamp,
metrics)`` with one JSON object of values per ``log`` call, ``configs(run_id, run_name, config)``
with the run's config as JSON (trackio's own entries start with ``_``: ``_Created``,
``_Username``, ``_Group``). trackio writes non-finite floats as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``; they are turned back. Values that are not numbers (media,
tables) are skipped. The project is the database file's name; older databases without a
``run_id`` column are keyed by run name.
"""
from __future__ import annotations

import json
import math
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from registry.core.errors import InputError
from registry.importers.tracker_base import HistoryRun, check_sqlite, series_from_columns, sqlite_tables
from registry.core.series import SeriesData

FORMAT = "trackio"
_NONFINITE = {"NaN": math.nan, "nan": math.nan, "Infinity": math.inf, "inf": math.inf,
              "-Infinity": -math.inf, "-inf": -math.inf}


def sniff(path: Path) -> bool:
    if not check_sqlite(path):
        return False
    tables = sqlite_tables(path)
    return {"metrics", "configs"} <= tables and "experiments" not in tables


def open_runs(path: Path | str) -> Iterator[HistoryRun]:
    path = Path(path)
    if not check_sqlite(path) or not {"metrics", "configs"} <= sqlite_tables(path):
        raise InputError("not a trackio database (no metrics and configs tables)", str(path))
    conn = _connect(path)
    try:
        columns = {row[1] for row in conn.execute("pragma table_info(metrics)")}
        id_column = "run_id" if "run_id" in columns else "run_name"
        runs = conn.execute(f"select {id_column}, min(run_name), min(id) from metrics group by {id_column} "
                            "order by min(id)").fetchall()
        configs = {}
        config_columns = {row[1] for row in conn.execute("pragma table_info(configs)")}
        config_id = "run_id" if "run_id" in config_columns else "run_name"
        for key, text in conn.execute(f"select {config_id}, config from configs"):
            configs[key] = _json(text, path, f"config of run {key}")
    except sqlite3.DatabaseError as exc:
        raise InputError(f"cannot read the trackio runs ({exc}): a partially written or truncated file?",
                         str(path)) from None
    finally:
        conn.close()
    for run_key, run_name, _ in runs:
        config = dict(configs.get(run_key) or {})
        group = config.pop("_Group", None)
        params = {k: v for k, v in config.items() if not str(k).startswith("_")}

        def load(run_key: str = run_key) -> dict[str, SeriesData]:
            return _metrics(path, id_column, run_key)

        # trackio's run ids are uuids: the key does not depend on where the file is or what it is called
        # (an uploaded copy is the same run); older files without them are keyed by project and run name.
        key = str(run_key) if id_column == "run_id" else f"{path.stem}/{run_key}"
        yield HistoryRun(format=FORMAT, path=path, key=key, name=run_name or str(run_key),
                         load=load, project=path.stem, params=params,
                         tags=[f"group:{group}"] if group else [])


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _metrics(path: Path, id_column: str, run_key: str) -> dict[str, SeriesData]:
    keys: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    conn = _connect(path)
    try:
        rows = conn.execute(f"select id, step, timestamp, metrics from metrics where {id_column} = ? order by id",
                            (run_key,))
        for row_id, step, stamp, text in rows:
            record = _json(text, path, f"metrics row id {row_id}")
            wall = _timestamp(stamp)
            for key, raw in record.items():
                value = _value(raw)
                if value is None or key in ("step", "timestamp"):
                    continue
                keys.append(key)
                steps.append(int(step))
                values.append(value)
                walls.append(wall)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"run {run_key}: cannot read its metrics ({exc}): a partially written or truncated "
                         "file?", str(path)) from None
    finally:
        conn.close()
    return series_from_columns(keys, steps, values, walls)


def _json(text: Any, path: Path, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: not JSON ({exc})", str(path)) from None
    return data if isinstance(data, dict) else {}


def _value(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None  # a flag, not a measurement (as trainer_state.json's booleans)
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        return _NONFINITE.get(raw)
    return None


def _timestamp(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return math.nan
