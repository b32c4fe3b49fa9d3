"""Turning raw cells, tokens and JSON values into steps and metric values.

Shared by the text importers so that "3.5 is not a step" and "abc is not a number"
are decided in one place and reported the same way.
"""
from __future__ import annotations

import math
from typing import Any

from registry.core.errors import InputError

# Names a step axis goes by, in order of preference when a file has several. W&B's
# ``_step`` only counts logging calls, so it is the last resort: a CleanRL run synced to
# W&B also has ``global_step``, the environment-step axis the curves are meant on.
# The trainer's own step comes before a logger's counter: transformers' W&B callback logs
# ``train/global_step`` with every call, SB3's logger ``time/total_timesteps``; W&B's ``_step``
# counts log calls (eval and train calls alike), so it is the last resort.
STEP_NAMES = ("step", "train/global_step", "global_step", "time/total_timesteps", "timesteps", "timestep",
              "iteration", "_step")
# Wall-clock columns: W&B ``_timestamp``, TensorBoard's CSV export "Wall time".
WALL_TIME_NAMES = ("wall_time", "_timestamp", "timestamp", "wall time")

# Steps end up in SQLite INTEGER columns and numpy int64 arrays.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def pick_column(names: list[str], candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` present in ``names`` (case-insensitive), as spelled in ``names``."""
    by_lower = {}
    for name in names:
        by_lower.setdefault(name.strip().lower(), name)
    for candidate in candidates:
        if candidate in by_lower:
            return by_lower[candidate]
    return None


def as_step(raw: Any, source: str, position: str) -> int:
    """An integer step from a cell, token or JSON value; InputError if it is not one.

    Integral floats (``"100.0"``, ``1e3``) are accepted because pandas writes integer
    columns with gaps as floats; ``3.5``, ``nan`` and text are not steps.
    """
    if isinstance(raw, bool):
        raise InputError(f"step must be an integer, got {raw!r}", source, position)
    if isinstance(raw, int):
        step = raw
    else:
        step = _integral(raw)
        if step is None:
            raise InputError(f"step must be an integer, got {_show(raw)}", source, position)
    if not _INT64_MIN <= step <= _INT64_MAX:
        raise InputError(f"step {step} does not fit in a 64-bit integer", source, position)
    return step


def _integral(raw: Any) -> int | None:
    text = raw.strip() if isinstance(raw, str) else raw
    if isinstance(text, str):
        try:
            return int(text)
        except ValueError:
            pass
    try:
        number = float(text)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number) or not number.is_integer():
        return None
    return int(number)


def parse_number(text: str) -> float | None:
    """The float a text cell spells (``nan``, ``inf``, ``-Infinity`` included), else None."""
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def as_value(raw: int | float, source: str, position: str) -> float:
    """A JSON number as float; integers too large for a double are an input error."""
    try:
        return float(raw)
    except OverflowError:
        raise InputError(f"value {_show(raw)} is too large for a float", source, position) from None


def _show(raw: Any, limit: int = 40) -> str:
    text = repr(raw) if not isinstance(raw, int) else str(raw)
    return text if len(text) <= limit else text[: limit - 3] + "..."
