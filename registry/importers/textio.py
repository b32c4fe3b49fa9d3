"""Reading a text file line by line with exact line numbers.

Lines are read as bytes and decoded one at a time so that a bad byte is reported at
its line (a text-mode file object only says "somewhere in this 8 KB chunk").
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from registry.core.errors import InputError

_BOM = "\ufeff"


def numbered_lines(path: Path, *, errors: str = "strict") -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` from 1, line endings kept; a leading BOM is dropped.

    With ``errors="strict"`` undecodable UTF-8 is an InputError naming the line;
    ``"replace"`` suits console logs, where stray bytes sit in lines we ignore anyway.
    """
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"not UTF-8 text (byte {exc.start + 1} of the line)", str(path), f"line {number}"
                ) from None
            if number == 1 and text.startswith(_BOM):
                text = text[1:]
            yield number, text


def read_head(path: Path, size: int = 65536) -> bytes:
    """The first ``size`` bytes of a file, for sniffing its format."""
    with open(path, "rb") as handle:
        return handle.read(size)
