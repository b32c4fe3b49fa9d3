"""W&B: a local run directory (``wandb/offline-run-*`` or ``wandb/run-*``), a ``wandb/`` folder of
them, or a run's history exported as Parquet or CSV.

Run directory: the config comes from ``files/config.yaml`` (W&B's ``{key: {value: ...}}`` form)
and the summary from ``files/wandb-summary.json`` when the client wrote them; otherwise both, and
the history, come from the run's transaction log ``run-<id>.wandb``: a LevelDB-style log (7-byte
``:W&B`` header, 32 KiB blocks, records split FULL/FIRST/MIDDLE/LAST) of ``Record`` protobufs
(``wandb/proto/wandb_internal.proto``: ``run``, ``config``, ``history``, ``summary``, ``exit``),
decoded with the installed ``wandb`` package's own protobuf classes. Summary entries that are not
curves (``best_reward``) become scores. The run id is W&B's: the idempotency key.

Steps: the trainer's step is preferred over W&B's own counter ``_step``. The Hugging Face
``WandbCallback`` logs ``train/global_step`` with every entry
(``transformers/integrations/integration_utils.py``, ``WandbCallback.on_log``), so where that
column is present it is the step and rows without it are reported; else ``global_step``; else
``_step``. ``_timestamp`` is the wall time; ``_runtime`` and the step columns are not curves.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any, Iterator

import yaml

from registry.core.errors import InputError
from registry.importers.tracker_base import HistoryRun, plain_scores, series_from_columns
from registry.core.series import SeriesData

FORMAT = "wandb"
STEP_COLUMNS = ("train/global_step", "global_step", "_step")
_SKIP = {"_step", "_runtime", "_timestamp", "_wandb"}
_HEADER = b":W&B"
_BLOCK = 32768
_PARQUET_MAGIC = b"PAR1"
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def sniff(path: Path) -> bool:
    """A run directory or a folder of them, a ``.wandb`` log or a Parquet file, told by content (an
    upload is stored under a generated name). A CSV export is only read with ``format="wandb"``."""
    if path.is_dir():
        return _is_run_dir(path) or any(_is_run_dir(d) for d in _run_dirs(path))
    return _head(path, 4) in (_PARQUET_MAGIC, _HEADER)


def open_runs(path: Path | str) -> Iterator[HistoryRun]:
    path = Path(path)
    if path.is_dir():
        if _is_run_dir(path):
            return iter([_run_dir_run(path)])
        dirs = [d for d in _run_dirs(path) if _is_run_dir(d)]
        if not dirs:
            raise InputError("not a W&B run directory (no files/ or run-*.wandb)", str(path))
        return (_run_dir_run_or_failure(d) for d in dirs)
    head = _head(path, 4)
    if head == _HEADER:
        return iter([_run_dir_run(path.parent, path)])
    if head == _PARQUET_MAGIC:
        return iter([_table_run(path, _parquet_columns(path))])
    return iter([_table_run(path, _csv_columns(path))])


# --- run directories ------------------------------------------------------------------------

def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(n)


def _run_dirs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir() and (d.name.startswith(("offline-run-", "run-"))))


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("run-*.wandb")) or (path / "files" / "wandb-summary.json").is_file()
                              or (path / "files" / "wandb-history.jsonl").is_file())


def _run_dir_run(directory: Path, log_file: Path | None = None) -> HistoryRun:
    """The run of a run directory, or of the given ``.wandb`` log (with the directory's ``files/``)."""
    log_file = log_file or next(iter(sorted(directory.glob("run-*.wandb"))), None)
    records = _Records(log_file) if log_file is not None else None
    files = directory / "files"
    config = _config_yaml(files / "config.yaml") if (files / "config.yaml").is_file() else None
    summary = _json_file(files / "wandb-summary.json") if (files / "wandb-summary.json").is_file() else None
    if records is not None:
        records.read()
        config = config if config is not None else records.config
        summary = summary if summary is not None else records.summary
    config = {k: v for k, v in (config or {}).items() if k != "_wandb"}
    run_id = (records.run_id if records and records.run_id else None) or directory.name.rsplit("-", 1)[-1]
    name = (records.name if records and records.name else None) or run_id

    def load() -> dict[str, SeriesData]:
        if records is not None:
            rows = records.history
        elif (files / "wandb-history.jsonl").is_file():
            rows = _jsonl_rows(files / "wandb-history.jsonl")
        else:
            raise InputError("no history: neither a run-*.wandb file nor files/wandb-history.jsonl", str(directory))
        return _rows_to_series(rows, str(log_file or directory), run.warnings)

    history_keys = set(records.history_keys) if records is not None else set()
    scores = {k: v for k, v in plain_scores({k: v for k, v in (summary or {}).items()
                                              if not k.startswith("_") and k not in history_keys}).items()}
    status = "finished"
    if records is not None:
        status = "running" if records.exit_code is None else ("finished" if records.exit_code == 0 else "crashed")
    run = HistoryRun(format=FORMAT, path=directory, key=run_id, name=name, load=load,
                     project=records.project if records else None, params=config,
                     tags=records.tags if records else [], status=status, scores=scores)
    return run


def _run_dir_run_or_failure(directory: Path) -> HistoryRun:
    """One run of a ``wandb/`` folder; a run directory that cannot be read becomes a run whose loading
    fails with the reason, so the folder's other runs are still registered (and this one is reported)."""
    try:
        return _run_dir_run(directory)
    except InputError as exc:
        error = exc

        def load() -> dict[str, SeriesData]:
            raise error

        # The directory name ends with W&B's run id, the key the readable run would have had.
        return HistoryRun(format=FORMAT, path=directory, key=directory.name.rsplit("-", 1)[-1],
                          name=directory.name, load=load)


class _Records:
    """The records of a ``run-<id>.wandb`` transaction log that make a run."""

    def __init__(self, path: Path):
        self.path = path
        self.run_id: str | None = None
        self.name: str | None = None
        self.project: str | None = None
        self.tags: list[str] = []
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.history_keys: dict[str, None] = {}
        self.exit_code: int | None = None

    def read(self) -> None:
        try:
            from wandb.proto import wandb_internal_pb2 as pb
        except ImportError:
            raise InputError("reading a .wandb file needs the wandb package (pip install wandb)",
                             str(self.path)) from None
        for number, payload in enumerate(_log_records(self.path), 1):
            record = pb.Record()
            try:
                record.ParseFromString(payload)
            except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError
                raise InputError(f"record {number} is not a W&B record ({exc})", str(self.path)) from None
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                self.run_id, self.name, self.project = run.run_id, run.display_name or None, run.project or None
                self.tags = list(run.tags)
                self._apply(self.config, run.config.update)
            elif kind == "config":
                self._apply(self.config, record.config.update)
            elif kind == "summary":
                self._apply(self.summary, record.summary.update)
            elif kind == "history":
                row: dict[str, Any] = {}
                self._apply(row, record.history.item)
                self.history.append(row)
                self.history_keys.update(dict.fromkeys(row))
            elif kind == "exit":
                self.exit_code = record.exit.exit_code

    def _apply(self, target: dict[str, Any], items: Any) -> None:
        for item in items:
            key = ".".join(item.nested_key) if item.nested_key else item.key
            try:
                target[key] = json.loads(item.value_json)
            except ValueError:
                target[key] = _NONFINITE.get(item.value_json.strip('"'), item.value_json)


def _log_records(path: Path) -> Iterator[bytes]:
    """Payloads of a LevelDB-style log: 7-byte records headers (crc32, length, type) in 32 KiB blocks."""
    data = path.read_bytes()
    if data[:4] != _HEADER:
        raise InputError("not a W&B transaction log (no :W&B header)", str(path))
    pos, pending = 7, None
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left  # block trailer padding
            continue
        if pos + 7 > len(data):
            break
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left  # zero-filled rest of the block
            continue
        payload = data[pos + 7:pos + 7 + length]
        if len(payload) < length:
            return  # cut off mid-record (the run is still writing or died): what came before is whole
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            pending = payload
        elif kind == 3 and pending is not None:
            pending += payload
        elif kind == 4 and pending is not None:
            yield pending + payload
            pending = None
        else:
            raise InputError(f"bad record type {kind} at byte {pos - 7 - length}", str(path))


def _config_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"bad config.yaml ({exc})", str(path)) from None
    # W&B writes {key: {desc: ..., value: ...}}
    return {k: (v["value"] if isinstance(v, dict) and "value" in v else v) for k, v in data.items()
            if k not in ("wandb_version",)}


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"not JSON ({exc})", str(path)) from None
    return data if isinstance(data, dict) else {}


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise InputError(f"not JSON ({exc})", str(path), f"line {number}") from None
    return rows


