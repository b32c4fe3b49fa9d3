"""What the store tells its subscribers, so that the layers above it never have to be imported by it.

Two events:

- ``series written`` — inside the write transaction, after a run's series changed
  (registration, appended points, a finish). A subscriber works in the same session,
  so what it writes commits or rolls back with the points (the similar-run index).
- ``run committed`` — after the transaction committed. A subscriber's failure is logged,
  never raised: the registration stands (the diagnosis is recomputed when next read).

The analysis layer subscribes when a registry is opened (:func:`registry.open_registry`).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from registry.store.facade import Registry

SeriesWritten = Callable[["Session", str], None]
RunCommitted = Callable[["Registry", str], None]

log = logging.getLogger(__name__)


class Hooks:
    """The subscribers of one open registry."""

    def __init__(self) -> None:
        self.series_written: list[SeriesWritten] = []
        self.run_committed: list[RunCommitted] = []

    def on_series_written(self, subscriber: SeriesWritten) -> None:
        self.series_written.append(subscriber)

    def on_run_committed(self, subscriber: RunCommitted) -> None:
        self.run_committed.append(subscriber)

    def publish_series_written(self, session: Session, run_id: str) -> None:
        """Call every subscriber inside the caller's transaction; an error rolls the write back."""
        for subscriber in self.series_written:
            subscriber(session, run_id)

    def publish_run_committed(self, registry: Registry, run_id: str) -> None:
        """Call every subscriber after the commit; an error is logged and the next one still runs."""
        for subscriber in self.run_committed:
            try:
                subscriber(registry, run_id)
            except Exception as exc:  # noqa: BLE001 - a subscriber must never fail a registration
                log.warning("run %s registered; %s failed: %s", run_id,
                            getattr(subscriber, "__qualname__", subscriber), exc)
