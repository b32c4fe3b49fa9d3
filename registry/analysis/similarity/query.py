"""Query preparation: which metrics a query compares, over which portion of the run, on which grid."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.core.errors import InputError
from registry.db.models import MetricDefinition, Run, Series
from registry.analysis.similarity import features as F
from registry.core.hparams import restore_value
from registry.store.filters import compile_filter


#: Planned-length hyperparameters, used to place a running run's progress on the fraction axis.
TOTAL_STEP_PARAMS = ("total_timesteps", "n_timesteps", "total_training_steps", "max_steps", "total_steps",
                     "num_train_steps", "trainer.total_training_steps")


#: Short metric names and the dictionary quantities they stand for.
SHORT_NAMES = {"reward": ("reward", "return"), "return": ("return", "reward"), "score": ("reward", "return"),
               "kl": ("kl",), "entropy": ("entropy",)}


HEADLINE = ("reward", "kl", "entropy")


@dataclass
class Portion:
    """Which part of each run is compared.

    kind "fraction": [start, end] as fractions of each run's own step span.
    kind "step": [start, end] in absolute steps; ``start`` None means each run's own first step.
    """

    kind: str
    start: float | None
    end: float
    label: str | None
    mode: str  # "whole", "prefix" or "window"

    @property
    def is_prefix(self) -> bool:
        return self.mode == "prefix"

    @property
    def whole(self) -> bool:
        return self.kind == "fraction" and self.start == 0.0 and self.end == 1.0

    def fractions(self, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-row [start, end] fractions of the rows' spans."""
        if self.kind == "fraction":
            return np.full(len(first), float(self.start)), np.full(len(first), float(self.end))
        span = np.maximum(last - first, 1e-12)
        start = np.zeros(len(first)) if self.start is None else (self.start - first) / span
        return np.clip(start, 0.0, None), (self.end - first) / span


#: Eligibility over whole runs: what an anywhere search slides its window over.
WHOLE = Portion("fraction", 0.0, 1.0, None, "whole")


@dataclass
class QueryMetric:
    name: str
    weight: float
    sem_key: str
    semantics: dict[str, Any]
    steps: np.ndarray
    values: np.ndarray
    #: equivalent definitions compared in its place where a run has none of it (``concepts``)
    alternatives: tuple[str, ...] = ()


def params_total(params: Mapping[str, Any]) -> float | None:
    for key, value in params.items():
        if any(key == p or key.endswith("." + p) for p in TOTAL_STEP_PARAMS) and isinstance(value, (int, float)):
            if value > 0 and not isinstance(value, bool):
                return float(value)
    return None


def resolve_metrics(available: Mapping[str, dict[str, Any]], requested: Sequence[str] | str | None,
                    algorithm: str | None = None) -> list[str]:
    """Canonical names for the requested metrics of a run.

    ``available``: canonical name -> {quantity, layer, count, keys}. A requested name is,
    in order: a canonical name; a raw key the run logged; a short name ("reward", "return",
    "kl", "entropy", or any dictionary quantity) resolved to the run's metric of that
    quantity: objective/constraint layers first, then names ending in ``_mean``, then (for
    KL) the reference KL for GRPO and the old-policy KL otherwise, then most points.
    Default: the run's reward/return, KL and entropy (those it has).
    """
    if isinstance(requested, str):
        requested = [p.strip() for p in requested.split(",") if p.strip()]
    explicit = requested is not None
    names = list(requested) if explicit else list(HEADLINE)
    out: list[str] = []
    for name in names:
        hit = resolve_one(available, name, algorithm)
        if hit is None:
            if explicit:
                raise InputError(f"run has no metric {name!r}; it has: {', '.join(sorted(available)) or 'none'}")
            continue
        if hit not in out:
            out.append(hit)
    if not out:
        objective = sorted((n for n, a in available.items() if a["layer"] == "objective"),
                           key=lambda n: -available[n]["count"])
        out = objective[:3]
    if not out:
        raise InputError("run has no mapped metrics to compare")
    return out


