"""Values made safe for JSON output (no NaN, Infinity, numpy or datetime types) and text no database can store."""
from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """NaN and ±Inf become null, numpy scalars Python numbers, datetimes ISO 8601 text (recursively)."""
    # numpy scalars are recognised without importing numpy, which the CLI's start-up should not pay for
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def has_unstorable_text(value: Any) -> bool:
    """A NUL (PostgreSQL text cannot hold it) or a lone surrogate (no database can encode it), at any depth."""
    if isinstance(value, str):
        return "\x00" in value or not _encodes(value)
    if isinstance(value, dict):
        return any(has_unstorable_text(k) or has_unstorable_text(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_unstorable_text(v) for v in value)
    return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
