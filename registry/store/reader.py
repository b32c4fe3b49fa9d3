"""The one way series are read back: which stored series stands for a name in a run, and its points.

Every reader (the facade, the web pages and plots, health, similarity, export) resolves a
name through :func:`find_series` and decodes points through :func:`read_series_chunks`, so
two pages can never show different series for the same canonical name.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.core import codec
from registry.core.downsample import downsample_indices
from registry.core.series import SeriesData
from registry.db.models import MetricDefinition, Run, Series, SeriesChunk
from registry.store.run_listing import run_fields

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
    out = run_fields(run, [(p.key, p.value_type, p.num_value, p.text_value) for p in run.params],
                      [t.tag for t in run.tags], [(s.name, s.value) for s in run.scores])
    if full:
        out["notes"] = run.notes
        out["source"] = {"format": run.source_format, "path": run.source_path, "fingerprint": run.source_fingerprint}
        out["binding"] = dict(run.binding_info or {})
        out["checkpoints"] = [{"step": c.step, "uri": c.uri, "note": c.note} for c in run.checkpoints]
        out["series"] = [series_to_dict(s) for s in run.series]
    return out


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
