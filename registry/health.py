"""Diagnosis of stored runs, and the team's health baselines per task.

``registry.diagnosis`` works on plain curves; this module feeds it from the registry (canonical
curves with sign applied, the dictionary's ranges for the run's task, the run's checkpoints,
the task's stored baseline) and keeps baselines in the ``health_baselines`` table.

Stored findings (``run_findings``, one row per run): the store calls :func:`refresh_findings`
after a registration and when a run finishes, so listings read a summary instead of
diagnosing. A row is fresh while its :class:`Stamp` matches the run's (data version,
dictionary, task baseline, engine version); :func:`findings_for_runs` recomputes a few stale
or missing rows per call within a time budget and reports the others as they are, and
:func:`current_findings` always returns a fresh diagnosis (computing it when needed).
Every path goes through :func:`diagnose_run`, so ``rlreg diagnose`` and the stored rows agree.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import DBAPIError

from registry.db import READ_ONLY_OPTION
from registry.diagnosis import BaselineProfile, Curve, Diagnosis, build_baseline, diagnose, metric_infos_from_definitions
from registry.diagnosis.baseline import MIN_HEALTHY_RUNS, PhaseBand
from registry.diagnosis.hyperparams import settings_for_baseline
from registry.errors import InputError, NotFoundError
from registry.models import HealthBaseline, MetricDefinition, Run, RunFindings, utcnow
from registry.store import Registry

log = logging.getLogger(__name__)

#: Bump when detectors or their settings change: every stored row becomes stale.
DIAGNOSIS_VERSION = 2
#: Severities drawn on the plots and counted as problems.
PROBLEM_SEVERITIES = ("warning", "critical")
#: How long a web request waits for the write lock to store findings (then it skips storing).
QUICK_LOCK_MS = 250
MAX_HISTORY = 200
# Cost model of one diagnosis (2-core development machine), for the runs page's time budget.
DIAGNOSIS_FIXED_S = 0.010
DIAGNOSIS_S_PER_POINT = 0.13e-6


def _curves(registry: Registry, run_id: str) -> dict[str, Curve]:
    return {name: Curve(s.steps, s.values) for name, s in registry.canonical_curves(run_id).items()}


def _definitions(registry: Registry) -> list[dict[str, Any]]:
    """What diagnosis needs of every definition (no aliases: cheaper than ``definitions_by_name``)."""
    D = MetricDefinition
    with registry.read() as session:
        rows = session.execute(select(D.name, D.layer, D.healthy_low, D.healthy_high, D.task_ranges,
                                      D.smoothing_window, D.higher_is_better, D.quantity)).all()
    return [{"name": r.name, "layer": r.layer, "healthy_range": {"low": r.healthy_low, "high": r.healthy_high},
             "task_ranges": dict(r.task_ranges or {}), "smoothing_window": r.smoothing_window,
             "higher_is_better": r.higher_is_better, "quantity": r.quantity} for r in rows]


def diagnose_run(registry: Registry, run_ref: str, *, use_baseline: bool = True,
                 _definitions_cache: list[dict[str, Any]] | None = None) -> Diagnosis:
    """Diagnose a run on what has arrived so far (it may still be training)."""
    detail = registry.run_detail(run_ref)
    defs = _definitions_cache if _definitions_cache is not None else _definitions(registry)
    infos = metric_infos_from_definitions(defs, detail["task"])
    profile = get_baseline(registry, detail["task"]) if use_baseline and detail["task"] else None
    checkpoints = [c["step"] for c in detail["checkpoints"]]
    return diagnose(_curves(registry, detail["id"]), infos, baseline=profile, checkpoints=checkpoints,
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


def dictionary_stamp(session: Any) -> str:
    """Changes with every definition edit (a new version), addition or removal."""
    D = MetricDefinition
    n, total, top = session.execute(
        select(func.count(D.id), func.coalesce(func.sum(D.version), 0), func.coalesce(func.max(D.id), 0))).one()
    return f"{n}.{total}.{top}"


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
            spans.setdefault(f.metric, []).append([int(f.start), int(f.end), f.severity, f.detector])
    return {
        "text": diag.summary(),
        "healthy": diag.healthy,
        "verdict": diag.verdict,
        "lines": [f.summary() for f in diag.findings],
        "spans": spans,
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
    engine = registry.engine
    sqlite = engine.dialect.name == "sqlite"
    ids = [r.run_id for r in records]
    try:
        with engine.connect() as conn:
            if quick and sqlite:
                # Deferred BEGIN and a short busy timeout: wait a moment for a writer, never a minute.
                conn.execution_options(**{READ_ONLY_OPTION: True})
                conn.exec_driver_sql(f"PRAGMA busy_timeout={QUICK_LOCK_MS}")
            elif quick:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{QUICK_LOCK_MS}ms'")
            try:
                have = dict(conn.execute(select(table.c.run_id, table.c.data_version)
                                         .where(table.c.run_id.in_(ids))).all())
                keep = [r for r in records if have.get(r.run_id, -1) <= r.stamp.data_version]
                if keep:
                    conn.execute(delete(table).where(table.c.run_id.in_([r.run_id for r in keep])))
                    conn.execute(insert(table), [r.row() for r in keep])
                conn.commit()
            finally:
                if quick and sqlite:
                    conn.rollback()
                    conn.exec_driver_sql("PRAGMA busy_timeout=60000")
                    conn.rollback()
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
            definitions = _definitions(registry)
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
    from registry.models import Series

    with registry.read() as session:
        rows = session.execute(select(Series.run_id, func.sum(Series.count)).where(
            Series.run_id.in_(list(run_ids)), Series.definition_id.is_not(None)).group_by(Series.run_id))
        return {run_id: int(n or 0) for run_id, n in rows}


# --- baselines ---------------------------------------------------------------------------
def healthy_runs(registry: Registry, task: str) -> list[dict[str, Any]]:
    """Runs of ``task`` that the team marked healthy: verdict success, or tagged ``healthy``."""
    rows, _ = registry.list_runs(where=f'task="{_quote(task)}" and (verdict=success or tag=healthy)', limit=None)
    return rows


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def build_task_baseline(
    registry: Registry, task: str, run_refs: Sequence[str] | None = None, author: str = "cli", *,
    keep_edits: bool = False, note: str = "", allow_weak: bool = False,
) -> BaselineProfile:
    """Learn and store the baseline of ``task`` from its healthy runs (or the runs given).

    At least :data:`MIN_HEALTHY_RUNS` runs are needed; ``allow_weak`` accepts fewer, and the
    profile is then labelled "weak baseline (n=...)" wherever it is used.
    ``keep_edits``: bands and warning texts the team edited by hand since the last build
    that discarded them are applied again on top of the newly learned profile.
    """
    ids = ([registry.run_detail(r)["id"] for r in run_refs] if run_refs
           else [r["id"] for r in healthy_runs(registry, task)])
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise InputError(
            f"no healthy runs of task {task!r} to learn from: mark runs with verdict success or tag healthy, "
            "or name the runs"
        )
    if len(ids) < MIN_HEALTHY_RUNS and not allow_weak:
        raise InputError(
            f"only {len(ids)} healthy run(s) of task {task!r}: a baseline needs at least {MIN_HEALTHY_RUNS} "
            "(mark more runs healthy, or accept a weak baseline explicitly with --allow-weak)"
        )
    details = [registry.run_detail(run_id) for run_id in ids]
    infos = metric_infos_from_definitions(_definitions(registry), task)
    knobs: dict[str, list[float]] = {}
    for d in details:
        for knob, values in settings_for_baseline([d["params"]], d["framework"]).items():
            knobs.setdefault(knob, []).extend(values)
    try:
        profile = build_baseline(task, [_curves(registry, run_id) for run_id in ids], infos=infos,
                                 hyperparams=knobs)
    except ValueError as exc:
        raise InputError(f"cannot learn a baseline of {task!r} from these runs: {exc}") from None
    kept: list[str] = []
    if keep_edits:
        with registry.read() as session:
            row = session.get(HealthBaseline, task)
            history = list((row.profile or {}).get("history") or []) if row else []
        kept = _reapply_edits(profile, history)
    save_baseline(registry, profile, ids, author, note=note, kept_edits=kept)
    return profile


def _pending_edits(history: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
    """(metric, field) -> value of the hand edits still in force (a build without keep_edits resets them)."""
    pending: dict[tuple[str, str], Any] = {}
    for entry in history:
        if entry.get("action") == "build" and not entry.get("keep_edits"):
            pending = {}
        elif entry.get("action") == "edit":
            for f, (_, after) in (entry.get("changes") or {}).items():
                pending[(entry["metric"], f)] = after
    return pending


def _reapply_edits(profile: BaselineProfile, history: Sequence[Mapping[str, Any]]) -> list[str]:
    kept = []
    for (metric, f), value in sorted(_pending_edits(history).items()):
        mb = profile.metrics.get(metric)
        if mb is None:
            continue
        if f == "warning":
            mb.warning = str(value or "")
        elif f in ("early", "mid"):
            setattr(mb, f, _band_from(value, mb.band(f)))
        if metric not in kept:
            kept.append(metric)
    return kept


def _band_from(value: Sequence[float] | None, old: PhaseBand | None) -> PhaseBand | None:
    if value is None:
        return None
    low, high = float(value[0]), float(value[1])
    median = old.median if old is not None and low <= old.median <= high else (low + high) / 2
    return PhaseBand(low, high, median, old.n_points if old is not None else 0)


def _band_value(band: PhaseBand | None) -> list[float] | None:
    return None if band is None else [band.low, band.high]


def save_baseline(registry: Registry, profile: BaselineProfile, source_runs: Sequence[str], author: str, *,
                  note: str = "", kept_edits: Sequence[str] = ()) -> None:
    """Store a (re)learned profile; the row's ``history`` records who built it, when, from how many runs."""
    with registry.transaction() as session:
        row = session.get(HealthBaseline, profile.task)
        history = list((row.profile or {}).get("history") or []) if row is not None else []
        if row is None:
            row = HealthBaseline(task=profile.task)
            session.add(row)
        now = utcnow()
        history.append({"action": "build", "at": now.isoformat(), "author": author, "runs": len(source_runs),
                        "note": note, "keep_edits": bool(kept_edits), "kept": list(kept_edits)})
        row.profile = {**profile.to_dict(), "history": history[-MAX_HISTORY:]}
        row.source_runs = list(source_runs)
        row.updated_at = now
        row.updated_by = author


