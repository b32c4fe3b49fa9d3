"""Streaming a run from a training loop: ``Registry.create_run(...)`` returns a :class:`RunHandle`."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from registry.core.errors import InputError, RegistryError
from registry.core.series import SeriesData

if TYPE_CHECKING:
    from registry.store.facade import Registry


class RunHandle:
    """Streams metrics from a training loop: buffered, append-only, safe to call every step."""

    def __init__(
        self, registry: Registry, run_id: str, framework: str | None, algorithm: str | None,
        semantics: Mapping[str, Mapping[str, Any]] | None = None,
        flush_points: int = 20000,
    ):
        self.registry = registry
        self.id = run_id
        self.framework = framework
        self.algorithm = algorithm
        self.semantics = dict(semantics or {})
        self.flush_points = flush_points
        self._buffer: dict[str, tuple[list[int], list[float], list[float]]] = {}
        self._buffered = 0
        self._last_step: dict[str, int] = {}

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float | None = None) -> None:
        """Buffer one step's metrics (wall time: now, unless given); flushed every ``flush_points`` points
        and on finish."""
        step = int(step)
        now = time.time()
        for key, value in metrics.items():
            last = self._last_step.get(key)
            if last is not None and step < last:
                raise InputError(f"metric {key!r}: step {step} is before step {last}; series are append-only")
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise InputError(f"metric {key!r} at step {step}: value {value!r} is not a number") from None
            steps, values, walls = self._buffer.setdefault(key, ([], [], []))
            steps.append(step)
            values.append(value)
            walls.append(now if wall_time is None else float(wall_time))
            self._last_step[key] = step
            self._buffered += 1
        if self._buffered >= self.flush_points:
            self.flush()

    def log_series(self, key: str, steps: Sequence[int], values: Sequence[float]) -> None:
        """Append many points of one metric at once."""
        self.flush()
        self.registry.append(self.id, {key: SeriesData(np.asarray(steps, np.int64), np.asarray(values, np.float64))},
                             overrides=self.semantics)
        if len(steps):
            self._last_step[key] = int(steps[-1])

    def flush(self, batch_id: str | None = None) -> None:
        if not self._buffer:
            return
        data = {
            k: SeriesData(np.asarray(s, np.int64), np.asarray(v, np.float64),
                          None if all(w != w for w in ws) else np.asarray(ws, np.float64))
            for k, (s, v, ws) in self._buffer.items()
        }
        self.registry.append(self.id, data, batch_id=batch_id, overrides=self.semantics)
        self._buffer.clear()
        self._buffered = 0

    def set_outcome(self, **outcome: Any) -> None:
        self.registry.set_outcome(self.id, **outcome)

    def finish(self, status: str = "finished") -> None:
        self.flush()
        self.registry.set_status(self.id, status)

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.finish()
            return
        try:
            self.flush()
        except RegistryError:
            pass  # the original exception is the one worth seeing
        self.registry.set_status(self.id, "crashed")
