"""The team's health baselines per task: learned from healthy runs, stored with their history, edited band
by band (table ``health_baselines``)."""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

from sqlalchemy import func, select

from registry.analysis.diagnosis import (
    BaselineProfile,
    build_baseline,
    metric_infos_from_definitions,
)
from registry.analysis.diagnosis.baseline import MIN_HEALTHY_RUNS, PHASES, PhaseBand
from registry.analysis.diagnosis.hyperparams import settings_for_baseline
from registry.core.errors import InputError, NotFoundError
from registry.db.models import HealthBaseline, Run, utcnow
from registry.store.facade import Registry
from registry.store.filters import quote_string

from registry.analysis.inputs import diagnosis_definitions, run_curves

log = logging.getLogger(__name__)
MAX_HISTORY = 200


def healthy_runs(registry: Registry, task: str) -> list[dict[str, Any]]:
    """Runs of ``task`` that the team marked healthy: verdict success, or tagged ``healthy``."""
    rows, _ = registry.list_runs(where=f'task="{quote_string(task)}" and (verdict=success or tag=healthy)', limit=None)
    return rows


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
    infos = metric_infos_from_definitions(diagnosis_definitions(registry), task)
    knobs: dict[str, list[float]] = {}
    for d in details:
        for knob, values in settings_for_baseline([d["params"]], d["framework"]).items():
            knobs.setdefault(knob, []).extend(values)
    try:
        profile = build_baseline(task, [run_curves(registry, run_id) for run_id in ids], infos=infos,
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
        elif f in PHASES:
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
                         late: Sequence[float] | None | str = "keep",
                         warning: str | None = None) -> dict[str, Any] | None:
    """Tune one metric's bands by hand; returns the history entry, or None when nothing changed.

    ``early`` / ``mid`` / ``late``: ``(low, high)``, None to remove the band, or ``"keep"``.
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
        for phase, value in (("early", early), ("mid", mid), ("late", late)):
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
