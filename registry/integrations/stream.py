"""A run streamed from inside a trainer that must never make the trainer fail.

Every integration (transformers/TRL callback, SB3 callback and output format, the W&B-style
entry point, the verl logger adapter) writes through :class:`StreamingRun`:

- ``log`` only buffers; a flush (every ``flush_points`` points or ``flush_seconds`` seconds,
  and at ``finish``) seals the buffer into a batch with a fresh id. With ``background=True`` (the
  default) a daemon thread does the sealing and sending, so a training step never waits for the
  database or the network; ``flush()`` and ``finish()`` deliver synchronously. Batches are delivered in
  order and the registry applies a batch id once per run, so resending one never duplicates.
- A registry that is down or refuses a write keeps the batches queued and retried at the next
  flush. After ``retry_limit`` failed flushes in a row, one warning is logged and every batch,
  queued or to come, goes to a spool file (JSON Lines) instead; ``finish`` tries once more to
  upload it, and ``rlreg follow --spool FILE`` (or the next run started against the same
  registry) uploads what is left.
- A batch refused on its merits (a value that is not a number, a step that goes back) is
  dropped with one warning instead of blocking those behind it.

The target comes from the arguments or the environment: ``RLREG_URL`` + ``RLREG_TOKEN`` for a
registry server, else ``RLREG_DATABASE_URL`` (``sqlite:///...`` or PostgreSQL), else
``./rlregistry.db``.
"""
from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Mapping, Sequence

from config import logging_target
from registry.integrations import lifecycle, spool as spool_io
from registry.integrations.targets import Target, TargetDown, TargetRefused, open_target

log = logging.getLogger("registry.integrations")


