"""Columns of a runs listing, shared by the web runs table and ``rlreg runs``: which hyperparameters
and headline metrics are worth a column, and metric summaries (last, min, max, mean, first) read
from the stored summary columns in canonical sign. No web imports: the CLI uses it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy import select

from registry.core.errors import InputError
from registry.db.schema import metric_definitions, series

STATS = ("last", "min", "max", "mean", "first")

KEY_PARAM_HINTS = (
    "learning_rate", "lr", "actor_lr", "kl_coef", "kl_loss_coef", "init_kl_coef", "beta", "clip_range",
    "clip_ratio", "cliprange", "ent_coef", "entropy_coeff", "batch_size", "train_batch_size", "n_steps",
    "n_epochs", "ppo_epochs", "rollout_n", "n", "num_generations", "gamma", "gae_lambda", "seed",
)
# Which metric of a kind makes the best column, when runs have several.
PREFERRED_METRICS = (
    "reward_sequence_mean", "episode_return_mean", "reward_total_mean", "return_mean", "eval_reward_mean",
    "success_rate", "kl_ref_mean", "kl_old_mean", "entropy", "clip_fraction",
)


def pick_param_columns(rows: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """Hyperparameters worth a column: those that vary on this page, well-known ones first."""
    counts = Counter(k for r in rows for k in r["params"])
    if not counts:
        return []

    def varies(key: str) -> bool:
        return len({repr(r["params"].get(key, "<missing>")) for r in rows}) > 1

    def hint(key: str) -> int:
        last = key.rsplit(".", 1)[-1].lower()
        return KEY_PARAM_HINTS.index(last) if last in KEY_PARAM_HINTS else len(KEY_PARAM_HINTS)

    ranked = sorted(counts, key=lambda k: (not varies(k), hint(k), -counts[k], k))
    chosen = [k for k in ranked if varies(k) or hint(k) < len(KEY_PARAM_HINTS)]
    return chosen[:limit]


def pick_metric_columns(last: Mapping[str, Mapping[str, Any]], defs: Mapping[str, Mapping[str, Any]],
                        limit: int = 4) -> list[str]:
    """The metrics most runs on the page have: a reward/return, a KL, the entropy, the clip fraction."""
    counts = Counter(name for per in last.values() for name in per)
    wanted = ((("reward", "return"), 2), (("kl",), 2), (("entropy",), 1), (("clip_fraction",), 1))
    chosen: list[str] = []
    for quantities, most in wanted:
        pool = [n for n in counts if (defs.get(n) or {}).get("quantity") in quantities and n not in chosen]
        if quantities[0] == "reward":
            pool = [n for n in pool if (defs.get(n) or {}).get("layer") == "objective"] or pool
        picked: list[str] = []
        # Greedy cover: the most common one, then one for the runs that lack it (SB3 and verl on one page).
        while pool and len(picked) < most:
            uncovered = [per for per in last.values() if not any(n in per for n in picked)]
            if not uncovered:
                break
            best = max(pool, key=lambda n: (
                sum(n in per for per in uncovered),
                -PREFERRED_METRICS.index(n) if n in PREFERRED_METRICS else -len(PREFERRED_METRICS),
                n.endswith("_mean"), -len(n)))
            if not any(best in per for per in uncovered):
                break
            picked.append(best)
            pool.remove(best)
        chosen += picked
    return chosen[:limit]


@dataclass(frozen=True)
class MetricColumn:
    """A runs-table column: a canonical metric and which summary of it (``kl_ref_mean:max``)."""

    name: str
    stat: str = "last"

    @classmethod
    def parse(cls, spec: str) -> MetricColumn:
        name, _, stat = spec.strip().partition(":")
        stat = stat.strip().lower() or "last"
        if stat not in STATS:
            raise InputError(f"metric column {spec.strip()!r}: the summary must be one of {', '.join(STATS)}")
        return cls(name.strip(), stat)

    @property
    def spec(self) -> str:
        return self.name if self.stat == "last" else f"{self.name}:{self.stat}"

    @property
    def label(self) -> str:
        return self.name.replace("_", " ") + ("" if self.stat == "last" else f" ({self.stat})")


def metric_summaries(registry: Any, run_ids: Sequence[str], columns: Sequence[MetricColumn]) -> dict[str, dict[str, float | None]]:
    """``{run id: {column spec: value}}`` from the summary columns, in canonical sign (a negated
    series' minimum is the canonical maximum). Where two raw keys bind to one definition, the one
    with more points is used, as everywhere else."""
    out: dict[str, dict[str, float | None]] = {rid: {} for rid in run_ids}
    names = sorted({c.name for c in columns})
    if not run_ids or not names:
        return out
    with registry.read() as session:
        rows = session.execute(
            select(series.c.run_id, metric_definitions.c.name, series.c.sign, series.c.first_value, series.c.last_value,
                   series.c.min_value, series.c.max_value, series.c.finite_sum, series.c.count, series.c.nan_count,
                   series.c.inf_count)
            .join(metric_definitions, series.c.definition_id == metric_definitions.c.id)
            .where(series.c.run_id.in_(list(run_ids)), metric_definitions.c.name.in_(names))
            .order_by(series.c.count.desc()))
        seen: set[tuple[str, str]] = set()
        for run_id, name, sign, first, last, low, high, total, count, nans, infs in rows:
            if (run_id, name) in seen:
                continue
            seen.add((run_id, name))
            finite = count - nans - infs
            raw = {"first": first, "last": last, "mean": total / finite if finite > 0 else None,
                   "min": low if sign >= 0 else high, "max": high if sign >= 0 else low}
            for c in columns:
                if c.name == name:
                    value = raw[c.stat]
                    out[run_id][c.spec] = None if value is None else value * sign
    return out


def headline_metrics(registry: Any, run_ids: Sequence[str]) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """(``{run: {metric name: {}}}``, ``{name: {quantity, layer}}``) of the runs' mapped metrics: what
    :func:`pick_metric_columns` chooses from."""
    per_run: dict[str, dict[str, dict[str, Any]]] = {rid: {} for rid in run_ids}
    kinds: dict[str, dict[str, Any]] = {}
    if not run_ids:
        return per_run, kinds
    with registry.read() as session:
        rows = session.execute(
            select(series.c.run_id, metric_definitions.c.name, metric_definitions.c.quantity, metric_definitions.c.layer)
            .join(metric_definitions, series.c.definition_id == metric_definitions.c.id)
            .where(series.c.run_id.in_(list(run_ids))))
        for run_id, name, quantity, layer in rows:
            per_run[run_id][name] = {}
            kinds[name] = {"quantity": quantity, "layer": layer}
    return per_run, kinds
