"""Where a streamed run goes: a registry database opened here, or a registry server over HTTP.

Both take the same records (run spec, batches with ids, outcome, status) and report failures
as one of two exceptions: :class:`TargetDown` (try again later) or :class:`TargetRefused`
(this record will never be accepted: drop it).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Protocol

import numpy as np

from config import logging_target
from registry import open_registry
from registry.client import RemoteAuthError, RemoteError, RemoteRegistry
from registry.core.errors import AlreadyRegisteredError, RegistryError
from registry.core.series import SeriesData


class TargetDown(Exception):
    """The registry could not be reached or failed for a reason unrelated to the record."""


class TargetRefused(Exception):
    """The registry refused the record on its merits."""


class Target(Protocol):
    def describe(self) -> str: ...
    def create(self, spec: Mapping[str, Any]) -> None: ...
    def send(self, run_id: str, record: Mapping[str, Any]) -> None: ...


def json_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def open_target(*, url: str | None = None, token: str | None = None, db: str | None = None,
                retry_seconds: float = 2.0) -> Target:
    """A server when ``url`` (or ``RLREG_URL``) is set, else the database ``db`` / ``RLREG_DATABASE_URL``."""
    env = logging_target()
    url = url or (None if db else env["url"])
    if url:
        token = token or env["token"]
        if not token:
            raise ValueError("a registry server URL needs a token (RLREG_TOKEN; `rlreg token create`)")
        return RemoteTarget(url, token, retry_seconds=retry_seconds)
    return LocalTarget(db or env["db"])


class LocalTarget:
    """A registry database opened in this process (SQLite file or PostgreSQL)."""

    def __init__(self, url: str | None):
        self.registry = open_registry(url)
        self.url = self.registry.engine.url.render_as_string(hide_password=True)

    def describe(self) -> str:
        return self.url

    def _call(self, fn, *args: Any, **kwargs: Any) -> Any:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return fn(*args, **kwargs)
        except AlreadyRegisteredError:
            return None  # the run exists: a create replayed from a spool
        except RegistryError as exc:
            raise TargetRefused(str(exc)) from exc
        except (SQLAlchemyError, OSError) as exc:
            raise TargetDown(f"{type(exc).__name__}: {exc}") from exc

    def create(self, spec: Mapping[str, Any]) -> None:
        spec = dict(spec)
        name = spec.pop("name")
        self._call(self.registry.create_run, name, **spec)

    def send(self, run_id: str, record: Mapping[str, Any]) -> None:
        kind = record["kind"]
        if kind == "batch":
            data = {k: SeriesData(np.asarray(p["steps"], np.int64), np.asarray(p["values"], np.float64),
                                  np.asarray(p["wall_times"], np.float64) if p.get("wall_times") else None)
                    for k, p in record["points"].items()}
            self._call(self.registry.append, run_id, data, batch_id=record["batch_id"],
                       overrides=record.get("semantics"))
        elif kind == "outcome":
            outcome = {k: v for k, v in record.items() if k != "kind"}
            if "checkpoints" in outcome:
                outcome["checkpoints"] = [tuple(c) for c in outcome["checkpoints"]]
            self._call(self.registry.set_outcome, run_id, **outcome)
        elif kind == "status":
            self._call(self.registry.set_status, run_id, record["status"])


class RemoteTarget:
    """A registry server (``rlreg serve``) reached with an API token."""

    def __init__(self, url: str, token: str, *, retry_seconds: float = 2.0):
        self.client = RemoteRegistry(url, token, retry_seconds=retry_seconds, backoff_max=1.0)
        self.url = self.client.url

    def describe(self) -> str:
        return self.url

    def _call(self, method: str, path: str, body: Any) -> Any:
        try:
            return self.client.request(method, path, json_body=body)
        except RemoteAuthError as exc:
            raise TargetDown(f"HTTP {exc.status}: {exc}") from exc  # a token fixed later lets it through
        except RemoteError as exc:
            if exc.status is not None:
                raise TargetRefused(f"HTTP {exc.status}: {exc}") from exc
            raise TargetDown(str(exc)) from exc

    def create(self, spec: Mapping[str, Any]) -> None:
        self._call("POST", "/api/runs", dict(spec))

    def send(self, run_id: str, record: Mapping[str, Any]) -> None:
        kind = record["kind"]
        path = f"/api/runs/{run_id}"
        if kind == "batch":
            points = {k: {"steps": p["steps"], "values": [json_value(float(v)) for v in p["values"]],
                          **({"wall_times": p["wall_times"]} if p.get("wall_times") else {})}
                      for k, p in record["points"].items()}
            body: dict[str, Any] = {"batch_id": record["batch_id"], "points": points}
            if record.get("semantics"):
                body["semantics"] = record["semantics"]
            self._call("POST", path + "/metrics", body)
        elif kind == "outcome":
            body = {k: v for k, v in record.items() if k != "kind"}
            if "checkpoints" in body:
                body["checkpoints"] = [{"step": int(c[0]), "uri": c[1]} for c in body["checkpoints"]]
            self._call("POST", path + "/outcome", body)
        elif kind == "status":
            self._call("POST", path + "/status", {"status": record["status"]})
