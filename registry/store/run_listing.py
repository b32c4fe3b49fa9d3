"""Listing runs: the filtered, ordered page of runs with their hyperparameters, tags and scores.

Written against the Core tables of :mod:`registry.db.schema` only, so the store's ``list_runs``
and ``rlreg runs`` share one read path while ``rlreg runs`` loads neither the ORM nor NumPy:
:func:`open_rows` gives it a :class:`RowReader` on a database already at the current schema, and
a registry that must be created or upgraded is opened the usual way instead.

Everything here reads through ``db.read()``, a context manager yielding something that executes
Core statements: the store's read session, or a :class:`RowReader`'s connection.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from registry.core.errors import InputError
from registry.core.hparams import restore_value
from registry.core.run_fields import ORDERABLE_FIELDS
from registry.db.dialect import READ_ONLY_OPTION
from registry.db.engine import make_engine, normalize_url
from registry.db.migrate import HEAD_REVISION, current_revision
from registry.db.schema import outcome_scores, run_params, run_tags, runs

# Runs per IN list: under SQLite's bound-parameter limit.
_ID_CHUNK = 500


class Readable(Protocol):
    """Anything with a ``read()`` context manager that executes Core statements (the store, a RowReader)."""

    def read(self) -> contextlib.AbstractContextManager[Any]: ...


class RowReader:
    """Read-only Core access to a registry's database (what ``rlreg runs`` needs, without the store)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn.execution_options(**{READ_ONLY_OPTION: True})
            yield conn

    def close(self) -> None:
        self.engine.dispose()


def open_rows(url: str) -> RowReader | None:
    """A reader on ``url`` when its database exists and its schema is current, else None (the caller
    opens the registry, which creates or upgrades it)."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if not path or path == ":memory:" or not Path(path).is_file():
            return None
    engine = make_engine(url)
    try:
        revision = current_revision(engine)
    except DBAPIError:  # not a database, or unreachable: the registry's own opening says why
        revision = None
    except Exception:
        engine.dispose()
        raise
    if revision != HEAD_REVISION:
        engine.dispose()
        return None
    return RowReader(engine)


def list_runs(db: Readable, *, where: str | None = None, project: str | None = None, tag: str | None = None,
              verdict: str | None = None, status: str | None = None, order_by: str = "-created_at",
              limit: int | None = 100, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Runs matching the filters (``where`` in the filter language), and the total match count."""
    query = select(runs)
    conditions = []
    if where:
        # The filter language's parser (lark) loads only for a filter: a plain listing does without it.
        from registry.store.filters import compile_filter, hyperparameter_fields

        conditions.append(compile_filter(where))
        check_hyperparameters_exist(db, hyperparameter_fields(where))
    if project:
        conditions.append(runs.c.project == project)
    if tag:
        conditions.append(runs.c.id.in_(select(run_tags.c.run_id).where(run_tags.c.tag == tag)))
    if verdict:
        conditions.append(runs.c.verdict == verdict)
    if status:
        conditions.append(runs.c.status == status)
    if conditions:
        query = query.where(*conditions)
    desc = order_by.startswith("-")
    keys = [k.desc().nulls_last() if desc else k.asc().nulls_last() for k in _order_keys(order_by.lstrip("-"))]
    with db.read() as conn:
        total = conn.scalar(select(func.count()).select_from(query.subquery()))
        page = query.order_by(*keys, runs.c.id).offset(offset)
        if limit is not None:
            page = page.limit(limit)
        return run_dicts(conn, list(conn.execute(page))), total


def _order_keys(field: str) -> list[Any]:
    if field in ORDERABLE_FIELDS:
        return [runs.c[field]]
    from registry.store.filters import sort_keys  # a hyperparameter or metric: the filter language's columns

    return sort_keys(field)


def run_dicts(conn: Any, rows: Sequence[Any]) -> list[dict[str, Any]]:
    """:func:`run_fields` for a page of runs (rows of ``runs`` or Run objects), their hyperparameters,
    tags and scores read as plain rows: a page of 50 runs with 30 hyperparameters each would otherwise
    build 1,500 ORM objects, which cost more than everything else ``/api/runs`` does."""
    ids = [r.id for r in rows]
    params: dict[str, list[tuple]] = defaultdict(list)
    tags: dict[str, list[str]] = defaultdict(list)
    scores: dict[str, list[tuple]] = defaultdict(list)
    for start in range(0, len(ids), _ID_CHUNK):
        chunk = ids[start:start + _ID_CHUNK]
        p = run_params.c
        for rid, *row in conn.execute(select(p.run_id, p.key, p.value_type, p.num_value, p.text_value)
                                      .where(p.run_id.in_(chunk))):
            params[rid].append(tuple(row))
        for rid, tag in conn.execute(select(run_tags.c.run_id, run_tags.c.tag).where(run_tags.c.run_id.in_(chunk))):
            tags[rid].append(tag)
        s = outcome_scores.c
        for rid, name, value in conn.execute(select(s.run_id, s.name, s.value).where(s.run_id.in_(chunk))):
            scores[rid].append((name, value))
    return [run_fields(r, params[r.id], tags[r.id], scores[r.id]) for r in rows]


def run_fields(run: Any, params: Sequence[tuple], tags: Sequence[str], scores: Sequence[tuple]) -> dict[str, Any]:
    """The run's summary fields (from a ``runs`` row or a Run); ``params`` as (key, value_type,
    num_value, text_value) rows."""
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


def check_hyperparameters_exist(db: Readable, keys: Sequence[str]) -> None:
    """A filter on a hyperparameter no run has is a typo (``lr`` for ``learning_rate``): say so, with
    the keys it may have meant, instead of answering with an empty list."""
    if not keys:
        return
    with db.read() as conn:
        present = set(conn.scalars(select(run_params.c.key).where(run_params.c.key.in_(list(keys))).distinct()))
        missing = [k for k in keys if k not in present]
        if not missing:
            return
        known = list(conn.scalars(select(run_params.c.key).distinct().limit(20000)))
    if not known:
        return  # an empty registry: nothing to have mistyped
    from registry.store.filters import suggest_params

    key = missing[0]
    hint = suggest_params(key, known)
    raise InputError(f"no run has a hyperparameter {key!r}" + (f"; did you mean {', '.join(hint)}?" if hint else ""))
