"""Diagnosis of stored runs: findings computed, stored and kept fresh.

``registry.analysis.diagnosis`` works on plain curves; this module feeds it from the registry (canonical
curves with sign applied, the dictionary's ranges for the run's task, the run's checkpoints,
the task's stored baseline from :mod:`registry.analysis.baselines`).

Stored findings (``run_findings``, one row per run): the store calls :func:`refresh_findings`
after a registration and when a run finishes, so listings read a summary instead of
diagnosing. A row is fresh while its :class:`Stamp` matches the run's (data version,
dictionary, task baseline, engine version); :func:`findings_for_runs` recomputes a few stale
or missing rows per call within a time budget and reports the others as they are, and
:func:`current_findings` always returns a fresh diagnosis (computing it when needed).
Every path goes through :func:`diagnose_run`, so ``rlreg diagnose`` and the stored rows agree.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import DBAPIError

from registry.db.dialect import quick_lock_wait
from registry.analysis.diagnosis import (
    BaselineProfile,
    Diagnosis,
    diagnose,
    metric_infos_from_definitions,
)
from registry.core.errors import NotFoundError
from registry.db.models import HealthBaseline, RunFindings, Series, utcnow
from registry.store.facade import Registry

from registry.analysis.baselines import get_baseline
from registry.analysis.inputs import diagnosis_definitions, run_curves
from registry.analysis.diagnosis.episodes import plotted_metric
from registry.analysis.diagnosis.ranges import FALLBACK_SOURCE, resolve_range
from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS
from registry.dictionary.definitions import dictionary_stamp, healthy_range_for

log = logging.getLogger(__name__)

#: Bump when detectors or their settings change: every stored row becomes stale.
DIAGNOSIS_VERSION = 39
#: Severities drawn on the plots and counted as problems.
PROBLEM_SEVERITIES = ("warning", "critical")
#: How long a web request waits for the write lock to store findings (then it skips storing).
QUICK_LOCK_MS = 250
# Cost model of one diagnosis (2-core development machine), for the runs page's time budget.
DIAGNOSIS_FIXED_S = 0.010
DIAGNOSIS_S_PER_POINT = 0.13e-6


def diagnose_run(registry: Registry, run_ref: str, *, use_baseline: bool = True,
                 _definitions_cache: list[dict[str, Any]] | None = None) -> Diagnosis:
    """Diagnose a run on what has arrived so far (it may still be training)."""
    detail = registry.run_detail(run_ref)
    defs = _definitions_cache if _definitions_cache is not None else diagnosis_definitions(registry)
    infos = metric_infos_from_definitions(defs, detail["task"])
    profile = get_baseline(registry, detail["task"]) if use_baseline and detail["task"] else None
    checkpoints = [c["step"] for c in detail["checkpoints"]]
    return diagnose(run_curves(registry, detail["id"]), infos, baseline=profile, checkpoints=checkpoints,
                    params=detail["params"], framework=detail["framework"])


# --- stored findings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stamp:
    """Everything a run's diagnosis depends on besides its points' content."""

    data_version: int
    dictionary: str
    baseline: str
    engine: int = DIAGNOSIS_VERSION

    def matches(self, row: Any) -> bool:
        return (row.data_version == self.data_version and row.dictionary_stamp == self.dictionary
                and row.baseline_stamp == self.baseline and row.engine_version == self.engine)


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""


def baseline_stamps(session: Any, tasks: Sequence[str | None]) -> dict[str, str]:
    wanted = sorted({t for t in tasks if t})
    if not wanted:
        return {}
    rows = session.execute(select(HealthBaseline.task, HealthBaseline.updated_at)
                           .where(HealthBaseline.task.in_(wanted)))
    return {task: _iso(updated) for task, updated in rows}


@dataclass
class StoredFindings:
    """A run's findings summary as stored (or just computed), and whether it is current.

    ``state``: ``fresh`` (matches the run as it is now), ``stale`` (computed on older data,
    an older dictionary or baseline), ``missing`` (never diagnosed) or ``error``.
    """

    run_id: str
    state: str
    data_version: int | None = None
    worst_severity: str | None = None
    n_info: int = 0
    n_warning: int = 0
    n_critical: int = 0
    last_step: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    diagnosis: dict[str, Any] | None = None
    computed_at: datetime | None = None
    stamp: Stamp | None = None
    error: str | None = None

    @property
    def n_problems(self) -> int:
        return self.n_warning + self.n_critical

    @property
    def lines(self) -> list[str]:
        return list(self.summary.get("lines") or [])

    def spans(self, metric: str | None) -> list[tuple[int, int, str, str]]:
        """The shaded step ranges of ``metric``: (start, end, severity, detector)."""
        if not metric:
            return []
        return [tuple(s) for s in (self.summary.get("spans") or {}).get(metric, [])]  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "state": self.state, "data_version": self.data_version,
            "worst_severity": self.worst_severity, "n_info": self.n_info, "n_warning": self.n_warning,
            "n_critical": self.n_critical, "last_step": self.last_step,
            "computed_at": _iso(self.computed_at) or None, "summary": self.summary.get("text"),
            "lines": self.lines, "error": self.error,
        }

    def row(self) -> dict[str, Any]:
        assert self.stamp is not None
        return {"run_id": self.run_id, "data_version": self.stamp.data_version,
                "dictionary_stamp": self.stamp.dictionary, "baseline_stamp": self.stamp.baseline,
                "engine_version": self.stamp.engine, "worst_severity": self.worst_severity,
                "n_info": self.n_info, "n_warning": self.n_warning, "n_critical": self.n_critical,
                "last_step": self.last_step, "summary": self.summary, "diagnosis": self.diagnosis or {},
                "computed_at": self.computed_at}


def summarize_diagnosis(diag: Diagnosis) -> dict[str, Any]:
    """The small part of a diagnosis a table cell or a plot needs."""
    spans: dict[str, list[list[Any]]] = {}
    for f in diag.findings:
        if f.severity in PROBLEM_SEVERITIES:
            spans.setdefault(plotted_metric(diag.derived, f.metric), []).append([int(f.start), int(f.end), f.severity, f.detector])
    return {
        "text": diag.summary(),
        "healthy": diag.healthy,
        "verdict": diag.verdict,
        "lines": [f.summary() for f in diag.findings],
        "spans": spans,
        # Each metric's healthy range as the diagnosis resolved it (the plots draw these).
        "ranges": {k: dict(v) for k, v in diag.ranges.items()},
        "metrics_checked": len(diag.metrics_checked),
        "rollback_step": diag.rollback_step,
        "baseline_task": diag.baseline_task,
    }


def _record(run_id: str, stamp: Stamp, diag: Diagnosis) -> StoredFindings:
    sev = [f.severity for f in diag.findings]
    return StoredFindings(
        run_id=run_id, state="fresh", data_version=stamp.data_version, worst_severity=diag.worst_severity,
        n_info=sev.count("info"), n_warning=sev.count("warning"), n_critical=sev.count("critical"),
        last_step=diag.last_step, summary=summarize_diagnosis(diag), diagnosis=diag.to_dict(),
        computed_at=utcnow(), stamp=stamp)


def _from_row(row: Any, stamp: Stamp | None, with_diagnosis: bool = True) -> StoredFindings:
    state = "fresh" if stamp is not None and stamp.matches(row) else "stale"
    return StoredFindings(
        run_id=row.run_id, state=state, data_version=row.data_version, worst_severity=row.worst_severity,
        n_info=row.n_info, n_warning=row.n_warning, n_critical=row.n_critical, last_step=row.last_step,
        summary=dict(row.summary or {}), diagnosis=dict(row.diagnosis or {}) if with_diagnosis else None,
        computed_at=row.computed_at,
        stamp=Stamp(row.data_version, row.dictionary_stamp, row.baseline_stamp, row.engine_version))


def _run_stamp(session: Any, run_id: str, data_version: int, task: str | None) -> Stamp:
    return Stamp(data_version, dictionary_stamp(session), baseline_stamps(session, [task]).get(task or "", ""))


def _compute(registry: Registry, run_id: str, stamp: Stamp,
             definitions: list[dict[str, Any]] | None = None) -> StoredFindings:
    diag = diagnose_run(registry, run_id, _definitions_cache=definitions)
    return _record(run_id, stamp, diag)


def store_findings(registry: Registry, records: Sequence[StoredFindings], *, quick: bool = False) -> bool:
    """Write computed findings (replacing older rows; a row of newer data is kept).

    ``quick``: a web request's write, which gives up after ``QUICK_LOCK_MS`` when another
    transaction holds the lock (the rows are then computed again later). Returns whether
    the rows were written.
    """
    records = [r for r in records if r.stamp is not None]
    if not records:
        return True
    table = RunFindings.__table__
    ids = [r.run_id for r in records]
    try:
        with registry.engine.connect() as conn, \
                (quick_lock_wait(conn, QUICK_LOCK_MS) if quick else contextlib.nullcontext()):
            have = dict(conn.execute(select(table.c.run_id, table.c.data_version)
                                     .where(table.c.run_id.in_(ids))).all())
            keep = [r for r in records if have.get(r.run_id, -1) <= r.stamp.data_version]
            if keep:
                conn.execute(delete(table).where(table.c.run_id.in_([r.run_id for r in keep])))
                conn.execute(insert(table), [r.row() for r in keep])
            conn.commit()
    except DBAPIError as exc:  # locked, a run deleted meanwhile, a concurrent writer of the same row
        log.info("findings of %d run(s) not stored: %s", len(records), exc.__class__.__name__)
        return False
    return True


def refresh_findings(registry: Registry, run_ref: str) -> StoredFindings:
    """Diagnose a run now and store the summary (the store calls this after a registration or a finish)."""
    with registry.read() as session:
        run = registry.resolve_run(session, run_ref)
        run_id = run.id
        stamp = _run_stamp(session, run.id, run.data_version, run.task)
    record = _compute(registry, run_id, stamp)
    store_findings(registry, [record])
    _remember(registry, record)
    return record


# Recently computed records, so a request whose write was refused (locked) does not diagnose again.
_RECENT: dict[tuple[str, str], StoredFindings] = {}
_RECENT_MAX = 512
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_GUARD = threading.Lock()


def _remember(registry: Registry, record: StoredFindings) -> None:
    with _GUARD:
        if len(_RECENT) >= _RECENT_MAX:
            _RECENT.clear()
        _RECENT[(registry.url, record.run_id)] = record


def _recent(registry: Registry, run_id: str, stamp: Stamp) -> StoredFindings | None:
    with _GUARD:
        rec = _RECENT.get((registry.url, run_id))
    return rec if rec is not None and rec.stamp == stamp else None


def _lock_for(registry: Registry, run_id: str) -> threading.Lock:
    with _GUARD:
        if len(_LOCKS) > 4096:
            _LOCKS.clear()
        return _LOCKS.setdefault((registry.url, run_id), threading.Lock())


def current_findings(registry: Registry, run_ref: str, *, data_version: int | None = None,
                     task: str | None = None) -> StoredFindings:
    """The run's findings as of its data now: the stored row when fresh, else diagnosed (and stored).

    ``data_version`` and ``task`` may be passed when the caller has the run at hand (the
    dashboard); the run is then not looked up again. Concurrent callers for one run (the
    dashboard's plot images) diagnose it once.
    """
    with registry.read() as session:
        if data_version is None:
            run = registry.resolve_run(session, run_ref)
            run_id, data_version, task = run.id, run.data_version, run.task
        else:
            run_id = run_ref
        stamp = _run_stamp(session, run_id, data_version, task)
        row = session.get(RunFindings, run_id)
        if row is not None and stamp.matches(row):
            return _from_row(row, stamp)
    with _lock_for(registry, run_id):
        hit = _recent(registry, run_id, stamp)
        if hit is not None:
            return hit
        with registry.read() as session:  # another thread may have stored it while we waited
            row = session.get(RunFindings, run_id)
            if row is not None and stamp.matches(row):
                return _from_row(row, stamp)
        record = _compute(registry, run_id, stamp)
        store_findings(registry, [record], quick=True)
        _remember(registry, record)
        return record


def findings_for_runs(registry: Registry, runs: Sequence[Mapping[str, Any]], *, refresh: int = 3,
                      budget_s: float = 0.06) -> dict[str, StoredFindings]:
    """Findings of a page of runs (``list_runs`` rows): stored rows, a few recomputed.

    At most ``refresh`` missing or stale rows are diagnosed (missing first, in page order),
    each only if its estimated cost (:func:`estimated_seconds`, from the run's point count)
    still fits in ``budget_s``; the others come back as they are (``stale`` or ``missing``)
    for the page to say so.
    """
    if not runs:
        return {}
    ids = [r["id"] for r in runs]
    C = RunFindings
    with registry.read() as session:
        dict_stamp = dictionary_stamp(session)
        bstamps = baseline_stamps(session, [r.get("task") for r in runs])
        rows = {row.run_id: row for row in session.execute(
            select(C.run_id, C.data_version, C.dictionary_stamp, C.baseline_stamp, C.engine_version,
                   C.worst_severity, C.n_info, C.n_warning, C.n_critical, C.last_step, C.summary, C.computed_at)
            .where(C.run_id.in_(ids)))}
    out: dict[str, StoredFindings] = {}
    todo: list[tuple[int, str, Stamp]] = []
    for pos, r in enumerate(runs):
        stamp = Stamp(int(r["data_version"]), dict_stamp, bstamps.get(r.get("task") or "", ""))
        row = rows.get(r["id"])
        if row is None:
            out[r["id"]] = _recent(registry, r["id"], stamp) or StoredFindings(r["id"], "missing")
        else:
            out[r["id"]] = _recent(registry, r["id"], stamp) or _from_row(row, stamp, with_diagnosis=False)
        if out[r["id"]].state != "fresh":
            todo.append((0 if row is None else 1, r["id"], stamp))
    todo.sort(key=lambda t: t[0])
    start = time.perf_counter()
    computed: list[StoredFindings] = []
    definitions = None
    points = _mapped_points(registry, [run_id for _, run_id, _ in todo]) if todo and refresh > 0 else {}
    attempts = 0
    for _, run_id, stamp in todo:
        if attempts >= refresh:
            break
        # Never start a diagnosis the budget cannot afford (a long run is diagnosed by its dashboard).
        if time.perf_counter() - start + estimated_seconds(points.get(run_id, 0)) > budget_s:
            continue
        attempts += 1
        if definitions is None:
            definitions = diagnosis_definitions(registry)
        try:
            rec = _compute(registry, run_id, stamp, definitions)
        except NotFoundError:
            continue  # deleted meanwhile
        except Exception as exc:  # noqa: BLE001 - one odd run must not break a listing
            log.warning("diagnosis of run %s failed: %s", run_id, exc)
            out[run_id] = StoredFindings(run_id, "error", error=str(exc))
            continue
        out[run_id] = rec
        computed.append(rec)
        _remember(registry, rec)
    if computed:
        store_findings(registry, computed, quick=True)
    return out


def estimated_seconds(points: int) -> float:
    """What diagnosing a run of ``points`` mapped points costs (measured: ~10 ms + ~0.13 ms per 1,000 points)."""
    return DIAGNOSIS_FIXED_S + points * DIAGNOSIS_S_PER_POINT


def _mapped_points(registry: Registry, run_ids: Sequence[str]) -> dict[str, int]:
    with registry.read() as session:
        rows = session.execute(select(Series.run_id, func.sum(Series.count)).where(
            Series.run_id.in_(list(run_ids)), Series.definition_id.is_not(None)).group_by(Series.run_id))
        return {run_id: int(n or 0) for run_id, n in rows}


def definition_ranges(registry: Registry, definition: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every range the diagnosis may judge metric ``definition`` by, with where it comes from.

    Rows ``{"scope", "low", "high", "source", "applies"}``: the dictionary's range for any task,
    its task ranges, a range learned from each task's baseline (applies only where the dictionary
    gives that task none), and the diagnosis' default (applies where nothing else does). The
    same lookup (:func:`registry.analysis.diagnosis.ranges.resolve_range`) decides per run.
    """
    name = str(definition["name"])
    general = definition.get("healthy_range") or {}
    task_ranges = definition.get("task_ranges") or {}
    rows = [{"scope": "any task", "low": general.get("low"), "high": general.get("high"),
             "source": "dictionary: healthy range", "applies": "every task without a range of its own"}]
    for task, r in sorted(task_ranges.items()):
        rows.append({"scope": task, "low": r.get("low"), "high": r.get("high"),
                     "source": r.get("source") or f"dictionary: task range for {task}", "applies": f"runs of {task}"})
    with registry.read() as session:
        stored = [(row.task, row.profile) for row in session.scalars(select(HealthBaseline).order_by(HealthBaseline.task))]
    for task, profile in stored:
        if healthy_range_for(definition, task) != (None, None):
            continue                      # the dictionary's range wins for this task
        r = resolve_range(name, None, BaselineProfile.from_dict(profile), DEFAULT_SETTINGS,
                          definition.get("quantity"))
        if r is not None and r["source"] != FALLBACK_SOURCE:
            rows.append({"scope": task, "low": r["low"], "high": r["high"], "source": r["source"],
                         "applies": f"runs of {task} (no dictionary range for it)"})
    low, high = DEFAULT_SETTINGS.fallback_ranges.get(name, (None, None))
    if low is not None or high is not None:
        rows.append({"scope": "diagnosis default", "low": low, "high": high, "source": FALLBACK_SOURCE,
                     "applies": "runs for which neither the dictionary nor a baseline gives a range"})
    return rows