def resolve_one(available: Mapping[str, dict[str, Any]], name: str, algorithm: str | None) -> str | None:
    if name in available:
        return name
    for canonical, info in available.items():
        if name in info["keys"]:
            return canonical
    quantities = SHORT_NAMES.get(name.lower(), (name.lower(),))
    pool = [n for n, a in available.items() if a["quantity"] in quantities]
    if not pool:
        return None
    kl_pref = "ref" if (algorithm or "").upper() == "GRPO" else "old"

    def rank(n: str) -> tuple:
        a = available[n]
        return (quantities.index(a["quantity"]), a["layer"] not in ("objective", "constraint"),
                not n.endswith("_mean"), kl_pref not in n if a["quantity"] == "kl" else False, -a["count"], n)

    return min(pool, key=rank)


def coerce_bound(x: Any, what: str) -> float | int:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a number (fraction 0-1 or a step), got {x!r}")
    if isinstance(x, (int, np.integer)):
        return int(x)
    return float(x)


def make_portion(prefix: Any, window: Any, align: str, status: str, first: float, last: float,
                 total: float | None) -> Portion:
    """The compared portion (``total``: planned last step of a running run, when known)."""
    if align not in ("fraction", "step"):
        raise InputError(f"align must be 'fraction' or 'step', got {align!r}")
    if prefix is not None and window is not None:
        raise InputError("give either prefix or window, not both")
    running = status == "running"
    span = (total - first) if (running and total and total > last) else (last - first)
    span = max(span, 1e-12)
    if window is not None:
        try:
            a, b = (coerce_bound(v, "window bound") for v in window)
        except (TypeError, ValueError):
            raise InputError(f"window must be a pair (start, end), got {window!r}") from None
        if isinstance(a, float) and isinstance(b, float) and 0 <= a < b <= 1 and align == "fraction":
            return Portion("fraction", a, b, f"training {a:.0%}-{b:.0%}", "window")
        if isinstance(a, float) and isinstance(b, float) and 0 <= a < b <= 1:
            a, b = first + a * span, first + b * span
        if not a < b:
            raise InputError(f"window start must be before its end, got {window!r}")
        if align == "fraction":
            fa, fb = (a - first) / span, (b - first) / span
            return Portion("fraction", max(fa, 0.0), min(fb, 1.0), f"training {fa:.0%}-{fb:.0%}", "window")
        return Portion("step", float(a), float(b), f"steps {int(a):,}-{int(b):,}", "window")
    if prefix is None:
        if not running:
            if align == "step":
                return Portion("step", None, last, f"the first {int(last):,} steps", "whole")
            return Portion("fraction", 0.0, 1.0, None, "whole")
        if align == "fraction" and total and total > last:
            f = (last - first) / span
            return Portion("fraction", 0.0, f, f"the first {f:.0%} of training (running run)", "prefix")
        return Portion("step", None, last, f"the first {int(last):,} steps (running run)", "prefix")
    p = coerce_bound(prefix, "prefix")
    if isinstance(p, float):
        if not 0 < p <= 1:
            raise InputError(f"a fractional prefix must be in (0, 1], got {p}")
        if align == "fraction":
            return Portion("fraction", 0.0, p, f"the first {p:.0%} of training", "prefix")
        s = first + p * span
        return Portion("step", None, s, f"the first {int(s):,} steps", "prefix")
    if p <= first:
        raise InputError(f"prefix of {p} steps ends before the run's first step {int(first)}")
    if align == "fraction":
        f = min((p - first) / span, 1.0)
        return Portion("fraction", 0.0, f, f"the first {f:.0%} of training ({p:,} steps)", "prefix")
    return Portion("step", None, float(p), f"the first {p:,} steps", "prefix")


def query_grid(q: QueryMetric, portion: Portion, total: float | None,
                origin: float | None = None) -> tuple[np.ndarray, float]:
    """The query metric's grid over the portion (``query_span``), and its noise level."""
    steps, values, lo, hi = query_span(q, portion, total, origin)
    if hi <= lo:
        return np.full(F.GRID, values[-1]), 0.0
    return F.bin_average(steps, values, lo, hi)


