"""Canonical metrics that are one concept for similarity: a per-episode value and its windowed mean.

Frameworks log the same per-episode quantity in two forms, bound to two dictionary
definitions that differ only in their averaging:

* CleanRL ``charts/episodic_return`` -> ``episode_return`` (averaging ``none``): one point per
  finished episode, ``writer.add_scalar("charts/episodic_return", info["episode"]["r"],
  global_step)`` (vwxyzjn/cleanrl ``cleanrl/ppo.py``, 020cf0e5 and fe8d8a03);
* SB3 ``rollout/ep_rew_mean`` -> ``episode_return_mean`` (averaging ``episode``): the mean of
  the same Monitor ``r`` over the last 100 episodes, ``safe_mean([ep_info["r"] for ep_info in
  self.ep_info_buffer])`` (DLR-RM/stable-baselines3
  ``stable_baselines3/common/on_policy_algorithm.py``, ``dump_logs``; 2.9.2).

The windowed mean is a moving average of the single-episode series, so after the search's
z-normalisation and denoising their *shapes* are comparable, while their definitions stay
distinct (the diagnosis and the plots keep telling them apart). The pairs come from the
dictionary's own fields, not from a list of names: two definitions are one concept when
quantity, layer, unit, KL estimator, normalization axis and logging point agree and their
averagings are ``none`` and ``episode``. (In the shipped dictionary: episode return and episode
length.) Every other semantic difference still keeps series apart.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.db.models import MetricDefinition

#: Averagings of one per-episode value: a single episode ("none"), a window of episodes ("episode").
PER_EPISODE = frozenset({"none", "episode"})
_SHARED_FIELDS = ("quantity", "layer", "unit", "kl_estimator", "normalization_axis", "logging_point")


def equivalent_definitions(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Definition name -> the other definitions of the same per-episode concept (see the module)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in rows:
        if r.get("averaging") in PER_EPISODE:
            groups[tuple(r.get(f) for f in _SHARED_FIELDS)].append(r["name"])
    out: dict[str, tuple[str, ...]] = {}
    for names in groups.values():
        for name in names:
            others = tuple(sorted(n for n in names if n != name))
            if others:
                out[name] = others
    return out


def load_equivalents(session: Session) -> dict[str, tuple[str, ...]]:
    """``equivalent_definitions`` of the registry's dictionary."""
    cols = [getattr(MetricDefinition, f) for f in ("name", "averaging", *_SHARED_FIELDS)]
    rows = session.execute(select(*cols)).mappings().all()
    return equivalent_definitions(rows)


def concept_key(sem_key: str) -> str:
    """A strict semantics key (``index.semantics_key``) with a per-episode averaging made generic."""
    parts = []
    for part in sem_key.split("|"):
        field, _, value = part.partition("=")
        if field == "averaging" and value in PER_EPISODE:
            value = "per-episode"
        parts.append(f"{field}={value}")
    return "|".join(parts)


def merged_view(corpus: Any, name: str, alternatives: tuple[str, ...],
                sem_key: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per-run (positions, semantics codes, keys) of metric ``name``, as ``Corpus.dense``, where a run
    without a row of ``name`` uses its row of an equivalent definition (first in ``alternatives``).

    Such a row whose semantics match the query's but for the per-episode averaging gets the code
    of ``sem_key`` (so it is compared); any other difference keeps its own key (and is reported)."""
    pos, codes, keys, _, _ = corpus.dense(name)
    if not alternatives:
        return pos, codes, keys
    pos, codes, keys = pos.copy(), codes.copy(), list(keys)
    target = concept_key(sem_key)
    for alt in alternatives:
        apos, acodes, akeys, _, _ = corpus.dense(alt)
        fill = (pos < 0) & (apos >= 0)
        if not fill.any():
            continue
        pos[fill] = apos[fill]
        for code in np.unique(acodes[fill]):
            key = sem_key if concept_key(akeys[code]) == target else akeys[code]
            if key not in keys:
                keys.append(key)
            codes[fill & (acodes == code)] = keys.index(key)
    return pos, codes, keys


def whole_rows(corpus: Any, name: str, alternatives: tuple[str, ...], kind: str) -> np.ndarray | None:
    """(R, GRID) float32 whole-run z-grids (kind "grid"; None when the corpus holds none) or (R, PAA)
    PAA vectors ("paa") of ``name``, from an equivalent definition's row where a run has none of
    ``name`` (zeros where it has neither), as ``Corpus.whole_grids`` / ``Corpus.dense`` give them."""
    if not alternatives:
        return corpus.whole_grids(name) if kind == "grid" else corpus.dense(name)[3]
    if kind == "grid" and corpus.grids is None:
        return None
    pos = corpus.dense(name)[0].copy()
    for alt in alternatives:
        apos = corpus.dense(alt)[0]
        fill = (pos < 0) & (apos >= 0)
        pos[fill] = apos[fill]
    source = corpus.grids if kind == "grid" else corpus.paa
    out = np.zeros((len(pos), source.shape[-1]), dtype=np.float32)
    have = pos >= 0
    out[have] = source[pos[have], -1]
    return out
