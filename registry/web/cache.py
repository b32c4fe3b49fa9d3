"""A content-keyed cache of rendered plots and exported data.

The key names everything the bytes depend on (run id and ``data_version``, metric,
definition version, every display option), so an entry never goes stale: new data or a
dictionary edit simply asks for a different key, and old entries age out of the LRU.
The key's digest doubles as the HTTP ETag.

Entries live in memory (bounded by total bytes) and, when ``PLOT_CACHE_DIR`` is set, also
on disk so a restarted server or a second worker process starts warm. Concurrent requests
for the same cold key render it once.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def digest(key: Any) -> str:
    """A stable digest of a cache key made of str/int/float/bool/None/tuples."""
    return hashlib.sha256(repr(key).encode("utf-8")).hexdigest()[:32]


class PlotCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, directory: str | os.PathLike | None = None):
        self.max_bytes = int(max_bytes)
        self.directory = Path(directory) if directory else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tag: str) -> bytes | None:
        with self._lock:
            data = self._entries.get(tag)
            if data is not None:
                self._entries.move_to_end(tag)
                self.hits += 1
                return data
        if self.directory is not None:
            path = self.directory / tag
            try:
                data = path.read_bytes()
            except OSError:
                data = None
            if data is not None:
                self._remember(tag, data)
                with self._lock:
                    self.hits += 1
                return data
        return None

    def _remember(self, tag: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(tag, None)
            if old is not None:
                self._size -= len(old)
            self._entries[tag] = data
            self._size += len(data)
            while self._size > self.max_bytes and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._size -= len(dropped)

    def put(self, tag: str, data: bytes) -> None:
        self._remember(tag, data)
        if self.directory is not None:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self.directory / tag)
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def get_or_create(self, tag: str, make: Callable[[], bytes]) -> tuple[bytes, bool]:
        """The cached bytes for ``tag``, made once by ``make`` on a miss; returns (bytes, was_hit)."""
        data = self.get(tag)
        if data is not None:
            return data, True
        with self._lock:
            flight = self._inflight.setdefault(tag, threading.Lock())
        with flight:
            data = self.get(tag)  # another thread may have made it while we waited
            if data is not None:
                return data, True
            try:
                data = make()
                self.put(tag, data)
            finally:
                with self._lock:
                    self._inflight.pop(tag, None)
        with self._lock:
            self.misses += 1
        return data, False

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0
        if self.directory is not None:
            for path in self.directory.iterdir():
                if path.is_file():
                    try:
                        path.unlink()
                    except OSError:
                        pass

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._size, "hits": self.hits, "misses": self.misses}
