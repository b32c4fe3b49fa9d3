"""The columns of ``rlreg runs``: run fields, hyperparameters, final scores and metric summaries.

By default: id, name, algorithm, task, verdict, tags, the hyperparameters that vary among the
listed runs (well-known ones first, at most 3) and the last values of the headline metrics (a
reward or return, a KL; at most 3), so the table fits a terminal. ``--columns`` names them instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from registry.core.errors import InputError
from registry.store.table_columns import MetricColumn, headline_metrics, metric_summaries, pick_metric_columns, pick_param_columns

RUN_FIELDS = ("id", "name", "project", "algorithm", "framework", "task", "status", "verdict", "tags", "created")
DEFAULT_FIELDS = ("id", "name", "algorithm", "task", "verdict", "tags")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # field, param, score, metric
    metric: MetricColumn | None = None

    @property
    def numeric(self) -> bool:
        return self.kind in ("score", "metric")


def parse_columns(spec: str, known_metrics: set[str]) -> list[Column]:
    """``--columns`` text as columns; a name that is neither a run field, ``score.X`` nor a metric
    the listed runs have is taken as a hyperparameter."""
    out = []
    for raw in (p.strip() for p in spec.split(",")):
        if not raw:
            continue
        if raw in RUN_FIELDS:
            out.append(Column(raw, "field"))
        elif raw.startswith("score."):
            out.append(Column(raw, "score"))
        elif raw.partition(":")[0] in known_metrics or ":" in raw:
            metric = MetricColumn.parse(raw)
            if metric.name not in known_metrics:
                raise InputError(f"--columns: no listed run has the metric {metric.name!r}")
            out.append(Column(metric.spec, "metric", metric))
        else:
            out.append(Column(raw, "param"))
    if not out:
        raise InputError("--columns names no column")
    return out


def resolve_columns(registry: Any, rows: Sequence[Mapping[str, Any]], spec: str | None,
                    extra_params: Sequence[str] = ()) -> list[Column]:
    per_run, kinds = headline_metrics(registry, [r["id"] for r in rows])
    if spec:
        columns = parse_columns(spec, set(kinds))
        unknown = [c.name for c in columns if c.kind == "param" and rows and not any(c.name in r["params"] for r in rows)]
        if unknown:
            from registry.store.filters import suggest_params

            hint = suggest_params(unknown[0], sorted({k for r in rows for k in r["params"]}))
            raise InputError(f"--columns: {unknown[0]!r} is no run field, score.NAME, metric or hyperparameter of the "
                             "listed runs" + (f"; did you mean {', '.join(hint)}?" if hint else ""))
    else:
        params = [p for p in pick_param_columns(rows, limit=3) if p not in extra_params]
        metrics = pick_metric_columns(per_run, kinds, limit=3)
        columns = [*(Column(f, "field") for f in DEFAULT_FIELDS), *(Column(p, "param") for p in params),
                   *(Column(m, "metric", MetricColumn(m)) for m in metrics)]
    return columns + [Column(p, "param") for p in extra_params if p not in {c.name for c in columns}]


def table_cells(registry: Any, rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> list[list[Any]]:
    """One list of values per row, in column order (None where a run has no value)."""
    metrics = [c.metric for c in columns if c.metric is not None]
    summaries = metric_summaries(registry, [r["id"] for r in rows], metrics)
    out = []
    for r in rows:
        row = []
        for c in columns:
            if c.kind == "field":
                row.append(_field(r, c.name))
            elif c.kind == "param":
                row.append(r["params"].get(c.name))
            elif c.kind == "score":
                row.append(r["scores"].get(c.name[len("score."):]))
            else:
                row.append(summaries[r["id"]].get(c.name))
        out.append(row)
    return out


def _field(run: Mapping[str, Any], name: str) -> str:
    if name == "id":
        return run["id"][:12]
    if name == "tags":
        return ", ".join(run["tags"])
    if name == "created":
        return (run.get("created_at") or "")[:16].replace("T", " ")
    return run.get(name) or ""