# --- history rows to series -------------------------------------------------------------------

def step_column(columns: list[str] | set[str]) -> str:
    for name in STEP_COLUMNS:
        if name in columns:
            return name
    raise InputError(f"no step column (looked for {', '.join(STEP_COLUMNS)})")


def _rows_to_series(rows: list[dict[str, Any]], label: str, warnings: list[str]) -> dict[str, SeriesData]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    try:
        step_name = step_column(list(columns))
    except InputError as exc:
        raise InputError(exc.reason, label) from None
    keys: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    walls: list[float] = []
    without_step = 0
    for row in rows:
        step = _number(row.get(step_name))
        if step is None or not math.isfinite(step):
            without_step += 1
            continue
        wall = _number(row.get("_timestamp"))
        for key, raw in row.items():
            if key in _SKIP or key in STEP_COLUMNS or key.startswith("_wandb"):
                continue
            value = _number(raw)
            if value is None:
                continue
            keys.append(key)
            steps.append(int(step))
            values.append(value)
            walls.append(math.nan if wall is None else wall)
    if without_step:
        warnings.append(f"{label}: {without_step} of {len(rows)} history rows have no {step_name!r} "
                        "and were skipped")
    return series_from_columns(keys, steps, values, walls)


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        return _NONFINITE.get(raw)
    return None