def query_span(q: QueryMetric, portion: Portion, total: float | None,
                origin: float | None = None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The query metric's finite steps and values, and the first and last step of the portion.

    Fractions are of the metric's own step span, as for stored rows. For a running run,
    ``total`` is its planned last step and ``origin`` its first step (over all metrics):
    fractions are then of the planned span ``[origin, total]``, one axis for every metric,
    and each metric's part starts where its data starts. (Per-metric spans would not do: a
    metric logged from a later step, as SB3's ``train/*`` from the second rollout, would
    need data past the run's last step to cover the same fraction of its own plan.)
    """
    steps = q.steps.astype(np.float64)
    keep = np.isfinite(q.values)
    steps, values = steps[keep], q.values[keep]
    if not len(values):
        raise InputError(f"metric {q.name!r} has no finite points")
    first, last = steps[0], steps[-1]
    if portion.kind == "fraction" and total and total > last:
        base = first if origin is None else min(origin, first)
        lo, hi = base + portion.start * (total - base), base + portion.end * (total - base)
        lo = max(lo, first)
    elif portion.kind == "fraction":
        span = last - first
        lo, hi = first + portion.start * span, first + portion.end * span
    else:
        lo = first if portion.start is None else max(portion.start, first)
        hi = portion.end
    if hi > last:
        # metrics logged at other cadences end a little earlier: tolerate 5% of the portion
        if hi - last > 0.05 * max(hi - lo, 1e-12) + 1e-9:
            raise InputError(f"metric {q.name!r} only reaches step {int(last):,}; "
                             f"the query portion ends at {int(hi):,}")
        hi = last
    return steps, values, lo, hi


def load_query(session: Session, run: Run) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    rows = session.execute(
        select(Series.id, Series.key, Series.count, Series.sign, Series.semantics, MetricDefinition.name,
               MetricDefinition.quantity, MetricDefinition.layer)
        .join(MetricDefinition, Series.definition_id == MetricDefinition.id)
        .where(Series.run_id == run.id).order_by(Series.count.desc(), Series.key)
    ).all()
    available: dict[str, dict[str, Any]] = {}
    for r in rows:
        a = available.setdefault(r.name, {"quantity": r.quantity, "layer": r.layer, "count": r.count, "keys": [],
                                          "series_id": r.id, "sign": r.sign, "semantics": r.semantics or {}})
        a["keys"].append(r.key)

    params = {p.key: restore_value(p.value_type, p.num_value, p.text_value) for p in run.params}
    return available, params


def filters(run: Run, where: str | None, same_task: bool, same_project: bool, same_algorithm: bool,
             outcome: Any) -> list[Any]:
    conds: list[Any] = []
    if where:
        conds.append(compile_filter(where))
    if same_task:
        conds.append(Run.task == run.task if run.task is not None else Run.task.is_(None))
    if same_project:
        conds.append(Run.project == run.project)
    if same_algorithm:
        conds.append(Run.algorithm == run.algorithm if run.algorithm is not None else Run.algorithm.is_(None))
    if outcome:
        verdicts = [outcome] if isinstance(outcome, str) else list(outcome)
        conds.append(Run.verdict.in_(verdicts))
    return conds


def key_dict(key: str) -> dict[str, Any]:
    out = {}
    for part in key.split("|"):
        f, _, v = part.partition("=")
        out[f] = None if v == "-" else v
    return out


def query_features(qms: list[QueryMetric], portion: Portion, total: float | None, origin: float,
                    normalize: str, scales: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Query grid (GRID, M) and PAA (PAA, M), sqrt(w)-scaled, prepared like the stored rows."""
    grid = np.zeros((F.GRID, len(qms)))
    paa = np.zeros((F.PAA, len(qms)))
    for j, qm in enumerate(qms):
        raw, noise = query_grid(qm, portion, total, origin)
        if normalize == "raw":
            g = raw / scales[j]
            p = F.paa(g)
        else:
            g = F.shape(raw, noise)[0][0]
            # stored portions are cut at PAA resolution and normalised there: do the same
            p = F.paa(g) if portion.whole else F.shape(F.paa(raw), noise)[0][0]
        w = math.sqrt(qm.weight)
        grid[:, j], paa[:, j] = g * w, p * w
    return grid, paa
