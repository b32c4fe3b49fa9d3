"""``rlreg register`` for trackers' stores (MLflow, trackio, W&B) and for ``--recursive`` trees.

Every source goes through ``Registry.register_all``, as a single log does; a store's runs are
each registered in their own transaction. A run imported before is counted as skipped (already
present), a run that fails is reported with its reason and the others still go in. The exit
status is 1 when anything failed.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import click

from registry.cli.output import console, echo_json, err_console, print_registration
from registry.core.errors import AlreadyRegisteredError, InputError, RegistryError, UnknownFormatError
from registry.importers.detect import detect_format
from registry.importers.history import sniff_history
from registry.store.tracker_runs import PartialImportError
from registry.importers import FORMATS, redact_url, tensorboard

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def find_candidates(root: Path) -> Iterator[Path]:
    """Every run source under ``root``: tracker stores, TensorBoard directories, log files.

    A directory that is a run (a W&B run dir, an ``mlruns`` store, a TensorBoard event dir) is
    not descended into. Of a trainer's ``checkpoint-N`` directories only the last is read, and
    none when the output directory has its own ``trainer_state.json`` (each holds the history
    so far: reading them all would register one run many times).
    """

    if _is_run_dir(root, tensorboard):
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        kept = []
        checkpoints = [(int(m.group(1)), d) for d in dirnames if (m := _CHECKPOINT.match(d))]
        last_checkpoint = max(checkpoints)[1] if checkpoints and "trainer_state.json" not in filenames else None
        for name in sorted(dirnames):
            if name.startswith(".") or name == "__pycache__":
                continue
            if _CHECKPOINT.match(name) and name != last_checkpoint:
                continue
            sub = here / name
            if _is_run_dir(sub, tensorboard):
                yield sub
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            file = here / name
            if name.startswith(".") or file.stat().st_size == 0:
                continue
            try:
                if detect_format(file, FORMATS):
                    yield file
            except UnknownFormatError:
                continue
            except InputError:
                yield file  # a damaged store: registering it reports the problem


def _is_run_dir(path: Path, tensorboard: Any) -> bool:
    try:
        return bool(sniff_history(path)) or tensorboard.sniff(path, b"")
    except InputError:
        return False


def register_many(reg: Any, paths: tuple[Path | str, ...], *, fmt: str | None, recursive: bool, as_json: bool,
                  quiet: bool, options: dict[str, Any]) -> None:
    """Register every run in ``paths`` (trees walked with ``recursive``) through ``Registry.register_all``,
    then print the tally: registered, skipped as already present, failed with reasons."""
    candidates: list[Path | str] = []
    for path in paths:
        candidates.extend(find_candidates(path) if recursive and isinstance(path, Path) and path.is_dir()
                          else [path])
    results: list = []
    skipped: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    with _Bar(len(candidates), quiet=quiet or as_json) as advance:
        for path in candidates:
            shown = _shown(path)
            try:
                registered = reg.register_all(path, format=fmt, **options)
            except AlreadyRegisteredError as exc:
                skipped.append((shown, str(exc)))
            except PartialImportError as exc:
                _record(exc.registered, results, skipped, as_json)
                failed.extend(exc.failures)
            except RegistryError as exc:
                failed.append((shown, str(exc)))
            else:
                _record(registered, results, skipped, as_json)
            advance()
    if as_json:
        echo_json({"registered": [r.to_dict() for r in results], "skipped": [{"source": s, "reason": r}
                   for s, r in skipped], "failed": [{"source": s, "error": e} for s, e in failed]})
    else:
        console.print(f"{len(results)} registered, {len(skipped)} skipped as already present, {len(failed)} failed",
                      highlight=False)
        for source, error in failed:
            err_console.print(f"failed: {source}: {error}", markup=False, highlight=False)
    if failed:
        raise click.exceptions.Exit(1)


def _record(registered: list, results: list, skipped: list, as_json: bool) -> None:
    """Count one ``register_all`` answer: its runs, and a store's runs that were already present."""
    results.extend(registered)
    skipped.extend(getattr(registered, "skipped", []))
    if not as_json:
        for result in registered:
            print_registration(result)


def _shown(path: Path | str) -> str:

    return redact_url(path) if isinstance(path, str) else str(path)


class _Bar:
    """One progress bar over the sources found (stderr; silent for --json and non-terminals)."""

    def __init__(self, total: int, quiet: bool):
        self.total = total
        self.quiet = quiet or not err_console.is_terminal

    def __enter__(self):
        if self.quiet:
            return lambda: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("registering"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=err_console, transient=True)
        self._bar.start()
        task = self._bar.add_task("runs", total=self.total)
        return lambda: self._bar.advance(task, 1)

    def __exit__(self, *exc: object) -> None:
        if not self.quiet:
            self._bar.stop()
