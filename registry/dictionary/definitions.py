"""The metric dictionary: validation, versioned edits, YAML/JSON import and export.

The document format (``format: rlregistry-dictionary``) is the one the shipped default
uses (``registry/dictionary/data/default_dictionary.yaml``), so a team can keep its dictionary in git
and ``rlreg dictionary import`` it. Every change to a definition bumps its version and
stores a full snapshot, so a run can show the definition as it was when it was registered.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from registry.core.errors import DefinitionError, InputError, NotFoundError
from registry.core.yaml12 import Yaml12Loader
from registry.db.models import DefinitionVersion, MetricAlias, MetricDefinition, utcnow
from registry.core.semantics import AVERAGING, ENUMS, KL_ESTIMATORS, LOGGING_POINTS, NORMALIZATION_AXES, check_enum

DOCUMENT_FORMAT = "rlregistry-dictionary"
FRAMEWORKS = ("verl", "trl", "openrlhf", "stable-baselines3", "cleanrl", "custom")

DEFINITION_FIELDS = (
    "name", "display_name", "layer", "quantity", "description", "formula", "unit",
    "higher_is_better", "averaging", "kl_estimator", "normalization_axis", "logging_point",
    "healthy_range", "task_ranges", "smoothing_window", "aliases",
)
ALIAS_FIELDS = (
    "framework", "algorithm", "key", "averaging", "kl_estimator", "normalization_axis",
    "logging_point", "sign", "aggregation", "source", "notes",
)
ALIAS_ENUMS = {
    "averaging": AVERAGING,
    "kl_estimator": KL_ESTIMATORS,
    "normalization_axis": NORMALIZATION_AXES,
    "logging_point": LOGGING_POINTS,
}
EDITABLE_FIELDS = tuple(f for f in DEFINITION_FIELDS if f != "name")


def default_dictionary_text() -> str:
    return resources.files("registry").joinpath("dictionary/data/default_dictionary.yaml").read_text(encoding="utf-8")


def parse_document(text: str, source: str = "<dictionary>") -> list[dict[str, Any]]:
    """Parse a YAML or JSON dictionary document into validated definition dicts."""
    try:
        # YAML 1.2 numbers: PyYAML's 1.1 resolver reads JSON's 1e-06 as a string.
        doc = yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        raise InputError(f"not valid YAML/JSON: {getattr(exc, 'problem', exc)}", source, position) from None
    if isinstance(doc, list):
        items = doc
    elif isinstance(doc, Mapping):
        if doc.get("format", DOCUMENT_FORMAT) != DOCUMENT_FORMAT:
            raise InputError(f"format must be {DOCUMENT_FORMAT!r}, got {doc.get('format')!r}", source)
        items = doc.get("definitions")
        if not isinstance(items, list):
            raise InputError("expected a 'definitions' list", source)
    else:
        raise InputError("expected a mapping with a 'definitions' list", source)
    specs = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"definitions[{i}]"
        try:
            spec = validate_definition(item)
        except DefinitionError as exc:
            raise InputError(str(exc), source, where) from None
        if spec["name"] in seen:
            raise InputError(f"duplicate definition name {spec['name']!r}", source, where)
        seen.add(spec["name"])
        specs.append(spec)
    _check_alias_uniqueness(specs, source)
    return specs


def read_document(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", str(path)) from None
    return parse_document(text, str(path))


def _check_alias_uniqueness(specs: Iterable[Mapping[str, Any]], source: str) -> None:
    owner: dict[tuple[str, str, str], str] = {}
    for spec in specs:
        for alias in spec["aliases"]:
            ident = (alias["framework"], alias["algorithm"], alias["key"])
            if ident in owner and owner[ident] != spec["name"]:
                raise InputError(
                    f"alias {alias['framework']}:{alias['key']} is claimed by both "
                    f"{owner[ident]!r} and {spec['name']!r}",
                    source,
                )
            owner[ident] = spec["name"]


def _optional_float(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DefinitionError(f"{what} must be a number or null, got {value!r}")
    if math.isnan(value):
        raise DefinitionError(f"{what} must not be NaN")
    return float(value)


def _range(value: Any, what: str) -> dict[str, float | None]:
    if value is None:
        return {"low": None, "high": None}
    if not isinstance(value, Mapping):
        raise DefinitionError(f"{what} must be a mapping with low/high")
    low = _optional_float(value.get("low"), f"{what}.low")
    high = _optional_float(value.get("high"), f"{what}.high")
    if low is not None and high is not None and low > high:
        raise DefinitionError(f"{what}: low {low} is above high {high}")
    return {"low": low, "high": high}


def _task_range_spec(value: Any, what: str) -> dict[str, Any]:
    """A task range: low/high, and optionally where the numbers come from (``source``, text)."""
    out: dict[str, Any] = _range(value, what)
    source = value.get("source") if isinstance(value, Mapping) else None
    if source is not None and str(source).strip():
        out["source"] = _text(source, f"{what}.source", 500).strip()
    return out


def _text(value: Any, what: str, max_len: int = 20000) -> str:
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)):
        raise DefinitionError(f"{what} must be text")
    text = str(value)
    if len(text) > max_len:
        raise DefinitionError(f"{what} is longer than {max_len} characters")
    return text


def validate_definition(item: Any) -> dict[str, Any]:
    """Check one definition dict and return it normalised (every field present)."""
    if not isinstance(item, Mapping):
        raise DefinitionError("a definition must be a mapping")
    unknown = set(item) - set(DEFINITION_FIELDS)
    if unknown:
        raise DefinitionError(f"unknown field(s) {', '.join(sorted(unknown))}")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise DefinitionError("name is required (text, at most 100 characters)")
    where = f"definition {name!r}"
    spec: dict[str, Any] = {"name": name.strip()}
    spec["display_name"] = _text(item.get("display_name") or name, f"{where}: display_name", 200)
    for f in ("layer", "quantity"):
        if item.get(f) is None:
            raise DefinitionError(f"{where}: {f} is required")
    for f in ("layer", "quantity", "averaging", "kl_estimator", "normalization_axis", "logging_point"):
        try:
            check_enum(f, item.get(f))
        except ValueError as exc:
            raise DefinitionError(f"{where}: {exc}") from None
        spec[f] = item.get(f)
    for f in ("description", "formula", "unit"):
        spec[f] = _text(item.get(f), f"{where}: {f}")
    hib = item.get("higher_is_better")
    if hib is not None and not isinstance(hib, bool):
        raise DefinitionError(f"{where}: higher_is_better must be true, false or null")
    spec["higher_is_better"] = hib
    spec["healthy_range"] = _range(item.get("healthy_range"), f"{where}: healthy_range")
    task_ranges = item.get("task_ranges") or {}
    if not isinstance(task_ranges, Mapping):
        raise DefinitionError(f"{where}: task_ranges must map task names to ranges")
    spec["task_ranges"] = {str(t): _task_range_spec(r, f"{where}: task_ranges[{t}]") for t, r in task_ranges.items()}
    window = item.get("smoothing_window", 10)
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 100000:
        raise DefinitionError(f"{where}: smoothing_window must be a whole number of points >= 1")
    spec["smoothing_window"] = window
    aliases = item.get("aliases") or []
    if not isinstance(aliases, list):
        raise DefinitionError(f"{where}: aliases must be a list")
    spec["aliases"] = [validate_alias(a, f"{where}: aliases[{i}]") for i, a in enumerate(aliases)]
    return spec


def validate_alias(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise DefinitionError(f"{where} must be a mapping")
    unknown = set(item) - set(ALIAS_FIELDS)
    if unknown:
        raise DefinitionError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    framework = item.get("framework")
    if framework not in FRAMEWORKS:
        raise DefinitionError(f"{where}: framework must be one of {', '.join(FRAMEWORKS)}; got {framework!r}")
    key = item.get("key")
    if not isinstance(key, str) or not key or len(key) > 300:
        raise DefinitionError(f"{where}: key is required (text, at most 300 characters)")
    alias: dict[str, Any] = {"framework": framework, "algorithm": str(item.get("algorithm") or ""), "key": key}
    for f, allowed in ALIAS_ENUMS.items():
        value = item.get(f)
        if value is not None and value not in allowed:
            raise DefinitionError(f"{where}: {f} must be one of {', '.join(allowed)}; got {value!r}")
        alias[f] = value
    sign = item.get("sign", 1)
    if isinstance(sign, bool) or not isinstance(sign, (int, float)) or sign == 0 or not math.isfinite(sign):
        raise DefinitionError(f"{where}: sign must be a non-zero number (1, or -1 for a negated quantity)")
    alias["sign"] = float(sign)
    for f in ("aggregation", "source", "notes"):
        alias[f] = _text(item.get(f), f"{where}: {f}")
    return alias


# --- rows <-> dicts ---------------------------------------------------------------


def definition_to_dict(defn: MetricDefinition) -> dict[str, Any]:
    """The document form of a stored definition (also its version snapshot)."""
    return {
        "name": defn.name,
        "display_name": defn.display_name,
        "layer": defn.layer,
        "quantity": defn.quantity,
        "description": defn.description,
        "formula": defn.formula,
        "unit": defn.unit,
        "higher_is_better": defn.higher_is_better,
        "averaging": defn.averaging,
        "kl_estimator": defn.kl_estimator,
        "normalization_axis": defn.normalization_axis,
        "logging_point": defn.logging_point,
        "healthy_range": {"low": defn.healthy_low, "high": defn.healthy_high},
        "task_ranges": dict(defn.task_ranges or {}),
        "smoothing_window": defn.smoothing_window,
        "aliases": [alias_to_dict(a) for a in sorted(defn.aliases, key=lambda a: (a.framework, a.algorithm, a.key))],
    }


def alias_to_dict(alias: MetricAlias) -> dict[str, Any]:
    return {f: getattr(alias, f) for f in ALIAS_FIELDS}


def _apply_spec(defn: MetricDefinition, spec: Mapping[str, Any]) -> None:
    for f in ("display_name", "layer", "quantity", "description", "formula", "unit", "higher_is_better",
              "averaging", "kl_estimator", "normalization_axis", "logging_point", "task_ranges",
              "smoothing_window"):
        setattr(defn, f, spec[f])
    defn.healthy_low = spec["healthy_range"]["low"]
    defn.healthy_high = spec["healthy_range"]["high"]
    existing = {(a.framework, a.algorithm, a.key): a for a in defn.aliases}
    wanted = {(a["framework"], a["algorithm"], a["key"]): a for a in spec["aliases"]}
    for ident, alias in existing.items():
        if ident not in wanted:
            defn.aliases.remove(alias)
    for ident, data in wanted.items():
        alias = existing.get(ident)
        if alias is None:
            alias = MetricAlias(**data)
            defn.aliases.append(alias)
        else:
            for f in ALIAS_FIELDS:
                setattr(alias, f, data[f])


def _changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [f for f in DEFINITION_FIELDS if old.get(f) != new.get(f)]


def _record_version(session: Session, defn: MetricDefinition, author: str, note: str, changed: list[str]) -> None:
    defn.updated_at = utcnow()
    defn.updated_by = author
    session.add(
        DefinitionVersion(
            definition=defn,
            version=defn.version,
            snapshot=definition_to_dict(defn),
            author=author,
            change_note=note,
            changed_fields=changed,
        )
    )


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {"created": self.created, "updated": self.updated, "unchanged": self.unchanged}


def _claimed_aliases(session: Session) -> dict[tuple[str, str, str], str]:
    rows = session.execute(
        select(MetricAlias.framework, MetricAlias.algorithm, MetricAlias.key, MetricDefinition.name).join(
            MetricDefinition
        )
    )
    return {(fw, algo, key): name for fw, algo, key, name in rows}


def import_definitions(
    session: Session, specs: list[dict[str, Any]], author: str, note: str = "imported"
) -> ImportReport:
    """Create or update definitions from validated specs; each real change is a new version."""
    report = ImportReport()
    by_name = {
        d.name: d
        for d in session.scalars(select(MetricDefinition).options(selectinload(MetricDefinition.aliases)))
    }
    claimed = _claimed_aliases(session)
    for spec in specs:
        for alias in spec["aliases"]:
            ident = (alias["framework"], alias["algorithm"], alias["key"])
            if claimed.get(ident, spec["name"]) != spec["name"]:
                raise DefinitionError(
                    f"alias {alias['framework']}:{alias['key']} of {spec['name']!r} already belongs to "
                    f"{claimed[ident]!r}; move it there first or edit that definition"
                )
    for spec in specs:
        defn = by_name.get(spec["name"])
        if defn is None:
            defn = MetricDefinition(name=spec["name"], version=1)
            _apply_spec(defn, spec)
            session.add(defn)
            _record_version(session, defn, author, note, list(DEFINITION_FIELDS))
            report.created.append(spec["name"])
            continue
        changed = _changed_fields(definition_to_dict(defn), spec)
        if not changed:
            report.unchanged.append(spec["name"])
            continue
        _apply_spec(defn, spec)
        defn.version += 1
        _record_version(session, defn, author, note, changed)
        report.updated.append(spec["name"])
    session.flush()
    return report


def update_definition(
    session: Session, name: str, changes: Mapping[str, Any], author: str, note: str = ""
) -> MetricDefinition:
    """Apply a partial edit (from the web form or the API) as a new version."""
    defn = get_definition(session, name)
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise DefinitionError(f"cannot edit field(s) {', '.join(sorted(unknown))}")
    merged = {**definition_to_dict(defn), **changes, "name": defn.name}
    spec = validate_definition(merged)
    for alias in spec["aliases"]:
        ident = (alias["framework"], alias["algorithm"], alias["key"])
        owner = _claimed_aliases(session).get(ident, defn.name)
        if owner != defn.name:
            raise DefinitionError(f"alias {alias['framework']}:{alias['key']} already belongs to {owner!r}")
    changed = _changed_fields(definition_to_dict(defn), spec)
    if not changed:
        return defn
    _apply_spec(defn, spec)
    defn.version += 1
    _record_version(session, defn, author, note or f"edited {', '.join(changed)}", changed)
    session.flush()
    return defn


def get_definition(session: Session, name: str) -> MetricDefinition:
    defn = session.scalar(
        select(MetricDefinition)
        .where(MetricDefinition.name == name)
        .options(selectinload(MetricDefinition.aliases), selectinload(MetricDefinition.versions))
    )
    if defn is None:
        hint = definition_suggestions(session, name)
        raise NotFoundError(f"no metric definition named {name!r}"
                            + (f"; did you mean {', '.join(hint)}?" if hint else ""))
    return defn


def definition_suggestions(session: Session, text: str, limit: int = 5) -> list[str]:
    """Definitions a user may have meant by ``text``: those a framework logs under that key (TRL's
    ``kl`` is ``kl_ref_mean``), then names containing it, then names spelled like it."""
    import difflib

    by_alias = session.execute(
        select(MetricDefinition.name, MetricAlias.framework).join(MetricAlias)
        .where(func.lower(MetricAlias.key) == text.lower()).order_by(MetricDefinition.name)
    ).all()
    names = list(session.scalars(select(MetricDefinition.name).order_by(MetricDefinition.name)))
    hints = list(dict.fromkeys(f"{n} ({fw}'s {text!r})" for n, fw in by_alias))  # one per framework
    seen = {n for n, _ in by_alias}
    hints += [n for n in names if text.lower() in n.lower() and n not in seen]
    hints += [n for n in difflib.get_close_matches(text, names, n=limit) if n not in seen and n not in hints]
    return hints[:limit]


def definition_as_of(session: Session, definition_id: int, version: int) -> dict[str, Any] | None:
    """The snapshot of a definition at a given version (what a run was registered against)."""
    row = session.scalar(
        select(DefinitionVersion).where(
            DefinitionVersion.definition_id == definition_id, DefinitionVersion.version == version
        )
    )
    return dict(row.snapshot) if row else None


def dictionary_stamp(session: Session) -> str:
    """Changes with every definition edit (each bumps a version), addition or removal: one aggregate
    query, so callers can keep what they derived from the dictionary until it changes."""
    D = MetricDefinition
    n, total, top = session.execute(
        select(func.count(D.id), func.coalesce(func.sum(D.version), 0), func.coalesce(func.max(D.id), 0))).one()
    return f"{n}.{total}.{top}"


def list_definitions(session: Session, layer: str | None = None) -> list[MetricDefinition]:
    query = select(MetricDefinition).options(selectinload(MetricDefinition.aliases)).order_by(
        MetricDefinition.layer, MetricDefinition.name
    )
    if layer:
        query = query.where(MetricDefinition.layer == layer)
    return list(session.scalars(query))


def export_document(session: Session) -> dict[str, Any]:
    return {
        "format": DOCUMENT_FORMAT,
        "version": 1,
        "definitions": [definition_to_dict(d) for d in list_definitions(session)],
    }


def dump_document(document: Mapping[str, Any], fmt: str = "yaml") -> str:
    if fmt == "json":
        return json.dumps(document, indent=2, sort_keys=False) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True, width=100)
    raise InputError(f"unknown dictionary format {fmt!r}; use yaml or json")


def ensure_default_dictionary(session: Session) -> ImportReport | None:
    """Load the shipped dictionary into an empty registry; leave a team's own dictionary alone."""
    if session.scalar(select(MetricDefinition.id).limit(1)) is not None:
        return None
    specs = parse_document(default_dictionary_text(), "default_dictionary.yaml")
    return import_definitions(session, specs, author="system", note="shipped default dictionary")


