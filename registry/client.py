"""Stream a training run to a registry server over HTTP (the write API under /api/).

>>> from registry.client import RemoteRegistry
>>> reg = RemoteRegistry("http://registry.internal:5000", token="rlr_...")
>>> with reg.create_run("grpo-lr1e-6", project="math", algorithm="GRPO", framework="verl",
...                     params={"actor": {"lr": 1e-6}}) as run:
...     for step in range(1, 1001):
...         run.log(step, {"actor/ppo_kl": ..., "critic/score/mean": ...})
...     run.set_outcome(verdict="success", scores={"gsm8k": 0.71})

Delivery: ``log`` only buffers. A flush (every ``flush_points`` points, every
``flush_seconds`` seconds, on ``flush()`` and on ``finish()``) seals the buffer into a batch
with a fresh uuid ``batch_id`` and puts it on a queue; batches are sent in order and each stays
on the queue, under the same id, until the server acknowledges it. The server applies a batch
id once per run, so resending a batch whose answer was lost (a timeout, a restart between commit
and reply) duplicates nothing; keeping it until acknowledged loses nothing.

Retries: every transport error (a refused or reset connection, a timeout, a reply cut off after
its headers or in its body, an answer that is not the JSON it announced), 5xx answers and 429
are retried with exponential
backoff (``backoff_initial`` doubling up to ``backoff_max``, with jitter, honouring
``Retry-After``) for at most ``retry_seconds`` in total per call; then :class:`RemoteError`
is raised with the batches still queued, and the next ``flush()`` starts over with them.
Other 4xx answers are not retried: :class:`RemoteError` carries the server's message (a batch
refused that way is dropped from the queue and kept in ``RemoteRun.rejected``).

``create_run`` is idempotent too: the client picks the run id, so a retried create returns the
run the first attempt made.
"""
from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import requests

DEFAULT_TIMEOUT = (5.0, 60.0)  # connect, read
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Failures of the transport, not of the request: the server may or may not have applied it, and
# resending under the same idempotent id is safe either way.
TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                    requests.exceptions.ContentDecodingError)


