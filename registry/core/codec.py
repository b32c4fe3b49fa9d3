"""Compact encoding of a series chunk: little-endian int64 steps and float64 values.

A whole chunk is one row, so a 100k-point curve reads back in one query and decodes with
``numpy.frombuffer`` (no per-point Python objects). NaN and Inf survive bit for bit.
"""
from __future__ import annotations

import numpy as np

STEP_DTYPE = np.dtype("<i8")
VALUE_DTYPE = np.dtype("<f8")


def encode_steps(steps: np.ndarray) -> bytes:
    return np.ascontiguousarray(steps, dtype=STEP_DTYPE).tobytes()


def encode_values(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype=VALUE_DTYPE).tobytes()


def decode_steps(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=STEP_DTYPE)


def decode_values(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=VALUE_DTYPE)