def _task_range(task_ranges: Mapping[str, Any], task: str) -> Mapping[str, Any] | None:
    """The range kept for ``task``: exact name, then case-insensitive, then ignoring a ``-vN`` suffix."""
    if task in task_ranges:
        return task_ranges[task]
    base = task.lower().rsplit("-v", 1)[0]
    for key, rng in task_ranges.items():
        if str(key).lower() == task.lower() or str(key).lower().rsplit("-v", 1)[0] == base:
            return rng
    return None


def task_range_for(defn: Mapping[str, Any], task: str | None) -> Mapping[str, Any] | None:
    """The definition's own range for ``task`` (with its ``source`` when recorded), None when it has none."""
    return _task_range(defn.get("task_ranges") or {}, task) if task else None


def healthy_range_for(defn: Mapping[str, Any], task: str | None) -> tuple[float | None, float | None]:
    """The task's own range when the definition has one, else the general range."""
    chosen = (_task_range(defn.get("task_ranges") or {}, task) if task else None) or defn.get("healthy_range") or {}
    low, high = chosen.get("low"), chosen.get("high")
    return (None if low is None else float(low)), (None if high is None else float(high))


__all__ = [
    "DOCUMENT_FORMAT", "ENUMS", "FRAMEWORKS", "ImportReport", "definition_as_of", "definition_to_dict",
    "dictionary_stamp", "dump_document", "ensure_default_dictionary", "export_document", "get_definition",
    "healthy_range_for", "task_range_for", "import_definitions", "list_definitions", "parse_document", "read_document", "update_definition",
]