class StreamingRun:
    """One run, created at once (or spooled if the registry cannot be reached), fed by ``log``."""

    def __init__(
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
        url: str | None = None,
        token: str | None = None,
        db: str | None = None,
        flush_points: int = 5000,
        flush_seconds: float = 10.0,
        retry_limit: int = 3,
        retry_seconds: float = 2.0,
        spool_dir: str | Path | None = None,
        target: Target | None = None,
        background: bool = True,
    ):
        self.id = run_id or uuid.uuid4().hex
        self.spec: dict[str, Any] = {
            "name": name, "project": project or "default", "algorithm": algorithm, "framework": framework,
            "task": task, "params": plain_params(params or {}), "tags": list(tags or []), "code_version": code_version,
            "run_id": self.id,
        }
        self.semantics: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (semantics or {}).items()}
        self.flush_points = flush_points
        self.flush_seconds = flush_seconds
        self.retry_limit = retry_limit
        self.spool_dir = Path(spool_dir or logging_target()["spool_dir"])
        self.spool_path: Path | None = None   # set once the run falls back to the spool
        self.pending: deque[dict[str, Any]] = deque()
        self.dropped_points = 0               # points of batches the registry refused on their merits
        self.failures = 0                     # failed flushes in a row
        self.finished = False
        self._buffer: dict[str, tuple[list[int], list[float], list[float]]] = {}
        self._buffered = 0
        self._last_step: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self._created = False
        self._warned: set[str] = set()
        self._after: list[dict[str, Any]] = []  # outcome/status records waiting behind the batches
        self._lock = threading.Lock()           # the buffer and _after (log vs the sender)
        self._send_lock = threading.Lock()      # pending and delivery (sender thread vs flush/finish)
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._intended: str | None = None
        try:
            self.target = target or open_target(url=url, token=token, db=db, retry_seconds=retry_seconds)
        except Exception as exc:  # a bad URL or an unreadable database must not stop training either
            self.target = None
            self._intended = _describe_intended(url, db)
            self._warn_once("open", f"registry unavailable ({exc}); points go to the spool file")
            self._to_spool()
            return
        self._upload_old_spools()
        self._deliver()
        if background:
            self._thread = threading.Thread(target=self._sender, name=f"rlregistry-{self.id[:8]}", daemon=True)
            self._thread.start()

    def finish_at_exit(self, status: str) -> None:
        """Record ``status`` if the process ends without ``finish`` (and ``crashed`` on an uncaught
        exception): an interpreter that exits mid-training leaves no run marked running."""
        lifecycle.watch(self, status)

    # --- what integrations call ---------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any], wall_time: float | None = None) -> None:
        """Buffer one step's numeric metrics; others (strings, lists) are skipped. Never raises."""
        try:
            step = int(step)
            now = time.time() if wall_time is None else float(wall_time)
            with self._lock:
                self._buffer_metrics(step, metrics, now)
            if self._buffered >= self.flush_points or time.monotonic() - self._last_flush >= self.flush_seconds:
                self._last_flush = time.monotonic()
                if self._thread is not None:
                    self._wake.set()
                else:
                    self.flush()
        except Exception as exc:  # noqa: BLE001 - training goes on whatever happens here
            self._warn_once("log", f"logging failed and was skipped: {exc!r}")

    def _buffer_metrics(self, step: int, metrics: Mapping[str, Any], now: float) -> None:
        for key, value in metrics.items():
            number = metric_value(value)
            if number is None or not isinstance(key, str) or not key:
                continue
            last = self._last_step.get(key)
            if last is not None and step < last:
                self._warn_once(f"back:{key}", f"metric {key!r}: step {step} is before step {last} "
                                               "(a restart from a checkpoint?); such points are skipped")
                continue
            steps, values, walls = self._buffer.setdefault(key, ([], [], []))
            steps.append(step)
            values.append(number)
            walls.append(now)
            self._last_step[key] = step
            self._buffered += 1

    def define(self, key: str, **fields: Any) -> None:
        """Semantics for one metric key (``kl_estimator="k1"``...), sent with its points."""
        self.semantics.setdefault(key, {}).update({k: v for k, v in fields.items() if v is not None})

    def checkpoint(self, step: int, uri: str) -> None:
        with self._lock:
            self._after.append({"kind": "outcome", "checkpoints": [[int(step), str(uri)]]})
        if self._thread is not None:
            self._wake.set()
        else:
            self.flush()

    def set_outcome(self, **outcome: Any) -> None:
        record: dict[str, Any] = {"kind": "outcome"}
        for key in ("verdict", "notes"):
            if outcome.get(key) is not None:
                record[key] = outcome[key]
        if outcome.get("scores"):
            record["scores"] = {k: v for k, v in ((k, metric_value(v)) for k, v in outcome["scores"].items())
                                if v is not None and math.isfinite(v)}
        if outcome.get("checkpoints"):
            record["checkpoints"] = [[int(c[0]), str(c[1])] for c in outcome["checkpoints"]]
        with self._lock:
            self._after.append(record)

    def flush(self) -> None:
        """Seal the buffer into a batch and deliver everything queued. Never raises."""
        try:
            with self._send_lock:
                with self._lock:
                    self._seal()
                self._deliver()
        except Exception as exc:  # noqa: BLE001
            self._warn_once("flush", f"flush failed: {exc!r}")

    def finish(self, status: str = "finished") -> None:
        """Flush, record the final status; if spooled, try once more to upload the spool."""
        if self.finished:
            return
        self.finished = True
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            self._after.append({"kind": "status", "status": status})
        self.flush()
        if self.spool_path is not None:
            self._upload_spool_at_end()

    # --- delivery ---------------------------------------------------------------------

    def _sender(self) -> None:
        """The background thread: a flush every ``flush_seconds``, or sooner when ``log`` asks."""
        while True:
            self._wake.wait(self.flush_seconds if math.isfinite(self.flush_seconds) else None)
            self._wake.clear()
            if self._stop:
                return
            self.flush()

    def _seal(self) -> None:
        if self._buffer:
            points = {k: {"steps": s, "values": v, "wall_times": w} for k, (s, v, w) in self._buffer.items()}
            batch: dict[str, Any] = {"kind": "batch", "batch_id": uuid.uuid4().hex, "points": points}
            semantics = {k: v for k, v in self.semantics.items() if k in points}
            if semantics:
                batch["semantics"] = semantics
            self.pending.append(batch)
            self._buffer = {}
            self._buffered = 0
        # outcome/status records go after the batches sealed before them
        self.pending.extend(self._after)
        self._after = []

    def _deliver(self) -> None:
        if self.spool_path is not None:
            spool_io.append_records(self.spool_path, list(self.pending))
            self.pending.clear()
            return
        try:
            if not self._created:
                self.target.create(self.spec)
                self._created = True
            while self.pending:
                record = self.pending[0]
                try:
                    self.target.send(self.id, record)
                except TargetRefused as exc:
                    n = sum(len(p["steps"]) for p in record.get("points", {}).values())
                    self.dropped_points += n
                    self._warn_once(f"refused:{record['kind']}", f"the registry refused a {record['kind']} "
                                                                 f"({n} points dropped): {exc}")
                self.pending.popleft()
            self.failures = 0
        except TargetDown as exc:
            self.failures += 1
            if self.failures >= self.retry_limit:
                self._warn_once("down", f"registry unreachable after {self.failures} attempts ({exc}); "
                                        "training continues, points go to the spool file")
                self._to_spool()

    def _to_spool(self) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.spool_path = self.spool_dir / f"{self.id}.jsonl"
        header = {"kind": "run", "target": self.target.describe() if self.target else self._intended,
                  "spec": self.spec}
        spool_io.append_records(self.spool_path, [header, *self.pending])
        self.pending.clear()
        log.warning("rlregistry: spooling run %s to %s; upload it later with `rlreg follow --spool %s`",
                    self.id, self.spool_path, self.spool_path)

    def _upload_spool_at_end(self) -> None:
        if self.target is None or self.spool_path is None:
            return
        try:
            spool_io.replay(self.spool_path, self.target)
        except Exception as exc:  # noqa: BLE001 - left for `rlreg follow --spool`
            log.warning("rlregistry: run %s stays in %s (%s)", self.id, self.spool_path, exc)
        else:
            self.spool_path.unlink(missing_ok=True)

    def _upload_old_spools(self) -> None:
        """Spool files an earlier run left for this same registry are uploaded at start: those whose run
        ended (a final status record) or that nobody has written to for an hour."""
        if not self.spool_dir.is_dir():
            return
        for path in sorted(self.spool_dir.glob("*.jsonl")):
            try:
                header = spool_io.read_header(path)
                if header.get("target") != self.target.describe() or not spool_io.is_closed(path):
                    continue  # another registry's, or a run that may still be writing it
                spool_io.replay(path, self.target)
            except Exception as exc:  # noqa: BLE001
                self._warn_once("old-spool", f"could not upload the spool file {path}: {exc}")
                return
            path.unlink(missing_ok=True)
            log.info("rlregistry: uploaded spooled run from %s", path)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("rlregistry: %s", message)


