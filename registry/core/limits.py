"""Bounds on the work one registration or request may cause, so one bad input cannot stall others.

The defaults are generous for real training logs (a verl run logs about 200 keys; a run has a
handful of tags and at most a few thousand checkpoints). ``config.load_limits`` reads them from
the environment (``RLREG_MAX_*``); every breach is a :class:`~registry.core.errors.LimitExceededError`
naming the limit and its setting.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.core.errors import LimitExceededError

INT64 = 2**63


@dataclass(frozen=True)
class Limits:
    max_metric_keys: int = 5000          # distinct metric keys in one registration or batch
    max_line_bytes: int = 16 * 1024 * 1024  # one line of a text log (CSV, JSONL, verl)
    max_tags: int = 1000                 # tags on one run
    max_checkpoints: int = 10000         # checkpoints in one outcome
    max_json_depth: int = 32             # nesting of a JSON body or hyperparameter document
    max_page: int = 1_000_000            # page numbers of listings
    max_decompress_seconds: float = 5.0  # CPU time to unpack one uploaded archive

    def check_keys(self, count: int, source: str | None = None) -> None:
        if count > self.max_metric_keys:
            raise LimitExceededError(f"more than {self.max_metric_keys} distinct metric keys (RLREG_MAX_METRIC_KEYS)",
                                     source)

    def check_tags(self, count: int) -> None:
        if count > self.max_tags:
            raise LimitExceededError(f"{count} tags; at most {self.max_tags} per run (RLREG_MAX_TAGS)")

    def check_checkpoints(self, count: int) -> None:
        if count > self.max_checkpoints:
            raise LimitExceededError(f"{count} checkpoints; at most {self.max_checkpoints} per run "
                                     "(RLREG_MAX_CHECKPOINTS)")

    def check_depth(self, value: Any, what: str) -> None:
        """Refuse nesting deeper than ``max_json_depth`` and integers outside int64 (walked without recursion)."""
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            if isinstance(item, (dict, list)):
                if depth > self.max_json_depth:
                    raise LimitExceededError(f"{what}: nested more than {self.max_json_depth} levels deep "
                                             "(RLREG_MAX_JSON_DEPTH)")
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
            elif isinstance(item, int) and not isinstance(item, bool) and not -INT64 <= item < INT64:
                raise LimitExceededError(f"{what}: the integer {str(item)[:20]}... ({len(str(item))} digits) "
                                         "is outside the int64 range (64 bits)")
            elif isinstance(item, float) and not math.isfinite(item) and what == "the request body":
                raise LimitExceededError(f"{what}: a number too large for a float (it would become {item}); "
                                         "send non-finite values as the strings \"NaN\", \"Infinity\", \"-Infinity\"")

    def check_line_lengths(self, path: Path) -> None:
        """Refuse a text file with a line longer than ``max_line_bytes``, reading it in bounded chunks
        (an importer reading such a line whole would hold it, and its pieces, in memory)."""
        if not path.is_file():
            return
        chunk_size = 1 << 20
        run = 0  # bytes since the last newline
        line = 1
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                start = 0
                while True:
                    nl = chunk.find(b"\n", start)
                    if nl < 0:
                        run += len(chunk) - start
                        break
                    run += nl - start
                    if run > self.max_line_bytes:
                        break
                    run = 0
                    line += 1
                    start = nl + 1
                if run > self.max_line_bytes:
                    raise LimitExceededError(f"line {line} is longer than {self.max_line_bytes} bytes "
                                             "(RLREG_MAX_LINE_BYTES)", str(path), f"line {line}", status=413)


DEFAULT_LIMITS = Limits()
