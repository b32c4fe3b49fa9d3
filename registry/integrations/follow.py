"""Register a verl log while the trainer writes it (``rlreg follow``).

Two inputs, told apart by their first record:

- verl's console log (``step:N - key:value - ...``, Ray prefixes and wrapped lines handled by the
  same rules as ``registry.importers.verl_log``);
- verl's ``file`` logger backend (``trainer.logger=['console','file']``): JSON Lines of
  ``{"step": N, "data": {key: value}}``, one per step (``FileLogger.log``, verl/utils/tracking.py
  at b178a3c, 2026-01); the file is opened with ``"wb"``, so a restarted trainer starts it again.

The run's id is derived from the file's absolute path, so following the same file again (after
the follower itself was restarted) appends to the same run. Points are never duplicated: on start,
and whenever the file shrinks (the trainer restarted and rewrote it), records at or before the last
step already stored are skipped. Only whole lines are read; the last console record is held until
the next line shows it is complete (or the file stops growing). The run stays ``running`` until the
final step arrives (``final_step``) or the file has not grown for ``idle_seconds``; then it is
marked ``finished``.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from registry.core.errors import InputError, NotFoundError
from registry.importers import verl_log
from registry.importers.values import parse_number
from registry.integrations.stream import StreamingRun
from registry.integrations.targets import LocalTarget

Record = tuple[int, dict[str, float]]


def run_id_for(path: Path) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"rlreg-follow:{path.resolve()}").hex


class JsonlParser:
    """verl ``file`` backend lines: ``{"step": N, "data": {...}}`` (a flat ``{"step": N, ...}`` too)."""

    def __init__(self, path: Path):
        self.path = path

    def feed(self, number: int, line: str) -> list[Record]:
        text = line.strip()
        if not text:
            return []
        try:
            entry = json.loads(text)
        except ValueError as exc:
            raise InputError(f"not a JSON record ({exc})", str(self.path), f"line {number}") from None
        if not isinstance(entry, dict) or "step" not in entry:
            raise InputError("a record without 'step'", str(self.path), f"line {number}")
        data = entry.get("data") if isinstance(entry.get("data"), dict) else \
            {k: v for k, v in entry.items() if k != "step"}
        try:
            step = int(entry["step"])
        except (TypeError, ValueError):
            raise InputError(f"step {entry['step']!r} is not an integer", str(self.path), f"line {number}") from None
        return [(step, _numbers(data))]

    def close(self) -> list[Record]:
        return []


class ConsoleParser:
    """verl console lines, a record at a time; wrapped continuation lines joined."""

    def __init__(self, path: Path):
        self.path = path
        self.pending: tuple[int, str] | None = None   # (first line number, joined text)

    def feed(self, number: int, line: str) -> list[Record]:
        body = verl_log.clean_line(line)
        out: list[Record] = []
        if verl_log.starts_record(body):
            out = self.close()
            self.pending = (number, body)
        elif self.pending is not None and verl_log.continues_record(body):
            self.pending = (self.pending[0], self.pending[1] + body)
        else:
            out = self.close()
        return out

    def close(self) -> list[Record]:
        if self.pending is None:
            return []
        number, text = self.pending
        self.pending = None
        pairs = list(verl_log.record_pairs(text))
        try:
            step = int(pairs[0][2])
        except ValueError:
            raise InputError(f"step {pairs[0][2]!r} is not an integer", str(self.path), f"line {number}") from None
        metrics = {}
        for _, key, value_text in pairs[1:]:
            value = verl_log.console_number(value_text)
            if value is not None:
                metrics[key] = value
        return [(step, metrics)]


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in data.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[key] = float(value)
        elif isinstance(value, str):
            number = parse_number(value)
            if number is not None:
                out[key] = number
    return out


def parser_for(path: Path, first_line: str):
    return JsonlParser(path) if first_line.lstrip().startswith("{") else ConsoleParser(path)


class Follower:
    """Tails one file into one run; ``poll()`` reads what is new, ``run_until_done()`` loops."""

    def __init__(self, path: Path, db_url: str | None, *, name: str | None = None, project: str = "default",
                 algorithm: str | None = None, task: str | None = None, params: dict[str, Any] | None = None,
                 tags: list[str] | None = None, semantics: dict[str, dict[str, Any]] | None = None,
                 final_step: int | None = None, idle_seconds: float = 300.0, poll_seconds: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.path = path
        self.final_step = final_step
        self.idle_seconds = idle_seconds
        self.poll_seconds = poll_seconds
        self._sleep = sleep
        self.target = LocalTarget(db_url)
        self.run_id = run_id_for(path)
        self.skip_through = self._stored_last_step()
        self.run = StreamingRun(name or path.stem, project=project, algorithm=algorithm, framework="verl", task=task,
                                params=params, tags=tags, semantics=semantics, run_id=self.run_id,
                                target=self.target, flush_seconds=math.inf)
        self.offset = 0
        self.line_number = 0
        self._partial = b""
        self.parser = None
        self.last_step: int | None = self.skip_through
        self.points = 0
        self.done = False

    def _stored_last_step(self) -> int | None:
        try:
            detail = self.target.registry.run_detail(self.run_id)
        except NotFoundError:
            return None
        steps = [s["last_step"] for s in detail["series"] if s["last_step"] is not None]
        return max(steps) if steps else None

    def poll(self) -> bool:
        """Read the new whole lines; True when the file grew."""
        size = self.path.stat().st_size
        if size < self.offset:  # rewritten from the start: a restarted trainer
            self.offset, self.line_number, self._partial, self.parser = 0, 0, b"", None
            self.skip_through = self.last_step
        if size == self.offset:
            return False
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        self.offset = size
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for its newline
        for raw in lines:
            self.line_number += 1
            line = raw.decode("utf-8", errors="replace")
            if self.parser is None:
                if not line.strip():
                    continue
                self.parser = parser_for(self.path, line)
            self._take(self.parser.feed(self.line_number, line))
        self.run.flush()
        return True

    def _take(self, records: list[Record]) -> None:
        for step, metrics in records:
            if self.skip_through is not None and step <= self.skip_through:
                continue
            if metrics:
                self.run.log(step, metrics)
                self.points += len(metrics)
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            if self.final_step is not None and step >= self.final_step:
                self.done = True

    def finish(self) -> None:
        if self.parser is not None:
            self._take(self.parser.close())
        self.run.finish("finished")

    def run_until_done(self, on_progress: Callable[[Follower], None] | None = None) -> None:
        idle = 0.0
        while not self.done:
            if self.poll():
                idle = 0.0
                if on_progress:
                    on_progress(self)
                continue
            if self.parser is not None and idle >= self.poll_seconds:
                self._take(self.parser.close())  # a quiet file: the held record is whole
                self.run.flush()
            if idle >= self.idle_seconds:
                break
            self._sleep(self.poll_seconds)
            idle += self.poll_seconds
        self.finish()


def records_of(path: Path) -> Iterator[Record]:
    """Every record of a finished file (for checks and tests)."""
    parser = None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if parser is None:
                if not line.strip():
                    continue
                parser = parser_for(path, line)
            yield from parser.feed(number, line)
    if parser is not None:
        yield from parser.close()
