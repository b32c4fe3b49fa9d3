"""Registering a tracker's store (MLflow, trackio, W&B) through ``Registry.register`` / ``register_all``.

A store holds many runs, each with the tracker's own run id, so it is registered run by run:
each in its own transaction, keyed by ``"<format>:<run id>"`` (see ``HistoryRun.fingerprint``).
Importing a store again registers only the runs that are missing: those already present are
skipped, not an error. A run that cannot be read (a partially written database, a truncated
Parquet file) does not stop the others; the runs registered stay, each whole, and the import
ends with a :class:`PartialImportError` naming the store, the runs that failed and why, and the
runs that were registered.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from sqlalchemy import select

from registry.core.errors import AlreadyRegisteredError, InputError, RegistryError
from registry.db.models import Run
from registry.importers.params import merge_params
from registry.importers.tracker_base import HistoryRun
from registry.importers import HISTORY_FORMATS, is_database_url, redact_url
from registry.importers.history import iter_history, sniff_history

if TYPE_CHECKING:
    from registry.store.facade import RegistrationResult, Registry

# The registration options that apply to a tracker's run; the others (status, on_disorder) are the
# tracker's own: a run keeps the status its tracker recorded, and its points come sorted by step.
RUN_OPTIONS = ("project", "algorithm", "framework", "task", "params", "tags", "code_version", "semantics")


class Registrations(list):
    """The runs a call registered (a list of RegistrationResult); for a store's runs that were already
    present, ``skipped`` holds ``(run, reason)`` and ``present`` the registry's ``(run id, run name)``."""

    def __init__(self, results: Iterable[RegistrationResult] = ()):
        super().__init__(results)
        self.skipped: list[tuple[str, str]] = []
        self.present: list[tuple[str, str]] = []


class PartialImportError(InputError):
    """Some runs of a store could not be registered; ``registered`` and ``skipped`` say what the
    import did with the others, ``failures`` lists ``(run, reason)`` for each run that failed."""

    def __init__(self, source: str, registered: Registrations, failures: list[tuple[str, str]]):
        self.registered = registered
        self.skipped = registered.skipped
        self.failures = failures
        done = ", ".join(f"{r.name!r} ({r.run_id[:12]})" for r in registered[:10])
        more = f" and {len(registered) - 10} more" if len(registered) > 10 else ""
        kept = (f"registered {len(registered)} run(s), kept: {done}{more}" if registered
                else "registered nothing")
        present = f"; {len(self.skipped)} already present" if self.skipped else ""
        reasons = "; ".join(f"{run}: {reason}" for run, reason in failures[:3])
        super().__init__(f"{len(failures)} run(s) could not be registered ({reasons}); {kept}{present}. "
                         "Importing the store again registers only what is missing.", source)


def store_format(path: Path | str, format: str | None) -> str | None:
    """``mlflow``, ``trackio`` or ``wandb`` when ``path`` is to be read as that tracker's store (named by
    ``format``, a database URL, or sniffed: cheap checks of headers and directory listings), else None."""

    if is_database_url(path):
        if format not in (None, "mlflow"):
            raise InputError(f"a database URL is read as an MLflow tracking database, not as {format!r}",
                             redact_url(str(path)))
        return "mlflow"
    if format is not None:
        return format if format in HISTORY_FORMATS else None
    path = Path(path)
    if not path.exists():
        return None  # the log importers report it
    return sniff_history(path)


def register_store(registry: Registry, path: Path | str, format: str, *, name: str | None = None,
                   replace: bool = False, progress: Callable[[int], None] | None = None,
                   **options: Any) -> Registrations:
    """Register every run of a tracker's store; the runs already present are skipped.

    ``name`` applies only to a store of one run. Raises PartialImportError (after registering
    every readable run) when some runs fail, and InputError when the store's list of runs
    cannot be read (nothing is registered then).
    """
    runs = open_store(path, format)
    if name is not None and len(runs) > 1:
        raise InputError(f"a run name applies to one run; this store holds {len(runs)} (register it without a "
                         "name: each run keeps its own)", _shown(path))
    out = Registrations()
    failures: list[tuple[str, str]] = []
    for run in runs:
        try:
            result = _register_history(registry, run, name=name, replace=replace, **_run_options(options))
        except AlreadyRegisteredError as exc:
            out.skipped.append((run.label, str(exc)))
            out.present.append((exc.run_id, exc.run_name))
            continue
        except RegistryError as exc:
            failures.append((run.label, str(exc)))
            continue
        out.append(result)
        if progress is not None:
            progress(result.point_count)
    if failures:
        raise PartialImportError(_shown(path), out, failures)
    return out


def open_store(path: Path | str, format: str) -> list[HistoryRun]:
    """The runs of the tracker store at ``path`` (a path or an MLflow database URL); InputError naming
    the store, and saying that nothing was registered, when its list of runs cannot be read."""

    try:
        runs = list(iter_history(path if isinstance(path, str) and "://" in path else Path(path), format))
    except InputError as exc:
        raise InputError(f"{exc.reason}; nothing was registered", exc.source, exc.position) from None
    if not runs:
        raise InputError(f"no runs found in this {format} store", _shown(path))
    return runs


def register_store_run(registry: Registry, path: Path | str, format: str, *, name: str | None = None,
                       replace: bool = False, progress: Callable[[int], None] | None = None,
                       **options: Any) -> RegistrationResult:
    """Register the one run of a tracker's store (``Registry.register``'s contract: AlreadyRegisteredError
    when it was registered before). A store of several runs is an InputError pointing to register_all."""
    runs = open_store(path, format)
    if len(runs) > 1:
        names = ", ".join(repr(r.name) for r in runs[:5]) + (", ..." if len(runs) > 5 else "")
        raise InputError(f"this {format} store holds {len(runs)} runs ({names}): register_all (or rlreg "
                         "register) registers each", _shown(path))
    result = _register_history(registry, runs[0], name=name, replace=replace, **_run_options(options))
    if progress is not None:
        progress(result.point_count)
    return result


def _register_history(registry: Registry, run: HistoryRun, *, name: str | None = None, project: str | None = None,
                     algorithm: str | None = None, framework: str | None = None, task: str | None = None,
                     params: Mapping[str, Any] | None = None, tags: list[str] | None = None,
                     code_version: str | None = None, semantics: Mapping[str, Mapping[str, Any]] | None = None,
                     replace: bool = False):
    """Register one tracker run (one transaction); AlreadyRegisteredError if it was imported before,
    unless ``replace``: then the earlier run is deleted in the same transaction."""
    with registry.read() as session:
        previous = session.scalar(select(Run).where(Run.source_fingerprint == run.fingerprint))
        if previous is not None and not replace:
            raise AlreadyRegisteredError(previous.id, previous.name)
    data = run.load()
    if not data:
        raise InputError(f"run {run.key}: no metric points found", str(run.path))
    result = registry.register_arrays(
        name or run.name, data, status=run.status, semantics=semantics,
        outcome={"scores": run.scores} if run.scores else None,
        project=project if project not in (None, "default") else (run.project or "default"),
        algorithm=algorithm, framework=framework or run.framework, task=task,
        params=merge_params(dict(run.params), dict(params or {})),
        tags=list(dict.fromkeys([*run.tags, *(tags or [])])), code_version=code_version,
        source_format=run.format, source_path=str(run.path), source_fingerprint=run.fingerprint,
        replace=replace,
    )
    result.warnings = list(run.warnings)
    return result


def _run_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in RUN_OPTIONS}


def _shown(path: Path | str) -> str:

    return redact_url(path) if isinstance(path, str) and "://" in path else str(path)
