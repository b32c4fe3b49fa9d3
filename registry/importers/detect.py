"""Which importer reads a path, decided by looking at its content.

Content comes first so a CSV saved as ``.txt`` or a JSON Lines file saved as ``.json``
is still read right; the extension only breaks ties afterwards, so that a damaged
``run.csv`` is reported by the CSV importer ("no step column") instead of as an
unknown format.

Trackers' stores (an MLflow database or ``mlruns/``, a trackio database, a W&B run directory,
``.wandb`` log or Parquet export) are tried before the logs, so a W&B run directory that also
holds TensorBoard files is read as the W&B run, with its config and summary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from registry.core.errors import UnknownFormatError
from registry.importers import tabular, tensorboard, trainer_state, verl_file, verl_log, mlflow, trackio, wandb
from registry.importers.textio import read_head

# In the order they are tried; cheap checks on the head before the verl log scan.
SNIFFERS: tuple[tuple[str, Callable[[Path, bytes], bool]], ...] = (
    (mlflow.FORMAT, lambda path, head: mlflow.sniff(path)),
    (trackio.FORMAT, lambda path, head: trackio.sniff(path)),
    (wandb.FORMAT, lambda path, head: wandb.sniff(path)),
    (tensorboard.FORMAT, tensorboard.sniff),
    (trainer_state.FORMAT, trainer_state.sniff),
    (verl_file.FORMAT, verl_file.sniff),
    (tabular.JSONL_FORMAT, tabular.sniff_jsonl),
    (tabular.CSV_FORMAT, tabular.sniff_csv),
    (verl_log.FORMAT, verl_log.sniff),
)
_BY_EXTENSION = {
    ".csv": tabular.CSV_FORMAT,
    ".jsonl": tabular.JSONL_FORMAT,
    ".ndjson": tabular.JSONL_FORMAT,
}


def detect_format(path: Path, known: list[str]) -> str:
    """The format name for ``path``; UnknownFormatError listing ``known`` if none fits."""
    head = b"" if path.is_dir() else read_head(path)
    for name, sniff in SNIFFERS:
        if sniff(path, head):
            return name
    if path.is_file() and path.suffix.lower() in _BY_EXTENSION:
        return _BY_EXTENSION[path.suffix.lower()]
    what = "directory" if path.is_dir() else "file"
    raise UnknownFormatError(
        f"cannot tell what kind of {what} this is; known formats: {', '.join(known)} "
        "(pass the format explicitly if it is one of them)",
        str(path),
    )
