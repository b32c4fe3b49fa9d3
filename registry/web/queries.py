"""Read-only lookups the pages need that the Registry API has no method for (yet).

Each takes the :class:`~registry.store.facade.Registry` and reads through its session; none
writes. Candidates for moving into ``registry.store.facade`` later.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sqlalchemy import distinct, func, select

from registry.dictionary.definitions import definition_to_dict, get_definition
from registry.core.errors import NotFoundError
from registry.db.models import MetricDefinition, Run, Series
from registry.store.facade import Registry
from registry.store.reader import CANONICAL_ORDER, find_series


@dataclass
class SeriesRef:
    """What a plot of one series depends on: enough to build its cache key without reading points."""

    run_id: str
    run_name: str
    data_version: int
    task: str | None
    key: str
    sign: float
    semantics: dict[str, Any]
    count: int
    definition_name: str | None      # canonical name, None when unmapped
    definition_version: int | None   # current version of that definition
    _definition: dict[str, Any] | None = None

    def definition(self, registry: Registry) -> dict[str, Any] | None:
        """The current definition (healthy range, smoothing default); read only when a plot is drawn."""
        if self.definition_name is None:
            return None
        if self._definition is None:
            self._definition = definition_summaries(registry, [self.definition_name]).get(self.definition_name)
        return self._definition


_SERIES_REF_COLUMNS = (Run.id, Run.name, Run.data_version, Run.task, Series.key, Series.sign, Series.semantics,
                       Series.count, MetricDefinition.name, MetricDefinition.version)


def series_ref(registry: Registry, run_ref: str, key: str) -> SeriesRef:
    """Resolve a run and one of its series by raw key (or canonical name); NotFoundError if absent.

    The common case (run id and raw key, as the dashboard's image URLs give them) is one query.
    """
    with registry.read() as session:
        base = (
            select(*_SERIES_REF_COLUMNS).select_from(Series).join(Run, Series.run_id == Run.id)
            .outerjoin(MetricDefinition, Series.definition_id == MetricDefinition.id)
        )
        row = session.execute(base.where(Series.run_id == run_ref, Series.key == key)).first()
        if row is None:
            run = registry.resolve_run(session, run_ref)
            series = find_series(session, run.id, key)
            if series is None:
                raise NotFoundError(f"run {run.name!r} has no metric {key!r}")
            row = session.execute(base.where(Series.id == series.id)).first()
        run_id, run_name, data_version, task, skey, sign, semantics, count, dname, dversion = row
        return SeriesRef(
            run_id=run_id, run_name=run_name, data_version=data_version, task=task, key=skey, sign=sign,
            semantics=dict(semantics or {}), count=count, definition_name=dname, definition_version=dversion,
        )


def run_stamps(registry: Registry, run_ids: Sequence[str]) -> dict[str, int]:
    """``data_version`` of each run (for cache keys)."""
    with registry.read() as session:
        rows = session.execute(select(Run.id, Run.data_version).where(Run.id.in_(list(run_ids))))
        return {rid: version for rid, version in rows}


def definition_versions(registry: Registry, names: Sequence[str] | None = None) -> dict[str, int]:
    with registry.read() as session:
        query = select(MetricDefinition.name, MetricDefinition.version)
        if names:
            query = query.where(MetricDefinition.name.in_(list(names)))
        return {name: version for name, version in session.execute(query)}


def last_values(registry: Registry, run_ids: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each run, its mapped metrics' last values in canonical sign: ``{run: {name: {...}}}``.

    Reads summary columns only (no points). When two raw keys bind to one definition, the
    one with more points wins, as in ``Registry.canonical_curves``.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {rid: {} for rid in run_ids}
    if not run_ids:
        return out
    with registry.read() as session:
        rows = session.execute(
            select(Series.run_id, MetricDefinition.name, MetricDefinition.layer, Series.key, Series.last_value,
                   Series.sign, Series.count, Series.last_step)
            .join(MetricDefinition, Series.definition_id == MetricDefinition.id)
            .where(Series.run_id.in_(list(run_ids)))
            .order_by(Series.run_id, *CANONICAL_ORDER)
        )
        for run_id, name, layer, key, last, sign, count, last_step in rows:
            per_run = out.setdefault(run_id, {})
            if name in per_run:
                continue
            per_run[name] = {
                "value": None if last is None else last * sign, "key": key, "layer": layer, "count": count,
                "last_step": last_step,
            }
    return out


def distinct_values(registry: Registry, column: str, limit: int = 200) -> list[str]:
    """Distinct non-empty values of a run column (project, algorithm, ...) for filter menus."""
    col = {"project": Run.project, "algorithm": Run.algorithm, "framework": Run.framework, "task": Run.task}[column]
    with registry.read() as session:
        rows = session.scalars(select(col).distinct().where(col.is_not(None)).order_by(col).limit(limit))
        return [r for r in rows if r]


def definition_usage(registry: Registry) -> dict[str, int]:
    """Number of runs with at least one series bound to each definition."""
    with registry.read() as session:
        rows = session.execute(
            select(MetricDefinition.name, func.count(distinct(Series.run_id)))
            .join(Series, Series.definition_id == MetricDefinition.id)
            .group_by(MetricDefinition.name)
        )
        return {name: n for name, n in rows}


def runs_using(registry: Registry, name: str, limit: int = 100) -> tuple[list[dict[str, Any]], int]:
    """Runs that have a series bound to definition ``name`` (newest first), and their total count."""
    with registry.read() as session:
        defn = get_definition(session, name)
        total = session.scalar(
            select(func.count(distinct(Series.run_id))).where(Series.definition_id == defn.id)
        ) or 0
        rows = session.execute(
            select(Run.id, Run.name, Run.project, Run.algorithm, Run.framework, Run.task, Run.verdict,
                   Series.key, Series.alias_framework, Series.semantics, Series.count, Series.last_value, Series.sign)
            .join(Series, Series.run_id == Run.id)
            .where(Series.definition_id == defn.id)
            .order_by(Run.created_at.desc(), Run.id, Series.key)
            .limit(limit)
        ).all()
        return [
            {
                "id": r.id, "name": r.name, "project": r.project, "algorithm": r.algorithm,
                "framework": r.framework, "task": r.task, "verdict": r.verdict, "key": r.key,
                "alias_framework": r.alias_framework, "semantics": dict(r.semantics or {}), "count": r.count,
                "last": None if r.last_value is None else r.last_value * r.sign,
            }
            for r in rows
        ], total


def definition_history(registry: Registry, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A definition (document form plus version metadata) and its versions, newest first.

    Each version lists the fields it changed with their value before and after.
    """
    with registry.read() as session:
        defn = get_definition(session, name)
        current = definition_to_dict(defn)
        current["version"] = defn.version
        current["updated_at"] = defn.updated_at
        current["updated_by"] = defn.updated_by
        versions = []
        previous: dict[str, Any] | None = None
        for v in sorted(defn.versions, key=lambda v: v.version):
            snapshot = dict(v.snapshot or {})
            changes = []
            for f in v.changed_fields or []:
                changes.append({
                    "field": f,
                    "before": None if previous is None else previous.get(f),
                    "after": snapshot.get(f),
                })
            versions.append({
                "version": v.version, "author": v.author, "note": v.change_note, "created_at": v.created_at,
                "changed_fields": list(v.changed_fields or []), "changes": changes, "initial": previous is None,
            })
            previous = snapshot
        versions.reverse()
        return current, versions


def definition_summaries(registry: Registry, names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Definitions without aliases (cheap): what tables and plot captions need."""
    with registry.read() as session:
        query = select(MetricDefinition).order_by(MetricDefinition.layer, MetricDefinition.name)
        if names is not None:
            if not names:
                return {}
            query = query.where(MetricDefinition.name.in_(list(names)))
        out = {}
        for d in session.scalars(query):
            out[d.name] = {
                "name": d.name, "display_name": d.display_name, "layer": d.layer, "quantity": d.quantity,
                "description": d.description, "unit": d.unit, "higher_is_better": d.higher_is_better,
                "averaging": d.averaging, "kl_estimator": d.kl_estimator,
                "normalization_axis": d.normalization_axis, "logging_point": d.logging_point,
                "healthy_range": {"low": d.healthy_low, "high": d.healthy_high},
                "task_ranges": dict(d.task_ranges or {}), "smoothing_window": d.smoothing_window,
                "version": d.version,
            }
        return out


class RefMemo:
    """Series lookups the dashboard just made, kept for a couple of seconds.

    A dashboard page resolves every series it shows (run ``data_version``, definition
    version) and puts the results here; the image requests that follow within ``ttl``
    seconds build their cache keys from these instead of asking the database again. A
    plot is therefore at most ``ttl`` seconds behind the page that linked it.
    """

    def __init__(self, ttl: float = 2.0, max_entries: int = 4096):
        import threading

        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[float, SeriesRef]] = {}
        self._lock = threading.Lock()

    def put(self, refs: Sequence[SeriesRef]) -> None:
        import time

        if self.ttl <= 0:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._entries) + len(refs) > self.max_entries:
                self._entries = {k: v for k, v in self._entries.items() if now - v[0] < self.ttl}
                if len(self._entries) + len(refs) > self.max_entries:
                    self._entries.clear()
            for ref in refs:
                self._entries[(ref.run_id, ref.key)] = (now, ref)

    def get(self, run_id: str, key: str) -> SeriesRef | None:
        import time

        with self._lock:
            hit = self._entries.get((run_id, key))
        if hit is None or time.monotonic() - hit[0] >= self.ttl:
            return None
        return hit[1]


def refs_from_detail(run: dict[str, Any], defs: dict[str, dict[str, Any]]) -> list[SeriesRef]:
    """SeriesRefs for every series of a ``run_detail`` dict, with the current definitions in ``defs``."""
    out = []
    for s in run.get("series") or []:
        d = defs.get(s.get("definition")) if s.get("definition") else None
        out.append(SeriesRef(
            run_id=run["id"], run_name=run["name"], data_version=run["data_version"], task=run.get("task"),
            key=s["key"], sign=s.get("sign") or 1.0, semantics=dict(s.get("semantics") or {}),
            count=s.get("count") or 0, definition_name=d["name"] if d else None,
            definition_version=d["version"] if d else None, _definition=d,
        ))
    return out
