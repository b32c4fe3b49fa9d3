"""Binding raw metric keys to canonical definitions: the binding rules, in one place.

For one raw key of a run whose framework is known (declared, given by the input format, or
detected from the keys with a confidence):

1. Logger layout: the key is tried as logged, then without a prefix a logger added
   (transformers' ``train/`` and ``eval/``, the Trainer's ``eval_``, verl's file backend
   ``data/``). ``eval`` prefixes make the series an eval series (``logging_point: eval``).
2. Only the run's own framework's aliases bind (exact keys first, then templates such as
   ``rewards/{reward_func_name}/mean``, whose captured parts become the series' labels).
   Among them the alias of the run's algorithm wins, then the framework's default alias;
   several aliases that disagree are an error naming them.
3. A key equal to a canonical definition name binds to it (a custom loop logging ``kl_ref_mean``).
4. A key that only another framework's alias matches is bound with provenance ``guessed``,
   never silently; with no framework known at all every alias binding is ``guessed``.
5. Keys that match nothing are kept, unmapped, with "did you mean" suggestions.

Each semantic field of a binding records where its value came from: ``alias`` (the
framework's default, with the framework version when known), ``config`` (the run's own
hyperparameter, see ``config_semantics``), ``layout`` (an eval prefix), ``override`` (the
user), ``guessed`` or ``definition``.
"""
from __future__ import annotations

import difflib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from registry.dictionary.config_semantics import config_effect
from registry.dictionary.definitions import alias_to_dict, definition_to_dict
from registry.core.errors import InputError
from registry.db.models import MetricDefinition
from registry.core.semantics import SEMANTIC_FIELDS

FRAMEWORK_NAMES = {
    "sb3": "stable-baselines3", "stable_baselines3": "stable-baselines3", "stable-baselines3": "stable-baselines3",
    "verl": "verl", "trl": "trl", "openrlhf": "openrlhf", "cleanrl": "cleanrl", "custom": "custom",
}

# Prefixes loggers put in front of a trainer's own key, with the split they mark.
# transformers' TensorBoard/W&B callbacks (rewrite_logs): "eval_x" -> "eval/x", "test_x" -> "test/x",
# everything else "train/x"; the Trainer's own log_history writes eval metrics as "eval_x".
LOGGER_PREFIXES: tuple[tuple[str, str | None, str], ...] = (
    ("train/", None, "transformers logger prefix train/"),
    ("eval/", "eval", "transformers logger prefix eval/"),
    ("test/", "eval", "transformers logger prefix test/"),
    ("eval_", "eval", "Trainer eval_ prefix"),
    ("data/", None, "verl file backend data/"),
)

# Placeholders whose value may contain a slash (a dataset id like openai/gsm8k) or is a count.
_SLASHED_PLACEHOLDERS = {"data_source", "ds", "dataset"}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def split_framework(name: str | None) -> tuple[str | None, str | None]:
    """``"trl==0.21.0"`` / ``"verl@0.5"`` -> (normalised framework, version)."""
    if not name or not name.strip():
        return None, None
    text = name.strip()
    version = None
    for sep in ("==", "@"):
        if sep in text:
            text, version = (part.strip() for part in text.split(sep, 1))
            break
    return FRAMEWORK_NAMES.get(text.lower(), text.lower()), version or None


def normalize_framework(name: str | None) -> str | None:
    return split_framework(name)[0]


@dataclass(frozen=True)
class BindingContext:
    """What is known about the run when its keys are bound."""

    framework: str | None = None
    framework_version: str | None = None
    framework_from: str | None = None      # declared | format | detected
    algorithm: str | None = None
    algorithm_from: str | None = None      # declared | config ... | detected
    params: Mapping[str, Any] = field(default_factory=dict)   # flattened hyperparameters


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
    provenance: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def mapped(self) -> bool:
        return self.definition_id is not None

    @property
    def how(self) -> str | None:
        return self.provenance.get("how")


@dataclass(frozen=True)
class _Match:
    name: str                 # definition name
    alias: dict[str, Any]
    labels: dict[str, str]


@dataclass(frozen=True)
class Detection:
    framework: str | None
    confidence: float
    algorithm: str | None
    evidence: str


class AmbiguousKeyError(InputError):
    """A key that several aliases of the run's own framework claim, with nothing to decide between them."""

    def __init__(self, message: str, definitions: set[str], listed: str):
        super().__init__(message)
        self.definitions = definitions
        self.listed = listed


