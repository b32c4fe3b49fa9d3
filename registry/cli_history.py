"""``rlreg register`` for trackers' stores (MLflow, trackio, W&B) and for ``--recursive`` trees.

Each run found is registered in its own transaction; a run imported before is counted as
skipped (already present), a run that fails is reported with its reason and the others still
go in. The exit status is 1 when anything failed.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import click

from registry.cli import console, echo_json, err_console
from registry.errors import AlreadyRegisteredError, InputError, RegistryError, UnknownFormatError
from registry.importers.detect import detect_format
from registry.importers.history import HistoryRun, iter_history, register_history, sniff_history

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def find_candidates(root: Path) -> Iterator[Path]:
    """Every run source under ``root``: tracker stores, TensorBoard directories, log files.

    A directory that is a run (a W&B run dir, an ``mlruns`` store, a TensorBoard event dir) is
    not descended into. Of a trainer's ``checkpoint-N`` directories only the last is read, and
    none when the output directory has its own ``trainer_state.json`` (each holds the history
    so far: reading them all would register one run many times).
    """
    from registry.importers import IMPORTERS, tensorboard

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
                if sniff_history(file) or detect_format(file, list(IMPORTERS)):
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


def register_many(reg: Any, paths: tuple[Path, ...], *, fmt: str | None, recursive: bool, as_json: bool,
                  quiet: bool, options: dict[str, Any]) -> None:
    """Register every run in ``paths`` (trees walked with ``recursive``), then print the tally."""
    candidates: list[Path] = []
    for path in paths:
        candidates.extend(find_candidates(path) if recursive and path.is_dir() else [path])
    results, skipped, failed = [], [], []
    with _Bar(len(candidates), quiet=quiet or as_json) as advance:
        for path in candidates:
            try:
                history_format = fmt if fmt in ("mlflow", "trackio", "wandb") else \
                    (None if fmt else sniff_history(path))
                if history_format:
                    for run in iter_history(path, history_format):
                        _one_history_run(reg, run, options, results, skipped, failed, as_json)
                else:
                    _one_file(reg, path, fmt, options, results, skipped, failed, as_json)
            except RegistryError as exc:
                failed.append((str(path), str(exc)))
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


def _one_history_run(reg: Any, run: HistoryRun, options: dict[str, Any], results: list, skipped: list,
                     failed: list, as_json: bool) -> None:
    from registry.cli import _print_registration

    history_options = {k: v for k, v in options.items() if k in (
        "name", "project", "algorithm", "framework", "task", "params", "tags", "code_version", "semantics")}
    try:
        result = register_history(reg, run, **history_options)
    except AlreadyRegisteredError as exc:
        skipped.append((run.label, str(exc)))
        return
    except RegistryError as exc:
        failed.append((run.label, str(exc)))
        return
    results.append(result)
    if not as_json:
        _print_registration(result)


def _one_file(reg: Any, path: Path, fmt: str | None, options: dict[str, Any], results: list, skipped: list,
              failed: list, as_json: bool) -> None:
    from registry.cli import _print_registration

    file_options = {k: v for k, v in options.items() if k in (
        "name", "project", "algorithm", "framework", "task", "params", "tags", "code_version", "semantics")}
    try:
        result = reg.register(path, format=fmt, status=options.get("status", "finished"),
                              on_disorder=options["on_disorder"], replace=options["replace"], **file_options)
    except AlreadyRegisteredError as exc:
        skipped.append((str(path), str(exc)))
        return
    except RegistryError as exc:
        failed.append((str(path), str(exc)))
        return
    results.append(result)
    if not as_json:
        _print_registration(result)


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
