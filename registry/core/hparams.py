"""Hyperparameters: nested dicts flattened to dotted keys, each value stored with its type."""
from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

VALUE_TYPES = ("int", "float", "bool", "str", "null")


def flatten(params: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-5}}`` -> ``{"optim.lr": 1e-5}`` (``sep="/"``: ``optim/lr``, as metric keys nest)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, prefix=f"{name}{sep}", sep=sep))
        else:
            out[name] = value
    return out


def typed_value(value: Any) -> tuple[str, float | None, str | None]:
    """(value_type, numeric value, text value) for one hyperparameter value.

    Numbers keep a numeric column so that ``lr>1e-5`` compares numbers, not strings; the
    text column keeps the exact value for display and equality on strings.
    """
    if value is None:
        return "null", None, None
    if isinstance(value, bool):
        return "bool", float(value), "true" if value else "false"
    if isinstance(value, int):
        return "int", float(value), str(value)
    if isinstance(value, float):
        num = value if math.isfinite(value) else None
        return "float", num, repr(value)
    if isinstance(value, (list, tuple)):
        return "str", None, "[" + ", ".join(str(v) for v in value) + "]"
    return "str", None, str(value)


def restore_value(value_type: str, num: float | None, text: str | None) -> Any:
    """Inverse of :func:`typed_value` for display and export."""
    if value_type == "null":
        return None
    if value_type == "bool":
        return text == "true"
    if value_type == "int":
        return int(text) if text is not None else None
    if value_type == "float":
        return float(text) if text is not None else num
    return text


def iter_typed(params: Mapping[str, Any]) -> Iterator[tuple[str, str, float | None, str | None]]:
    for key, value in flatten(params).items():
        yield (key, *typed_value(value))
