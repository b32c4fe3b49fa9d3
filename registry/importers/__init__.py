"""Importers: each turns one kind of training log into a ``Source`` of points.

``open_source`` picks the importer (by name, or by sniffing the path) and makes sure
the input holds at least one metric point; ``fingerprint`` identifies a source by
content so that registering the same files twice can be recognised.

Trackers' stores (``HISTORY_FORMATS``: an MLflow database or ``mlruns/``, a trackio database,
W&B run directories and history exports) hold many runs each: ``resolve_format`` names them
like any other format, and ``registry.importers.history.open_store`` lists their runs.
"""
from __future__ import annotations

import hashlib
import re
from contextlib import closing
from pathlib import Path
from typing import Callable

from registry.core.errors import InputError, UnknownFormatError
from registry.db.engine import redact_url
from registry.importers import tabular, tensorboard, trainer_state, verl_file, verl_log
from registry.importers.base import Point, Source
from registry.importers.detect import detect_format

__all__ = ["FORMATS", "HISTORY_FORMATS", "IMPORTERS", "Point", "Source", "fingerprint", "is_database_url",
           "open_source", "resolve_format", "run_paths"]

IMPORTERS: dict[str, Callable[[Path], Source]] = {
    tensorboard.FORMAT: tensorboard.open_tensorboard,
    trainer_state.FORMAT: trainer_state.open_trainer_state,
    verl_log.FORMAT: verl_log.open_verl_log,
    verl_file.FORMAT: verl_file.open_verl_file,
    tabular.CSV_FORMAT: tabular.open_csv,
    tabular.JSONL_FORMAT: tabular.open_jsonl,
}

# Formats read as a tracker's store of runs (registry.importers.history), not as one Source.
HISTORY_FORMATS = ("mlflow", "trackio", "wandb")
FORMATS = [*IMPORTERS, *HISTORY_FORMATS]

_CHUNK = 1 << 20
_DATABASE_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+]*://")


def is_database_url(path: Path | str) -> bool:
    """A SQLAlchemy URL (``sqlite:///mlflow.db``, ``postgresql://...``) rather than a path: an
    MLflow tracking database named the way MLflow's own ``--backend-store-uri`` names it."""
    return isinstance(path, str) and bool(_DATABASE_URL.match(path))


def resolve_format(path: Path | str, format: str | None = None) -> str:
    """The format that reads ``path``: ``format`` checked against the known ones, or detected.

    A database URL is MLflow's tracking database. Raises InputError for a missing or empty
    file and UnknownFormatError for an unknown name or unrecognisable content.
    """
    if is_database_url(path):
        if format not in (None, "mlflow"):
            raise UnknownFormatError(f"a database URL is read as an MLflow tracking database, not {format!r}",
                                     redact_url(str(path)))
        return "mlflow"
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    if path.is_file() and _is_blank(path):
        raise InputError("no metric points found (the file is empty)", str(path))
    if format is None:
        return detect_format(path, FORMATS)
    if format not in FORMATS:
        raise UnknownFormatError(f"unknown format {format!r}; known formats: {', '.join(FORMATS)}", str(path))
    return format


def open_source(path: Path | str, format: str | None = None) -> Source:
    """Open ``path`` with the importer named ``format``, or the one its content calls for.

    Raises UnknownFormatError for an unknown name or unrecognisable content, and
    InputError("no metric points found") for an empty input. Only the first point is
    read here; a problem further into the file surfaces while iterating ``points()``.
    """
    format = resolve_format(path, format)
    path = Path(path)
    if format not in IMPORTERS:
        raise UnknownFormatError(f"{format} holds a tracker's runs, not one log: register it with "
                                 "Registry.register or register_all", str(path))
    source = IMPORTERS[format](path)
    with closing(source.points()) as points:
        if next(points, None) is None:
            raise InputError("no metric points found", str(path))
    return source


def run_paths(path: Path | str, format: str | None = None) -> list[Path]:
    """The runs a path holds: itself, or one sub-directory per run for a TensorBoard directory
    laid out the way SB3 (``PPO_1/``, ``PPO_2/``) and CleanRL (``runs/<run name>/``) write them."""
    path = Path(path)
    if path.is_dir() and format in (None, tensorboard.FORMAT):
        runs = tensorboard.run_directories(path)
        if runs:
            return runs
    return [path]


def fingerprint(source: Source) -> str:
    """sha256 over the source's files: each relative name and its bytes, in name order.

    Names are relative to the source path (its directory, or the file's own directory),
    so the same run copied elsewhere has the same fingerprint; files are hashed in
    1 MB chunks so a large event file is never read whole.
    """
    files = source.files or [source.path]
    root = source.path if source.path.is_dir() else source.path.parent
    digest = hashlib.sha256()
    for name, file in sorted((f.relative_to(root).as_posix(), f) for f in files):
        encoded = name.encode("utf-8")
        # Lengths in front keep ("ab", b"c") and ("a", b"bc") apart.
        digest.update(len(encoded).to_bytes(8, "big") + encoded + file.stat().st_size.to_bytes(8, "big"))
        with open(file, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _is_blank(path: Path) -> bool:
    """Empty or whitespace only (an editor's lone newline counts as empty)."""
    with open(path, "rb") as handle:
        return not handle.read(4096).strip() and not handle.read(1)
