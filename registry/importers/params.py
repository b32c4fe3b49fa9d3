"""Hyperparameters from a YAML / JSON file and from ``key=value`` arguments.

Nested mappings stay nested; the store flattens them. Dotted argument keys nest too
(``optim.lr=1e-4`` -> ``{"optim": {"lr": 0.0001}}``), so an argument overrides the
matching entry of a file through ``merge_params``.

YAML 1.1 (what PyYAML implements) reads ``3e-4`` as a string, ``010`` as 8, ``1:30``
as 90 and ``no`` / ``off`` as False, all of which corrupt a hyperparameter quietly.
Files are therefore read with YAML 1.2 core-schema scalars: decimal ints (and
0x/0o), floats with or without a dot before the exponent, ``.inf`` / ``.nan``, and only
true/false as booleans. A Hydra ``overrides.yaml`` (a list of ``key=value`` strings)
is read as those assignments.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import yaml

from registry.core.errors import InputError
from registry.core.yaml12 import Yaml12Loader

_NULL_WORDS = {"null", "Null", "NULL", "~", "None"}
_BOOL_WORDS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}



def load_params_file(path: Path | str) -> dict[str, Any]:
    """The hyperparameters in a YAML or JSON file (``.json`` is JSON, anything else YAML)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"cannot read parameter file ({exc.strerror})", str(path)) from None
    except UnicodeDecodeError:
        raise InputError("parameter file is not UTF-8 text", str(path)) from None
    data = _parse_json(text, path) if path.suffix.lower() == ".json" else _parse_yaml(text, path)
    if data is None:
        return {}
    if isinstance(data, list) and all(isinstance(item, str) and "=" in item for item in data):
        return params_from_assignments(data)
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping of names to values, got {type(data).__name__}", str(path))
    return {str(key): value for key, value in data.items()}


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", str(path), f"line {exc.lineno}, column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not valid JSON: {exc}", str(path)) from None


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - Yaml12Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        raise InputError(f"not valid YAML: {exc.problem or exc.context}", str(path), where) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise InputError(f"not valid YAML: {exc}", str(path)) from None


def parse_assignment(text: str) -> tuple[str, Any]:
    """``("lr", 0.0003)`` from ``"lr=3e-4"``; the value is typed by ``parse_value``."""
    where = f"parameter {text!r}"
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals:
        raise InputError("expected key=value", where)
    if not key or any(ch.isspace() for ch in key) or "" in key.split("."):
        raise InputError(f"bad parameter name {key!r}", where)
    return key, parse_value(raw, where)


def parse_value(raw: str, where: str = "parameter") -> Any:
    """A command-line value typed the way a user means it.

    int, then float (``3e-4``, ``inf``), then true/false and null/None, then a quoted
    string (quotes removed, so ``"3"`` stays text), then a YAML flow list or mapping
    (``[64, 64]``), else the text itself (``PPO``, ``CartPole-v1``).
    """
    text = raw.strip()
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    if text in _BOOL_WORDS:
        return _BOOL_WORDS[text]
    if text in _NULL_WORDS:
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text[:1] in ("[", "{"):
        try:
            return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506
        except (yaml.YAMLError, RecursionError) as exc:
            raise InputError(f"not a valid list or mapping ({exc})", where) from None
    return text


def params_from_assignments(assignments: Iterable[str]) -> dict[str, Any]:
    """Nested params from ``key=value`` strings; later assignments win."""
    params: dict[str, Any] = {}
    for text in assignments:
        key, value = parse_assignment(text)
        *parents, leaf = key.split(".")
        node = params
        for depth, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                prefix = ".".join(parents[: depth + 1])
                raise InputError(f"{prefix!r} was already given a value, so it cannot hold {key!r}",
                                 f"parameter {text!r}")
            node = child
        node[leaf] = value
    return params


def merge_params(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in, nested mappings merged key by key; inputs untouched."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_params(merged[key], value)
        else:
            merged[key] = value
    return merged
