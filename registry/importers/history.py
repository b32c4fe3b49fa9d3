"""Which tracker a store belongs to, and its runs: MLflow, trackio and W&B behind one door."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from registry.importers import mlflow, trackio, wandb
from registry.importers.tracker_base import HistoryRun


def iter_history(path: Path, format: str | None = None) -> Iterator[HistoryRun]:
    """The runs of the tracker store at ``path`` (format given or sniffed); nothing if it is not one."""
    readers = {mlflow.FORMAT: mlflow.open_runs, trackio.FORMAT: trackio.open_runs, wandb.FORMAT: wandb.open_runs}
    format = format or sniff_history(path)
    if format is None:
        return iter(())
    return readers[format](path)


def sniff_history(path: Path) -> str | None:
    """``mlflow``, ``trackio`` or ``wandb`` when ``path`` is such a store, else None."""
    for module in (mlflow, trackio, wandb):
        if module.sniff(path):
            return module.FORMAT
    return None


HISTORY_FORMATS = ("mlflow", "trackio", "wandb")
