"""Semantics read from a run's own configuration (``registry/dictionary/data/config_semantics.yaml``).

The dictionary says what a framework's key means under that framework's defaults; the run's
hyperparameters can change it (verl's ``actor/kl_loss`` is k3 by default, k1 with
``kl_loss_type: kl``). Rules are data: each names the framework, the hyperparameter, the keys
it applies to, the semantic field values it implies, the framework versions it holds for and
the source file it was read from.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from registry.core.errors import InputError
from registry.core.semantics import ENUMS, SEMANTIC_FIELDS

RULES_FORMAT = "rlregistry-config-semantics"


@dataclass(frozen=True)
class ConfigRule:
    framework: str
    params: tuple[str, ...]
    keys: frozenset[str]
    sets: Mapping[str, Mapping[str, str]]
    note: str
    warn_if: Mapping[str, Any]
    message: str
    holds_for: str
    source: str
    verified_in: str
    strip_suffix: str


@dataclass(frozen=True)
class ConfigEffect:
    """What the rules say about one series: field values (with their provenance), notes, warnings."""

    fields: dict[str, dict[str, Any]]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


def _normal(value: Any) -> str:
    """Config values compared as text: True/"true"/"True" alike, 0 and 0.0 alike."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value))
    text = str(value).strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered
    try:
        return repr(float(text))
    except ValueError:
        return text


def parse_rules(text: str, source: str = "config_semantics.yaml") -> list[ConfigRule]:
    """Validated rules from a rules document."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, Mapping) or doc.get("format") != RULES_FORMAT or not isinstance(doc.get("rules"), list):
        raise InputError(f"expected format: {RULES_FORMAT} with a 'rules' list", source)
    rules = []
    for i, item in enumerate(doc["rules"]):
        where = f"rules[{i}]"
        if not isinstance(item, Mapping) or not item.get("framework") or not item.get("param") or not item.get("keys"):
            raise InputError("a rule needs framework, param and keys", source, where)
        sets = dict(item.get("set") or {})
        for field, mapping in sets.items():
            if field not in SEMANTIC_FIELDS:
                raise InputError(f"cannot set {field!r}", source, where)
            for value in mapping.values():
                if value not in ENUMS[field]:
                    raise InputError(f"{field} must be one of {', '.join(ENUMS[field])}; got {value!r}", source, where)
        if not item.get("source") or not item.get("verified_in"):
            raise InputError("a rule must say its source file and the version it was verified in", source, where)
        params = item["param"] if isinstance(item["param"], list) else [item["param"]]
        rules.append(ConfigRule(
            framework=str(item["framework"]), params=tuple(str(p) for p in params),
            keys=frozenset(str(k) for k in item["keys"]),
            sets={f: {_normal(k): v for k, v in m.items()} for f, m in sets.items()},
            note=str(item.get("note") or ""), warn_if=dict(item.get("warn_if") or {}),
            message=str(item.get("message") or ""), holds_for=str(item.get("holds_for") or ""),
            source=str(item["source"]), verified_in=str(item["verified_in"]),
            strip_suffix=str(item.get("strip_suffix") or ""),
        ))
    return rules


@lru_cache(maxsize=1)
def default_rules() -> tuple[ConfigRule, ...]:
    text = resources.files("registry").joinpath("dictionary/data/config_semantics.yaml").read_text(encoding="utf-8")
    return tuple(parse_rules(text))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)[:4])


def version_holds(version: str | None, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec`` (">=0.4.1", ">=0.4,<0.6"); unknown versions pass."""
    if not version or not spec:
        return True
    have = _version(version)
    for part in spec.split(","):
        match = re.match(r"\s*(>=|<=|==|<|>)\s*([\w.]+)\s*$", part)
        if not match:
            continue
        op, want = match.group(1), _version(match.group(2))
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, "<": have < want, ">": have > want}[op]
        if not ok:
            return False
    return True


def _param(params: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any] | None:
    for name in names:
        if name in params:
            return name, params[name]
    return None


def _matches(condition: Mapping[str, Any], value: Any) -> bool:
    if "equals" in condition:
        return _normal(value) == _normal(condition["equals"])
    if "not_equals" in condition:
        return _normal(value) != _normal(condition["not_equals"])
    return False


def config_effect(
    framework: str | None, framework_version: str | None, params: Mapping[str, Any], key: str,
    rules: tuple[ConfigRule, ...] | None = None,
) -> ConfigEffect:
    """What the run's configuration says about the series logged under the framework's ``key``."""
    fields: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    warnings: list[str] = []
    if not framework or not params:
        return ConfigEffect(fields, (), ())
    for rule in rules if rules is not None else default_rules():
        if rule.framework != framework or key not in rule.keys:
            continue
        found = _param(params, rule.params)
        if found is None:
            continue
        name, value = found
        if not version_holds(framework_version, rule.holds_for):
            notes.append(f"{name}={value} not read: the rule holds for {framework} {rule.holds_for}, "
                         f"this run declares {framework_version}")
            continue
        lookup = _normal(value)
        if rule.strip_suffix and lookup.endswith(rule.strip_suffix):
            lookup = lookup[: -len(rule.strip_suffix)]
        for field, mapping in rule.sets.items():
            if lookup in mapping:
                fields[field] = {"from": "config", "value": mapping[lookup], "param": name, "config_value": value,
                                 "source": rule.source, "verified_in": rule.verified_in}
            else:
                notes.append(f"{name}={value} is not a value this rule knows; {field} left at the framework default")
        if rule.note:
            notes.append(rule.note.replace("{value}", str(value)))
        if rule.warn_if and _matches(rule.warn_if, value):
            warnings.append(f"{key}: {name}={value}: {rule.message}")
    return ConfigEffect(fields, tuple(notes), tuple(warnings))


def algorithm_from_config(framework: str | None, params: Mapping[str, Any]) -> tuple[str, str] | None:
    """The algorithm a run's config names, for choosing between per-algorithm aliases: (algorithm, why)."""
    if framework == "verl":
        found = _param(params, ("algorithm.adv_estimator",))
        if found and str(found[1]).startswith("grpo"):
            return "grpo", f"{found[0]}={found[1]}"
    return None
