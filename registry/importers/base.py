"""What every importer produces: run metadata plus a stream of points.

An importer never touches the database. It reads a file or directory and yields
``Point`` tuples one at a time, so a large file is held in memory only once (by the
series builder that accumulates the points into arrays).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from registry.core.series import Point


@dataclass
class Source:
    """One run's worth of input, opened by an importer."""

    path: Path
    format: str                              # importer name, e.g. "tensorboard"
    points: Callable[[], Iterator[Point]]    # re-iterable: each call starts a fresh pass
    params: dict[str, Any] = field(default_factory=dict)      # hyperparameters found in the input
    framework: str | None = None             # framework hint found in the input
    algorithm: str | None = None
    name: str | None = None                  # run name hint
    task: str | None = None
    files: list[Path] = field(default_factory=list)  # files read, for the content fingerprint
    # How the input was laid out, recorded on the run: the step column chosen, an envelope
    # stripped from every key (verl's file backend), a partial last line left out.
    layout: dict[str, Any] = field(default_factory=dict)
    # Things skipped without failing (non-numeric values, text columns). Importers that
    # skip while streaming fill this in during a pass over points(), so read it after
    # one full pass; each pass starts it afresh.
    warnings: list[str] = field(default_factory=list)