def edit_baseline_metric(registry: Registry, task: str, metric: str, *, author: str, note: str = "",
                         early: Sequence[float] | None | str = "keep", mid: Sequence[float] | None | str = "keep",
                         warning: str | None = None) -> dict[str, Any] | None:
    """Tune one metric's bands by hand; returns the history entry, or None when nothing changed.

    ``early`` / ``mid``: ``(low, high)``, None to remove the band, or ``"keep"``.
    """
    changes: dict[str, list[Any]] = {}
    with registry.transaction() as session:
        row = session.get(HealthBaseline, task)
        if row is None:
            raise NotFoundError(f"no baseline for task {task!r}")
        profile = BaselineProfile.from_dict(row.profile)
        mb = profile.metrics.get(metric)
        if mb is None:
            raise NotFoundError(f"the {task} baseline has no metric {metric!r}")
        for phase, value in (("early", early), ("mid", mid)):
            if isinstance(value, str):
                continue
            if value is not None:
                low, high = (float(v) for v in value)
                if not (math.isfinite(low) and math.isfinite(high)):
                    raise InputError(f"{phase} band bounds must be finite numbers")
                if low > high:
                    raise InputError(f"{phase} band: low {low:g} is above high {high:g}")
            before = _band_value(mb.band(phase))
            after = None if value is None else [low, high]
            if before != after:
                changes[phase] = [before, after]
                setattr(mb, phase, _band_from(after, mb.band(phase)))
        if warning is not None and warning.strip() != mb.warning:
            changes["warning"] = [mb.warning, warning.strip()]
            mb.warning = warning.strip()
        if not changes:
            return None
        now = utcnow()
        entry = {"action": "edit", "at": now.isoformat(), "author": author, "metric": metric, "note": note,
                 "changes": changes}
        history = list((row.profile or {}).get("history") or []) + [entry]
        row.profile = {**profile.to_dict(), "history": history[-MAX_HISTORY:]}
        row.updated_at = now
        row.updated_by = author
    return entry