# --- exported history tables ------------------------------------------------------------------

def _table_run(path: Path, columns: dict[str, list[Any]]) -> HistoryRun:
    names = list(columns)
    try:
        step_name = step_column(names)
    except InputError as exc:
        raise InputError(exc.reason, str(path)) from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    n = len(columns[step_name])
    rows = [{name: columns[name][i] for name in names} for i in range(n)]
    if all(_number(r.get(step_name)) is None for r in rows):
        raise InputError(f"the step column {step_name!r} has no values", str(path))

    def load() -> dict[str, SeriesData]:
        return _rows_to_series(rows, str(path), run.warnings)

    run = HistoryRun(format=FORMAT, path=path, key=f"history:{digest}", name=path.stem, load=load)
    return run


def _parquet_columns(path: Path) -> dict[str, list[Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow (pip install pyarrow)", str(path)) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's ArrowInvalid / OSError for a cut file
        raise InputError(f"cannot read the Parquet file ({exc}): a truncated or partially written file?",
                         str(path)) from None
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _csv_columns(path: Path) -> dict[str, list[Any]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise InputError("empty CSV file", str(path))
        columns: dict[str, list[Any]] = {name: [] for name in header}
        for number, row in enumerate(reader, 2):
            if len(row) != len(header):
                raise InputError(f"{len(row)} cells, the header has {len(header)}", str(path), f"line {number}")
            for name, cell in zip(header, row):
                columns[name].append(_csv_cell(cell))
    return columns


def _csv_cell(cell: str) -> Any:
    text = cell.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return _NONFINITE.get(text, text)
