"""Binding raw metric keys to canonical definitions.

A key is looked up first among the aliases of the run's framework (and algorithm, for
trainers like TRL whose GRPO and PPO trainers reuse names), then as a canonical name, then
as an alias of any framework when that is unambiguous. Keys that match nothing are kept,
marked unmapped, and get "did you mean" suggestions.
"""
from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from .dictionary import alias_to_dict, definition_to_dict
from .models import MetricDefinition
from .semantics import effective_semantics

FRAMEWORK_NAMES = {
    "sb3": "stable-baselines3", "stable_baselines3": "stable-baselines3", "stable-baselines3": "stable-baselines3",
    "verl": "verl", "trl": "trl", "openrlhf": "openrlhf", "cleanrl": "cleanrl", "custom": "custom",
}


def normalize_framework(name: str | None) -> str | None:
    if not name:
        return None
    return FRAMEWORK_NAMES.get(name.strip().lower(), name.strip().lower())


@dataclass(frozen=True)
class Binding:
    """Where a raw key landed: its definition (or none), the alias used, and effective semantics."""

    key: str
    definition_id: int | None
    definition_name: str | None
    definition_version: int | None
    alias_framework: str | None
    sign: float
    semantics: dict[str, Any]
    overrides: dict[str, Any]
    suggestions: tuple[str, ...] = ()

    @property
    def mapped(self) -> bool:
        return self.definition_id is not None


class AliasIndex:
    """An in-memory view of the dictionary for binding many keys quickly."""

    def __init__(self, definitions: Iterable[MetricDefinition]):
        self._defs: dict[str, dict[str, Any]] = {}
        self._ids: dict[str, tuple[int, int]] = {}
        self._by_ident: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
        self._by_key: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for defn in definitions:
            data = definition_to_dict(defn)
            self._defs[defn.name] = data
            self._ids[defn.name] = (defn.id, defn.version)
            for alias in defn.aliases:
                entry = (defn.name, alias_to_dict(alias))
                self._by_ident[(alias.framework, alias.algorithm, alias.key)] = entry
                self._by_key[alias.key].append(entry)

    @classmethod
    def load(cls, session: Session) -> AliasIndex:
        return cls(session.scalars(select(MetricDefinition).options(selectinload(MetricDefinition.aliases))))

    @property
    def names(self) -> list[str]:
        return list(self._defs)

    def definition(self, name: str) -> dict[str, Any] | None:
        return self._defs.get(name)

    def _lookup(self, key: str, framework: str | None, algorithm: str | None) -> tuple[str, dict | None] | None:
        algo = (algorithm or "").lower()
        if framework:
            for ident in ((framework, algo, key), (framework, "", key)):
                if ident in self._by_ident:
                    return self._by_ident[ident]
            same_framework = [e for e in self._by_key.get(key, []) if e[1]["framework"] == framework]
            if same_framework:
                return same_framework[0]
        if key in self._defs:
            return key, None
        candidates = self._by_key.get(key, [])
        if len({name for name, _ in candidates}) == 1:
            return candidates[0]
        return None

    def bind(
        self,
        key: str,
        framework: str | None = None,
        algorithm: str | None = None,
        override: Mapping[str, Any] | None = None,
        definition: str | None = None,
    ) -> Binding:
        """Bind one key; ``definition`` forces a canonical name (the user said so)."""
        framework = normalize_framework(framework)
        found: tuple[str, dict | None] | None
        if definition is not None:
            if definition not in self._defs:
                raise KeyError(definition)
            found = self._lookup(key, framework, algorithm)
            if not found or found[0] != definition:
                found = (definition, None)
        else:
            found = self._lookup(key, framework, algorithm)
        override = dict(override or {})
        if found is None:
            return Binding(key, None, None, None, None, 1.0, {}, override, tuple(self.suggest(key)))
        name, alias = found
        def_id, version = self._ids[name]
        semantics = effective_semantics(self._defs[name], alias, override)
        return Binding(
            key=key,
            definition_id=def_id,
            definition_name=name,
            definition_version=version,
            alias_framework=alias["framework"] if alias else None,
            sign=alias["sign"] if alias else 1.0,
            semantics=semantics,
            overrides=override,
        )

    def suggest(self, key: str, n: int = 3) -> list[str]:
        """Canonical names or framework keys that look like ``key``."""
        pool = list(self._defs) + list(self._by_key)
        tail = key.rsplit("/", 1)[-1]
        hits = difflib.get_close_matches(key, pool, n=n, cutoff=0.6)
        hits += [h for h in difflib.get_close_matches(tail, pool, n=n, cutoff=0.6) if h not in hits]
        out = []
        for hit in hits[:n]:
            if hit in self._defs:
                out.append(hit)
            else:
                owners = sorted({name for name, _ in self._by_key[hit]})
                out.append(f"{hit} ({', '.join(owners)})")
        return out

    def detect_framework(self, keys: Iterable[str]) -> str | None:
        """The framework whose aliases cover most of these keys, when the evidence is clear."""
        keys = set(keys)
        votes: Counter[str] = Counter()
        for key in keys:
            for fw in {alias["framework"] for _, alias in self._by_key.get(key, [])}:
                votes[fw] += 1
        if not votes:
            return None
        (best, n), *rest = votes.most_common(2) + [("", 0)]
        runner_up = rest[0][1] if rest else 0
        # Two distinctive keys, and a clear margin over the runner-up: TRL and OpenRLHF share
        # generic names such as "loss" and "learning_rate", which alone prove nothing.
        if n >= 2 and n > runner_up:
            return best
        return None