def metric_value(value: Any) -> float | None:
    """A logged value as a metric: a float for numbers (bools, NumPy scalars and one-element tensors
    included); None for anything else (text, media, multi-element tensors), which callers skip.
    Shared by every integration (``registry.compat.wandb`` included) so they all keep the same values."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        return None
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - a multi-element tensor, say: not a metric
        return None


def plain_params(value: Any, depth: int = 0) -> Any:
    """Hyperparameters as JSON-safe values: nested mappings kept, lists of scalars kept, non-finite
    floats and any other object as text (an enum, a path, a dtype), so a remote write never fails on them."""
    if isinstance(value, Mapping):
        return {str(k): plain_params(v, depth + 1) for k, v in value.items()} if depth < 8 else str(value)
    if isinstance(value, (list, tuple)):
        items = [plain_params(v, depth + 1) for v in value]
        return items if all(v is None or isinstance(v, (str, int, float, bool)) for v in items) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, (str, int)):
        return enum_value
    return str(value)


def _describe_intended(url: str | None, db: str | None) -> str | None:
    """How the target that could not be opened would describe itself (to match its spool files later)."""
    env = logging_target()
    url = url or (None if db else env["url"])
    if url:
        return url.rstrip("/")
    db = db or env["db"]
    if not db:
        return None
    try:
        from sqlalchemy.engine import make_url

        return make_url(db).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return db
