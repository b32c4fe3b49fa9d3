"""The one way series are read back: which stored series stands for a name in a run, and its points.

Every reader (the facade, the web pages and plots, health, similarity, export) resolves a
name through :func:`find_series` and decodes points through :func:`read_series_chunks`, so
two pages can never show different series for the same canonical name.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.core import codec
from registry.core.hparams import restore_value
from registry.core.downsample import downsample_indices
from registry.core.series import SeriesData
from registry.db.models import MetricDefinition, OutcomeScore, Run, RunParam, RunTag, Series, SeriesChunk

#: Run ids per IN list: under SQLite's bound-parameter limit, one statement for any page size.
_ID_CHUNK = 500

# When several raw keys of a run bind to one definition (a run logging both verl's
# ``actor/kl_loss`` and a custom ``kl``), the series with the most points stands for the
# name; equal counts are broken by the raw key, so the choice never depends on row order.
CANONICAL_ORDER = (Series.count.desc(), Series.key)


def find_series(session: Session, run_id: str, key: str, *, canonical: bool = True) -> Series | None:
    """A run's series by raw key; else (when ``canonical``) the series standing for that canonical name."""
    series = session.scalar(select(Series).where(Series.run_id == run_id, Series.key == key))
    if series is None and canonical:
        series = session.scalar(
            select(Series).join(MetricDefinition, Series.definition_id == MetricDefinition.id)
            .where(Series.run_id == run_id, MetricDefinition.name == key)
            .order_by(*CANONICAL_ORDER).limit(1)
        )
    return series


def reduce_points(data: SeriesData, max_points: int) -> tuple[SeriesData, bool]:
    """At most ``max_points`` finite points chosen by MinMaxLTTB (a spike survives any reduction),
    and whether anything was dropped. Counts (of a per-step series) follow their points."""
    if not max_points or len(data.steps) <= max_points:
        return data, False
    steps, values = np.asarray(data.steps), np.asarray(data.values, dtype=np.float64)
    finite = np.isfinite(values)
    idx = downsample_indices(steps[finite], values[finite], max_points)
    if idx is None:
        return data, False

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[finite][idx]

    return SeriesData(steps[finite][idx], values[finite][idx], pick(data.wall_times), pick(data.counts)), True


def read_series_chunks(session: Session, series_id: int) -> SeriesData:
    """All points of one stored series, in step order, from one query."""
    rows = session.execute(
        select(SeriesChunk.steps, SeriesChunk.values, SeriesChunk.wall_times)
        .where(SeriesChunk.series_id == series_id)
        .order_by(SeriesChunk.seq)
    ).all()
    if not rows:
        return SeriesData(np.empty(0, np.int64), np.empty(0, np.float64))
    if len(rows) == 1:
        steps, values, walls = rows[0]
        return SeriesData(codec.decode_steps(steps), codec.decode_values(values), codec.decode_values(walls))
    steps = np.concatenate([codec.decode_steps(r[0]) for r in rows])
    values = np.concatenate([codec.decode_values(r[1]) for r in rows])
    walls = None
    if any(r[2] is not None for r in rows):
        walls = np.concatenate([
            codec.decode_values(r[2]) if r[2] is not None else np.full(len(codec.decode_steps(r[0])), np.nan)
            for r in rows
        ])
    return SeriesData(steps, values, walls)


def run_to_dict(run: Run, full: bool = False) -> dict[str, Any]:
    out = _run_fields(run, [(p.key, p.value_type, p.num_value, p.text_value) for p in run.params],
                      [t.tag for t in run.tags], [(s.name, s.value) for s in run.scores])
    if full:
        out["notes"] = run.notes
        out["source"] = {"format": run.source_format, "path": run.source_path, "fingerprint": run.source_fingerprint}
        out["binding"] = dict(run.binding_info or {})
        out["checkpoints"] = [{"step": c.step, "uri": c.uri, "note": c.note} for c in run.checkpoints]
        out["series"] = [series_to_dict(s) for s in run.series]
    return out


def run_dicts(session: Session, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """:func:`run_to_dict` for a page of runs, their hyperparameters, tags and scores read as plain
    rows: a page of 50 runs with 30 hyperparameters each would otherwise build 1,500 ORM objects,
    which cost more than everything else ``/api/runs`` does."""
    ids = [r.id for r in runs]
    params: dict[str, list[tuple]] = defaultdict(list)
    tags: dict[str, list[str]] = defaultdict(list)
    scores: dict[str, list[tuple]] = defaultdict(list)
    for start in range(0, len(ids), _ID_CHUNK):
        chunk = ids[start:start + _ID_CHUNK]
        for rid, *row in session.execute(select(RunParam.run_id, RunParam.key, RunParam.value_type,
                                                RunParam.num_value, RunParam.text_value)
                                         .where(RunParam.run_id.in_(chunk))):
            params[rid].append(tuple(row))
        for rid, tag in session.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(chunk))):
            tags[rid].append(tag)
        for rid, name, value in session.execute(select(OutcomeScore.run_id, OutcomeScore.name, OutcomeScore.value)
                                                .where(OutcomeScore.run_id.in_(chunk))):
            scores[rid].append((name, value))
    return [_run_fields(r, params[r.id], tags[r.id], scores[r.id]) for r in runs]


def _run_fields(run: Run, params: Sequence[tuple], tags: Sequence[str], scores: Sequence[tuple]) -> dict[str, Any]:
    """The run's summary fields; ``params`` as (key, value_type, num_value, text_value) rows."""
    return {
        "id": run.id,
        "name": run.name,
        "project": run.project,
        "algorithm": run.algorithm,
        "framework": run.framework,
        "task": run.task,
        "status": run.status,
        "verdict": run.verdict,
        "code_version": run.code_version,
        "tags": sorted(tags),
        "params": {key: restore_value(vtype, num, text) for key, vtype, num, text in sorted(params)},
        "scores": dict(scores),
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "data_version": run.data_version,
    }


def series_to_dict(s: Series) -> dict[str, Any]:
    return {
        "key": s.key,
        "definition": s.definition.name if s.definition else None,
        "layer": s.definition.layer if s.definition else None,
        "definition_version": s.definition_version,
        "definition_current_version": s.definition.version if s.definition else None,
        "alias_framework": s.alias_framework,
        "sign": s.sign,
        "semantics": s.semantics,
        "overrides": s.overrides,
        "provenance": dict(s.provenance or {}),
        "labels": dict(s.labels or {}),
        "count": s.count,
        "nan_count": s.nan_count,
        "inf_count": s.inf_count,
        "first_step": s.first_step,
        "last_step": s.last_step,
        "first": s.first_value,
        "last": s.last_value,
        "min": s.min_value,
        "max": s.max_value,
        "mean": s.mean_value,
    }