def get_baseline(registry: Registry, task: str) -> BaselineProfile | None:
    with registry.read() as session:
        row = session.get(HealthBaseline, task)
        return BaselineProfile.from_dict(row.profile) if row else None


def require_baseline(registry: Registry, task: str) -> tuple[BaselineProfile, dict[str, Any]]:
    with registry.read() as session:
        row = session.get(HealthBaseline, task)
        if row is None:
            known = list(session.scalars(select(HealthBaseline.task)))
            hint = f"; baselines exist for {', '.join(known)}" if known else ""
            raise NotFoundError(f"no baseline for task {task!r} (run `rlreg baseline build {task}`){hint}")
        meta = {"source_runs": row.source_runs, "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by}
        return BaselineProfile.from_dict(row.profile), meta


def get_baseline_meta(registry: Registry, task: str) -> dict[str, Any] | None:
    """Who built or edited the task's baseline and when, from how many runs (None: no baseline)."""
    with registry.read() as session:
        row = session.get(HealthBaseline, task)
        if row is None:
            return None
        return {"updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by,
                "source_runs": len(row.source_runs or []), "metrics": len((row.profile or {}).get("metrics") or {})}


def baseline_history(registry: Registry, task: str) -> list[dict[str, Any]]:
    """Builds and hand edits of a task's baseline, oldest first (empty when there is none)."""
    with registry.read() as session:
        row = session.get(HealthBaseline, task)
        return list((row.profile or {}).get("history") or []) if row else []


def edited_metrics(history: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Metric -> the latest hand edit still in force (for "edited by Ada" marks)."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in history:
        if entry.get("action") == "build" and not entry.get("keep_edits"):
            out = {}
        elif entry.get("action") == "edit":
            out[entry["metric"]] = entry
    return out


def list_baselines(registry: Registry) -> list[dict[str, Any]]:
    """Every stored baseline (task, metrics, runs, who and when) and the tasks that have none yet."""
    with registry.read() as session:
        stored = {row.task: row for row in session.scalars(select(HealthBaseline))}
        tasks = session.execute(select(Run.task, func.count(Run.id)).where(Run.task.is_not(None))
                                .group_by(Run.task)).all()
        out = []
        counts = dict(tasks)
        for task in sorted(set(counts) | set(stored)):
            row = stored.get(task)
            out.append({"task": task, "runs": counts.get(task, 0), "has_baseline": row is not None,
                        "metrics": len((row.profile or {}).get("metrics") or {}) if row else 0,
                        "source_runs": len(row.source_runs or []) if row else 0,
                        "updated_at": row.updated_at.isoformat() if row else None,
                        "updated_by": row.updated_by if row else None})
        return out
