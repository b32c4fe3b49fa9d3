"""Importers: each turns one kind of training log into a ``Source`` of points.

``open_source`` picks the importer (by name, or by sniffing the path) and makes sure
the input holds at least one metric point; ``fingerprint`` identifies a source by
content so that registering the same files twice can be recognised.
"""
from __future__ import annotations

import hashlib
from contextlib import closing
from pathlib import Path
from typing import Callable

from registry.errors import InputError, UnknownFormatError
from registry.importers import tabular, tensorboard, trainer_state, verl_file, verl_log
from registry.importers.base import Point, Source
from registry.importers.detect import detect_format

__all__ = ["IMPORTERS", "Point", "Source", "fingerprint", "open_source", "run_paths"]

IMPORTERS: dict[str, Callable[[Path], Source]] = {
    tensorboard.FORMAT: tensorboard.open_tensorboard,
    trainer_state.FORMAT: trainer_state.open_trainer_state,
    verl_log.FORMAT: verl_log.open_verl_log,
    verl_file.FORMAT: verl_file.open_verl_file,
    tabular.CSV_FORMAT: tabular.open_csv,
    tabular.JSONL_FORMAT: tabular.open_jsonl,
}

_CHUNK = 1 << 20


def open_source(path: Path | str, format: str | None = None) -> Source:
    """Open ``path`` with the importer named ``format``, or the one its content calls for.

    Raises UnknownFormatError for an unknown name or unrecognisable content, and
    InputError("no metric points found") for an empty input. Only the first point is
    read here; a problem further into the file surfaces while iterating ``points()``.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    if path.is_file() and _is_blank(path):
        raise InputError("no metric points found (the file is empty)", str(path))
    if format is None:
        format = detect_format(path, list(IMPORTERS))
    elif format not in IMPORTERS:
        raise UnknownFormatError(f"unknown format {format!r}; known formats: {', '.join(IMPORTERS)}", str(path))
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