class RemoteError(Exception):
    """The server refused a request, or could not be reached within the retry budget."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteAuthError(RemoteError):
    """401/403: the token is missing, wrong or revoked."""


def _json_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


class RemoteRegistry:
    """A registry server reached over HTTP with an API token (``rlreg token create``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
        retry_seconds: float = 300.0,
        backoff_initial: float = 0.25,
        backoff_max: float = 10.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["User-Agent"] = "rlregistry-client/1"
        self._sleep = sleep
        self.retries = 0  # requests resent after a failure, over this object's life

    # --- transport ---------------------------------------------------------------------

    def request(self, method: str, path: str, *, json_body: Any = None, retry: bool = True,
                **kwargs: Any) -> Any:
        """One API call, retried on transport errors (cut, reset, timeout), 5xx and 429; returns the JSON answer."""
        data = kwargs.pop("data", None)
        headers = dict(kwargs.pop("headers", None) or {})
        if json_body is not None:
            data = json.dumps(json_body, allow_nan=False, separators=(",", ":"))
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            wait: float | None = None
            response = None
            try:
                response = self.session.request(method, self.url + path, data=data, headers=headers,
                                                timeout=self.timeout, **kwargs)
                if response.status_code < 400:
                    return response.json() if response.content else None
            except TRANSPORT_ERRORS as exc:
                problem: str = f"{type(exc).__name__}: {exc}"
            except ValueError as exc:
                if response is None:  # a malformed URL or argument: resending cannot help
                    raise RemoteError(f"{method} {path}: {exc}") from None
                problem = f"the answer was not complete JSON ({exc})"  # a 2xx cut off on the way
            else:
                message = _error_message(response)
                if response.status_code in (401, 403):
                    raise RemoteAuthError(message, response.status_code)
                if response.status_code not in RETRY_STATUSES:
                    raise RemoteError(message, response.status_code)
                problem = f"HTTP {response.status_code}: {message}"
                retry_after = response.headers.get("Retry-After")
                if retry_after and retry_after.isdigit():
                    wait = float(retry_after)
            if not retry:
                raise RemoteError(f"{method} {path} failed: {problem}")
            if wait is None:
                wait = min(self.backoff_max, self.backoff_initial * 2 ** attempt)
                wait *= 0.5 + random.random() / 2  # jitter: many clients do not come back in step
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RemoteError(f"{method} {path} failed for {self.retry_seconds:g} s, giving up: {problem}")
            self._sleep(min(wait, remaining))
            attempt += 1
            self.retries += 1

    # --- runs ----------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        *,
        project: str = "default",
        algorithm: str | None = None,
        framework: str | None = None,
        task: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        code_version: str | None = None,
        semantics: Mapping[str, Mapping[str, Any]] | None = None,
        run_id: str | None = None,
        flush_points: int = 5000,
        flush_seconds: float = 10.0,
    ) -> RemoteRun:
        """Start a run (status ``running``) and return a handle that streams points into it."""
        body = {"name": name, "project": project, "algorithm": algorithm, "framework": framework, "task": task,
                "params": dict(params or {}), "tags": list(tags or []), "code_version": code_version,
                "run_id": run_id or uuid.uuid4().hex}
        run = self.request("POST", "/api/runs", json_body=body)
        return RemoteRun(self, run["id"], flush_points=flush_points, flush_seconds=flush_seconds,
                         semantics=semantics)

    def resume_run(self, ref: str, *, flush_points: int = 5000, flush_seconds: float = 10.0,
                   semantics: Mapping[str, Mapping[str, Any]] | None = None) -> RemoteRun:
        """A handle for appending to an existing run (its series' last steps are fetched first)."""
        detail = self.run(ref)
        handle = RemoteRun(self, detail["id"], flush_points=flush_points, flush_seconds=flush_seconds,
                           semantics=semantics)
        handle._last_step = {s["key"]: s["last_step"] for s in detail["series"] if s["last_step"] is not None}
        return handle

    def run(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/api/runs/{requests.utils.quote(ref, safe='')}")

    def series(self, ref: str, key: str) -> dict[str, Any]:
        return self.request("GET", f"/api/runs/{requests.utils.quote(ref, safe='')}/series", params={"key": key})

    def delete_run(self, ref: str) -> str:
        return self.request("DELETE", f"/api/runs/{requests.utils.quote(ref, safe='')}")["deleted"]

    def upload(self, path: str | Path, **fields: Any) -> dict[str, Any]:
        """Register a file (trainer_state.json, CSV, JSONL, verl log, or a .zip/.tar of a TensorBoard dir).

        ``fields``: name, project, algorithm, framework, task, tags (list), params (dict),
        code_version, format, on_disorder, replace (bool), semantics (dict). Connection errors,
        timeouts and 5xx are retried like any call (the file is sent again); if the first attempt
        did land, the retry is answered 409 "already registered" (the same content fingerprint).
        """
        form: list[tuple[str, str]] = []
        for key, value in fields.items():
            if value is None:
                continue
            if key == "tags":
                form += [("tags", str(t)) for t in value]
            elif isinstance(value, (dict, list)):
                form.append((key, json.dumps(value)))
            elif isinstance(value, bool):
                form.append((key, "true" if value else "false"))
            else:
                form.append((key, str(value)))
        path = Path(path)
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            with open(path, "rb") as handle:
                try:
                    return self.request("POST", "/api/uploads", data=form,
                                        files={"file": (path.name, handle)}, retry=False)
                except RemoteError as exc:
                    if exc.status is not None or time.monotonic() > deadline:
                        raise
            self._sleep(min(self.backoff_max, self.backoff_initial * 2 ** attempt))
            attempt += 1


class RemoteRun:
    """A run being streamed to the server: ``log`` buffers, batches go out in order and are resent
    under the same ``batch_id`` until acknowledged."""

    def __init__(self, client: RemoteRegistry, run_id: str, *, flush_points: int = 5000,
                 flush_seconds: float = 10.0, semantics: Mapping[str, Mapping[str, Any]] | None = None):
        self.client = client
        self.id = run_id
        self.semantics = {k: dict(v) for k, v in (semantics or {}).items()}  # sent with the keys they cover
        self.flush_points = flush_points
        self.flush_seconds = flush_seconds
        self._buffer: dict[str, tuple[list[int], list[float | str], list[float]]] = {}
        self._buffered = 0
        self._last_step: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self.pending: deque[dict[str, Any]] = deque()  # sealed batches not yet acknowledged
        self.rejected: list[tuple[dict[str, Any], RemoteError]] = []
        self.sent_points = 0       # points the server acknowledged (applied or already there)
        self.duplicates = 0        # batches the server had already applied (resent after a lost answer)

    @property
    def _path(self) -> str:
        return f"/api/runs/{self.id}"

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float | None = None) -> None:
        """Buffer one step's metrics; a step before a metric's last step is refused here, at once
        (several points at one step are kept, e.g. one per finished episode)."""
        step = int(step)
        now = time.time() if wall_time is None else float(wall_time)
        checked = []
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"metric keys must be non-empty strings, got {key!r}")
            last = self._last_step.get(key)
            if last is not None and step < last:
                raise ValueError(f"metric {key!r}: step {step} is before step {last}; series are append-only")
            try:
                checked.append((key, float(value)))
            except (TypeError, ValueError):
                raise ValueError(f"metric {key!r} at step {step}: value {value!r} is not a number") from None
        for key, value in checked:
            steps, values, walls = self._buffer.setdefault(key, ([], [], []))
            steps.append(step)
            values.append(_json_value(value))
            walls.append(now)
            self._last_step[key] = step
            self._buffered += 1
        if self._buffered >= self.flush_points or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def _seal(self) -> None:
        if not self._buffer:
            return
        points = {k: {"steps": s, "values": v, "wall_times": w} for k, (s, v, w) in self._buffer.items()}
        batch: dict[str, Any] = {"batch_id": uuid.uuid4().hex, "points": points}
        semantics = {k: v for k, v in self.semantics.items() if k in points}
        if semantics:
            batch["semantics"] = semantics
        self.pending.append(batch)
        self._buffer = {}
        self._buffered = 0

    def flush(self) -> None:
        """Send everything buffered; returns once the server has acknowledged every batch."""
        self._seal()
        self._last_flush = time.monotonic()
        while self.pending:
            batch = self.pending[0]
            try:
                answer = self.client.request("POST", self._path + "/metrics", json_body=batch)
            except RemoteError as exc:
                if exc.status is not None and not isinstance(exc, RemoteAuthError):
                    self.pending.popleft()  # refused on its merits: resending cannot help
                    self.rejected.append((batch, exc))
                raise
            self.pending.popleft()
            self.sent_points += int(answer.get("points", 0))
            if not answer.get("applied", True):
                self.duplicates += 1

    def set_outcome(self, *, verdict: str | None = None, scores: Mapping[str, float] | None = None,
                    notes: str | None = None,
                    checkpoints: Sequence[tuple[int, str] | tuple[int, str, str]] | None = None) -> None:
        body: dict[str, Any] = {}
        if verdict is not None:
            body["verdict"] = verdict
        if scores is not None:
            body["scores"] = {k: float(v) for k, v in scores.items()}
        if notes is not None:
            body["notes"] = notes
        if checkpoints is not None:
            body["checkpoints"] = [{"step": int(c[0]), "uri": c[1], **({"note": c[2]} if len(c) > 2 else {})}
                                   for c in checkpoints]
        self.client.request("POST", self._path + "/outcome", json_body=body)

    def finish(self, status: str = "finished") -> None:
        """Flush, then mark the run ``finished`` (or ``crashed``)."""
        self.flush()
        self.client.request("POST", self._path + "/status", json_body={"status": status})

    def __enter__(self) -> RemoteRun:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.finish()
            return
        try:
            self.flush()
        except RemoteError:
            pass  # the original exception is the one worth seeing
        try:
            self.client.request("POST", self._path + "/status", json_body={"status": "crashed"})
        except RemoteError:
            pass


def _error_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return str(body)[:500]


__all__ = ["RemoteAuthError", "RemoteError", "RemoteRegistry", "RemoteRun"]
