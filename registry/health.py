"""Diagnosis of stored runs, and the team's health baselines per task.

``registry.diagnosis`` works on plain curves; this module feeds it from the registry (canonical
curves with sign applied, the dictionary's ranges for the run's task, the run's checkpoints,
the task's stored baseline) and keeps baselines in the ``health_baselines`` table.
"""
from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import select

from .diagnosis import BaselineProfile, Curve, Diagnosis, build_baseline, diagnose, metric_infos_from_definitions
from .errors import InputError, NotFoundError
from .models import HealthBaseline, utcnow
from .store import Registry


def _curves(registry: Registry, run_id: str) -> dict[str, Curve]:
    return {name: Curve(s.steps, s.values) for name, s in registry.canonical_curves(run_id).items()}


def diagnose_run(registry: Registry, run_ref: str, *, use_baseline: bool = True) -> Diagnosis:
    """Diagnose a run on what has arrived so far (it may still be training)."""
    detail = registry.run_detail(run_ref)
    infos = metric_infos_from_definitions(registry.definitions_by_name().values(), detail["task"])
    profile = get_baseline(registry, detail["task"]) if use_baseline and detail["task"] else None
    checkpoints = [c["step"] for c in detail["checkpoints"]]
    return diagnose(_curves(registry, detail["id"]), infos, baseline=profile, checkpoints=checkpoints)


def healthy_runs(registry: Registry, task: str) -> list[dict[str, Any]]:
    """Runs of ``task`` that the team marked healthy: verdict success, or tagged ``healthy``."""
    rows, _ = registry.list_runs(where=f'task="{_quote(task)}" and (verdict=success or tag=healthy)', limit=None)
    return rows


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def build_task_baseline(
    registry: Registry, task: str, run_refs: Sequence[str] | None = None, author: str = "cli"
) -> BaselineProfile:
    """Learn and store the baseline of ``task`` from its healthy runs (or the runs given)."""
    ids = [registry.run_detail(r)["id"] for r in run_refs] if run_refs else [r["id"] for r in healthy_runs(registry, task)]
    if not ids:
        raise InputError(
            f"no healthy runs of task {task!r} to learn from: mark runs with verdict success or tag healthy, "
            "or name the runs"
        )
    profile = build_baseline(task, [_curves(registry, run_id) for run_id in ids])
    save_baseline(registry, profile, ids, author)
    return profile


def save_baseline(registry: Registry, profile: BaselineProfile, source_runs: Sequence[str], author: str) -> None:
    with registry.transaction() as session:
        row = session.get(HealthBaseline, profile.task)
        if row is None:
            row = HealthBaseline(task=profile.task)
            session.add(row)
        row.profile = profile.to_dict()
        row.source_runs = list(source_runs)
        row.updated_at = utcnow()
        row.updated_by = author


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
