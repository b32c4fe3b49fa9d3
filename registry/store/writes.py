"""How a run's series are written: a raw key bound to its definition, and points stored as chunks.

Points are stored as chunks of up to ``CHUNK_POINTS`` points, each one row of packed arrays;
appends add chunks, and a series that collected more than ``COMPACT_AFTER_CHUNKS`` small
chunks (a training loop logging every step) is rewritten as few full ones.
"""
from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy import delete
from sqlalchemy.orm import Session

from registry.core import codec
from registry.core.errors import InputError
from registry.core.semantics import SEMANTIC_FIELDS, check_enum
from registry.core.series import SeriesData, summarize
from registry.db.models import Series, SeriesChunk
from registry.dictionary.binding import AliasIndex, Binding, BindingContext
from registry.store.reader import read_series_chunks

CHUNK_POINTS = 65536
COMPACT_AFTER_CHUNKS = 32


def bind_key(
    index: AliasIndex, key: str, context: BindingContext,
    overrides: Mapping[str, Mapping[str, Any]] | None,
) -> Binding:
    override = dict((overrides or {}).get(key) or {})
    forced = override.pop("definition", None)
    bad = set(override) - set(SEMANTIC_FIELDS)
    if bad:
        raise InputError(f"metric {key!r}: cannot override {', '.join(sorted(bad))}")
    for f, v in override.items():
        try:
            check_enum(f, v)
        except ValueError as exc:
            raise InputError(f"metric {key!r}: {exc}") from None
    try:
        return index.bind(key, context, override=override, definition=forced)
    except KeyError:
        raise InputError(f"metric {key!r}: no definition named {forced!r}") from None


def _write_chunks(session: Session, series: Series, sd: SeriesData) -> None:
    """Store ``sd`` as chunks numbered on from the series' current chunk count."""
    rows = []
    for start in range(0, len(sd.steps), CHUNK_POINTS):
        sl = slice(start, start + CHUNK_POINTS)
        rows.append(
            {
                "series_id": series.id,
                "seq": series.chunk_count + len(rows),
                "n": len(sd.steps[sl]),
                "steps": codec.encode_steps(sd.steps[sl]),
                "values": codec.encode_values(sd.values[sl]),
                "wall_times": None if sd.wall_times is None else codec.encode_values(sd.wall_times[sl]),
            }
        )
    session.execute(SeriesChunk.__table__.insert(), rows)
    series.chunk_count += len(rows)

def append_points(session: Session, series: Series, sd: SeriesData) -> None:
    """Store new points after a series' last ones and update its summary columns (compacting
    the chunks when appends left too many small ones)."""
    _write_chunks(session, series, sd)
    s = summarize(sd.steps, sd.values)
    if series.count == 0:
        series.first_step, series.first_value = s.first_step, s.first_value
    series.last_step, series.last_value = s.last_step, s.last_value
    series.count += s.count
    series.nan_count += s.nan_count
    series.inf_count += s.inf_count
    series.finite_sum += s.finite_sum
    if s.min_value is not None:
        series.min_value = s.min_value if series.min_value is None else min(series.min_value, s.min_value)
        series.max_value = s.max_value if series.max_value is None else max(series.max_value, s.max_value)
    if series.chunk_count > COMPACT_AFTER_CHUNKS:
        _compact(session, series)

def _compact(session: Session, series: Series) -> None:
    data = read_series_chunks(session, series.id)
    session.execute(delete(SeriesChunk).where(SeriesChunk.series_id == series.id))
    series.chunk_count = 0
    _write_chunks(session, series, data)