def _template_regex(key: str) -> re.Pattern[str]:
    parts, last = [], 0
    for m in _PLACEHOLDER.finditer(key):
        parts.append(re.escape(key[last:m.start()]))
        name = m.group(1)
        if name == "n" or name.endswith("_n"):
            parts.append(rf"(?P<{name}>\d+)")
        elif name in _SLASHED_PLACEHOLDERS:
            parts.append(rf"(?P<{name}>.+?)")
        else:
            parts.append(rf"(?P<{name}>[^/]+)")
        last = m.end()
    parts.append(re.escape(key[last:]))
    return re.compile("".join(parts) + r"\Z")


def layout_variants(key: str) -> list[tuple[str, str | None, str | None]]:
    """``(logical key, stripped prefix, split)``: the key as logged, then without each logger prefix."""
    out: list[tuple[str, str | None, str | None]] = [(key, None, None)]
    for prefix, split, _ in LOGGER_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            out.append((key[len(prefix):], prefix, split))
    return out


def _alias_semantics(alias: Mapping[str, Any]) -> tuple:
    return tuple(alias.get(f) for f in SEMANTIC_FIELDS if f != "quantity") + (alias.get("sign"),)


class AliasIndex:
    """An in-memory view of the dictionary for binding many keys quickly."""

    def __init__(self, definitions: Iterable[MetricDefinition]):
        self._defs: dict[str, dict[str, Any]] = {}
        self._ids: dict[str, tuple[int, int]] = {}
        self._exact: dict[str, dict[str, list[tuple[str, dict]]]] = defaultdict(lambda: defaultdict(list))
        self._templates: dict[str, list[tuple[re.Pattern[str], str, dict]]] = defaultdict(list)
        self._by_key: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        self._suggestions: dict[tuple[str, int], list[str]] = {}
        for defn in definitions:
            data = definition_to_dict(defn)
            self._defs[defn.name] = data
            self._ids[defn.name] = (defn.id, defn.version)
            for alias in defn.aliases:
                entry = alias_to_dict(alias)
                self._by_key[alias.key].append((defn.name, entry))
                if _PLACEHOLDER.search(alias.key):
                    self._templates[alias.framework].append((_template_regex(alias.key), defn.name, entry))
                else:
                    self._exact[alias.framework][alias.key].append((defn.name, entry))

    @classmethod
    def load(cls, session: Session) -> AliasIndex:
        return cls(session.scalars(select(MetricDefinition).options(selectinload(MetricDefinition.aliases))))

    @property
    def names(self) -> list[str]:
        return list(self._defs)

    @property
    def frameworks(self) -> list[str]:
        return sorted(set(self._exact) | set(self._templates))

    def definition(self, name: str) -> dict[str, Any] | None:
        return self._defs.get(name)

    # --- matching ---------------------------------------------------------------

    def _matches(self, framework: str, logical: str) -> list[_Match]:
        """Aliases of ``framework`` for ``logical``: exact keys, or else templates (with captured labels)."""
        exact = self._exact.get(framework, {}).get(logical)
        if exact:
            return [_Match(name, alias, {}) for name, alias in exact]
        out = []
        for pattern, name, alias in self._templates.get(framework, ()):
            m = pattern.match(logical)
            if m:
                out.append(_Match(name, alias, {k: v for k, v in m.groupdict().items() if v is not None}))
        return out

    def _pick(self, key: str, framework: str, matches: list[_Match], algorithm: str | None,
              forced: str | None) -> tuple[_Match, str | None]:
        """One alias among a framework's matches: (match, note). AmbiguousKeyError when they disagree."""
        if forced is not None:
            matches = [m for m in matches if m.name == forced] or matches
        algo = (algorithm or "").lower()
        if algo:
            specific = [m for m in matches if m.alias["algorithm"] == algo]
            if specific:
                return specific[0], None
        generic = [m for m in matches if not m.alias["algorithm"]]
        if generic:
            return generic[0], None
        distinct = {(m.name, _alias_semantics(m.alias)) for m in matches}
        if len(distinct) == 1:
            note = None
            if algo:
                note = f"alias of {framework} {matches[0].alias['algorithm']} (this run's algorithm is {algo})"
            return matches[0], note
        listed = "; ".join(
            f"{m.alias['key']} ({m.alias['algorithm'] or 'default'}) -> {m.name}"
            + "".join(f", {f} {m.alias[f]}" for f in SEMANTIC_FIELDS if m.alias.get(f))
            for m in matches
        )
        algos = sorted({m.alias["algorithm"] for m in matches if m.alias["algorithm"]})
        hint = f"give the run's algorithm (--algorithm {' or '.join(algos)})" if algos else "choose one"
        raise AmbiguousKeyError(
            f"metric {key!r} matches several {framework} aliases that disagree: {listed}. Say which: {hint}, "
            f"or set the fields yourself (--semantics '{key}:FIELD=VALUE', '{key}:definition=NAME')",
            {m.name for m in matches}, listed,
        )

    def _own(self, key: str, ctx: BindingContext, forced: str | None):
        for logical, prefix, split in layout_variants(key):
            matches = self._matches(ctx.framework, logical)
            if matches:
                match, note = self._pick(key, ctx.framework, matches, ctx.algorithm, forced)
                return match, logical, prefix, split, note
        return None

    def _guess(self, key: str, own: str | None, forced: str | None):
        """Another framework's alias, when all frameworks that know the key agree on the definition."""
        for logical, prefix, split in layout_variants(key):
            found: list[_Match] = []
            for fw in self.frameworks:
                if fw != own:
                    found += self._matches(fw, logical)
            if forced is not None:
                found = [m for m in found if m.name == forced]
            if not found or len({m.name for m in found}) != 1:
                continue
            distinct = {_alias_semantics(m.alias) for m in found}
            return found[0], logical, prefix, split, len(distinct) == 1, sorted({m.alias["framework"] for m in found})
        return None

    # --- binding ----------------------------------------------------------------

    def bind(
        self,
        key: str,
        context: BindingContext | str | None = None,
        algorithm: str | None = None,
        override: Mapping[str, Any] | None = None,
        definition: str | None = None,
    ) -> Binding:
        """Bind one key under the binding rules; ``definition`` forces a canonical name (the user said so)."""
        if not isinstance(context, BindingContext):
            fw, version = split_framework(context)
            context = BindingContext(framework=fw, framework_version=version, framework_from="declared" if fw else None,
                                     algorithm=algorithm)
        ctx = context
        override = dict(override or {})
        if definition is not None and definition not in self._defs:
            raise KeyError(definition)

        match = logical = prefix = split = note = None
        how = None
        guessed_agree = True
        guessed_from: list[str] = []
        ambiguous: AmbiguousKeyError | None = None
        if ctx.framework:
            try:
                own = self._own(key, ctx, definition)
            except AmbiguousKeyError as exc:
                # Declared (or named by the input format): the user must say which, unless their own
                # overrides do. Only detected: the framework itself is a reading of the keys, so the
                # key is bound as a guess, at the definition's defaults.
                if len(exc.definitions) != 1 or (ctx.framework_from != "detected" and not override):
                    raise
                ambiguous, own = exc, None
            if own:
                match, logical, prefix, split, note = own
                how = "alias"
        if ambiguous is not None:
            how = "overridden" if override else "guessed"
            definition = definition or next(iter(ambiguous.definitions))
            guessed_from = [ctx.framework]
        if how is None and key in self._defs and definition in (None, key):
            how, logical = "canonical", key
        if how is None:
            guess = self._guess(key, ctx.framework, definition)
            if guess:
                match, logical, prefix, split, guessed_agree, guessed_from = guess
                how = "guessed"
        if definition is not None and (how is None or (match and match.name != definition)
                                        or (how == "canonical" and key != definition)):
            how, match, logical = "forced", None, key
        if ambiguous is not None:
            how = "overridden" if override else "guessed"

        if how is None:
            return Binding(key, None, None, None, None, 1.0, {}, override, tuple(self.suggest(key)),
                           provenance={"how": None}, labels={})

        name = definition if match is None and how != "canonical" else (key if how == "canonical" else match.name)
        defn = self._defs[name]
        def_id, version = self._ids[name]
        alias = match.alias if match is not None and (how != "guessed" or guessed_agree) else None
        labels = dict(match.labels) if match is not None else {}
        if split:
            labels["split"] = split

        semantics: dict[str, Any] = {}
        fields: dict[str, dict[str, Any]] = {}
        alias_origin = {"alias": "alias", "guessed": "guessed"}.get(how, "definition")
        for f in SEMANTIC_FIELDS:
            semantics[f] = defn.get(f)
            if alias is not None and alias.get(f) is not None:
                semantics[f] = alias[f]
            origin: dict[str, Any] = {"from": alias_origin if match is not None else "definition"}
            if match is not None:
                origin["framework"] = match.alias["framework"]
                if how == "alias" and ctx.framework_version:
                    origin["framework_version"] = ctx.framework_version
            fields[f] = origin
        if split == "eval":
            semantics["logging_point"] = "eval"
            fields["logging_point"] = {"from": "layout", "prefix": prefix}

        notes: list[str] = [note] if note else []
        warnings: tuple[str, ...] = ()
        if how == "alias" and match is not None:
            effect = config_effect(ctx.framework, ctx.framework_version, ctx.params, match.alias["key"])
            for f, origin in effect.fields.items():
                if f == "logging_point" and split == "eval":
                    continue
                semantics[f] = origin["value"]
                fields[f] = {k: v for k, v in origin.items() if k != "value"}
            notes += effect.notes
            warnings = effect.warnings
        if ambiguous is not None:
            notes.append(f"several {ctx.framework} aliases match ({ambiguous.listed}); "
                         + ("the run's overrides decide" if override else "the definition's defaults are used"))
        if how == "guessed" and not guessed_agree:
            notes.append(f"frameworks {', '.join(guessed_from)} log this key with different semantics; "
                         "the definition's defaults are used")
        for f, v in override.items():
            semantics[f] = v
            fields[f] = {"from": "override"}

        provenance: dict[str, Any] = {"how": how, "fields": fields}
        if match is not None:
            provenance["alias_key"] = match.alias["key"]
            provenance["alias_algorithm"] = match.alias["algorithm"] or None
            provenance["alias_source"] = match.alias.get("source") or None
        if how == "guessed":
            provenance["guessed_from"] = guessed_from
            provenance["run_framework"] = ctx.framework
        if prefix:
            provenance["logger_prefix"] = prefix
        if logical and logical != key:
            provenance["logical_key"] = logical
        if notes:
            provenance["notes"] = notes
        return Binding(
            key=key,
            definition_id=def_id,
            definition_name=name,
            definition_version=version,
            alias_framework=match.alias["framework"] if match is not None else None,
            sign=float(alias["sign"]) if alias is not None else 1.0,
            semantics=semantics,
            overrides=override,
            provenance=provenance,
            labels=labels,
            warnings=warnings,
        )

    def suggest(self, key: str, n: int = 3) -> list[str]:
        """Canonical names or framework keys that look like ``key``.

        Remembered per index (an index never changes once loaded): difflib costs ~20 ms a key, and an
        imported history registers the same unmapped keys run after run."""
        if (key, n) not in self._suggestions:
            self._suggestions[(key, n)] = self._suggest(key, n)
        return list(self._suggestions[(key, n)])

    def _suggest(self, key: str, n: int) -> list[str]:
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

    # --- detection --------------------------------------------------------------

    def detect(self, keys: Iterable[str]) -> Detection:
        """The framework (and algorithm) whose aliases cover the keys, with a confidence.

        Keys are tried with and without logger prefixes, so transformers' ``train/kl`` counts
        for TRL's ``kl`` as well as for OpenRLHF's ``train/kl``. The confidence is the share
        of recognised keys that the chosen framework knows.
        """
        keys = set(keys)
        votes: Counter[str] = Counter()
        recognised = 0
        algo_votes: dict[str, Counter[str]] = defaultdict(Counter)
        for key in keys:
            hit_any = False
            for fw in self.frameworks:
                for logical, _, _ in layout_variants(key):
                    matches = self._matches(fw, logical)
                    if matches:
                        votes[fw] += 1
                        hit_any = True
                        algos = {m.alias["algorithm"] for m in matches}
                        if len(algos) == 1 and "" not in algos:
                            algo_votes[fw][algos.pop()] += 1
                        break
            recognised += hit_any
        if not votes:
            return Detection(None, 0.0, None, "no key matches any framework's aliases")
        (best, n), *rest = votes.most_common(2) + [("", 0)]
        runner_up = rest[0][1] if rest else 0
        confidence = round(n / recognised, 2) if recognised else 0.0
        evidence = f"{n} of {len(keys)} keys are {best} keys" + (
            f" (next: {rest[0][0]} with {runner_up})" if runner_up else "")
        # Two keys, and a clear margin over the runner-up: TRL and OpenRLHF share generic
        # names such as "loss" and "learning_rate", which alone prove nothing.
        if n < 2 or n <= runner_up:
            return Detection(None, confidence, None, evidence)
        algorithm = None
        algos = algo_votes.get(best)
        if algos:
            (top, count), *others = algos.most_common(2) + [("", 0)]
            if count >= 2 and count > (others[0][1] if others else 0) * 2:
                algorithm = top
                evidence += f"; {count} keys only the {top} trainer logs"
        return Detection(best, confidence, algorithm, evidence)

    def detect_framework(self, keys: Iterable[str]) -> str | None:
        """The framework whose aliases cover most of these keys, when the evidence is clear."""
        return self.detect(keys).framework
