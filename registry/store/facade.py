"""The registry: the Python API every surface (CLI, web, importers, training loops) goes through.

Every public write is one database transaction: a registration either lands whole or not
at all. Series are append-only; points arrive as encoded chunks (see ``codec``) and the
series row keeps summary columns current so listings never decode arrays.

Longer than 500 lines: it is the store's one entry point, a public method per operation, each
its own transaction. What they share lives beside it: how series are written and bound
(``writes``), read back (``reader``), streamed (``run_handle``), and what a run's binding
knows (``run_binding``).
"""
from __future__ import annotations

import contextlib
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from registry.db import migrate
from registry.dictionary.binding import AliasIndex, Binding, normalize_framework
from registry.db.engine import default_database_url, make_engine, make_session_factory
from registry.core.errors import AlreadyRegisteredError, InputError, LimitExceededError, NotFoundError
from registry.core.hparams import iter_typed
from registry.core.jsonsafe import has_unstorable_text
from registry.core.limits import DEFAULT_LIMITS, Limits
from registry.core.run_fields import RUN_STATUSES, VERDICTS
from registry.db.models import (
    Checkpoint,
    IngestBatch,
    MetricDefinition,
    OutcomeScore,
    Run,
    RunParam,
    RunTag,
    Series,
    utcnow,
)
from registry.importers.run_summary import split_run_summary
from registry.core.series import DEFAULT_ORDER_POLICY, MAX_KEY_LENGTH, SeriesBuilder, SeriesData, check_batch
from registry.store.hooks import Hooks
from registry.store.writes import append_points, bind_key
from registry.store.reader import CANONICAL_ORDER, find_series, read_series_chunks, reduce_points, run_to_dict
from registry.store.run_binding import binding_context, declared_binding_info, record_binding_warnings, resolve_framework
from registry.store.run_handle import RunHandle
from registry.store.run_history import delete_run, editable_state, record_change, record_event
from registry.importers import fingerprint, open_source, run_paths
from registry.store.tracker_runs import register_store, register_store_run, store_format
from registry.importers.params import merge_params
from registry.store import run_listing
from registry.dictionary.definitions import (definition_to_dict, dictionary_stamp, ensure_default_dictionary,
                                             list_definitions)

# Points per stored chunk: a 100k-point curve is two rows; streamed appends are compacted
# back into chunks of this size once a series has collected many small ones.
MAX_NAME_LENGTH = 200


@dataclass
class RegistrationResult:
    run_id: str
    name: str
    framework: str | None
    source_format: str | None
    series_count: int
    point_count: int
    mapped: dict[str, str] = field(default_factory=dict)                 # raw key -> canonical name
    unmapped: dict[str, list[str]] = field(default_factory=dict)         # raw key -> suggestions
    warnings: list[str] = field(default_factory=list)
    replaced: str | None = None
    summary: dict[str, float] = field(default_factory=dict)  # end-of-training summary, stored as scores
    guessed: dict[str, str] = field(default_factory=dict)                # raw key -> framework the alias was taken from
    binding: dict[str, Any] = field(default_factory=dict)                # the run's binding_info

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _check_text(value: str | None, what: str, max_len: int = MAX_NAME_LENGTH, *,
                multiline: bool = False) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, got {type(value).__name__}")
    if len(value) > max_len:
        raise InputError(f"{what} is longer than {max_len} characters")
    allowed = "\t\n\r" if multiline else "\t"
    if any(ord(c) < 32 and c not in allowed for c in value):
        raise InputError(f"{what} contains control characters")
    if has_unstorable_text(value):
        raise InputError(f"{what} contains a lone surrogate, which no database can store: {value!r}"[:300])
    return value


class Registry:
    """A registry database (SQLite file or PostgreSQL server).

    >>> reg = Registry("sqlite:///runs.db")
    >>> with reg.create_run("grpo-lr1e-6", project="math", algorithm="GRPO", framework="verl") as run:
    ...     run.log(1, {"critic/score/mean": 0.1, "actor/ppo_kl": 1e-4})
    """

    def __init__(self, url: str | None = None, *, upgrade: bool = True, limits: Limits | None = None):
        self.url = url or default_database_url()
        self.limits = limits or DEFAULT_LIMITS
        # Subscribers (similar-run index, diagnosis) are attached by registry.open_registry.
        self.hooks = Hooks()
        self.engine = make_engine(self.url)
        self._sessions = make_session_factory(self.engine)
        self._read_sessions = make_session_factory(self.engine, read_only=True)
        if upgrade:
            migrate.upgrade(self.engine)
            with self.transaction() as session:
                ensure_default_dictionary(session)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work commits together, or rolls back together on any error."""
        with self._sessions() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads only: on SQLite it does not take the write lock."""
        with self._read_sessions() as session:
            yield session

    # --- runs -------------------------------------------------------------------

    def resolve_run(self, session: Session, ref: str) -> Run:
        """A run by id, by unique id prefix (6+ characters) or by unique name."""
        if has_unstorable_text(ref):  # no run can carry such a name, and the driver would fail to encode it
            raise NotFoundError(f"no run with id or name {ref!r} (it contains a NUL or a lone surrogate)")
        run = session.get(Run, ref)
        if run is not None:
            return run
        by_name = list(session.scalars(select(Run).where(Run.name == ref).limit(2)))
        if len(by_name) == 1:
            return by_name[0]
        if len(by_name) > 1:
            raise NotFoundError(f"several runs are named {ref!r}; use the run id")
        if len(ref) >= 6 and all(c in "0123456789abcdef" for c in ref):
            by_prefix = list(session.scalars(select(Run).where(Run.id.startswith(ref)).limit(2)))
            if len(by_prefix) == 1:
                return by_prefix[0]
        raise NotFoundError(f"no run with id or name {ref!r}")

    def _new_run(
        self,
        session: Session,
        *,
        name: str,
        project: str,
        algorithm: str | None,
        framework: str | None,
        task: str | None,
        params: Mapping[str, Any] | None,
        tags: Sequence[str] | None,
        code_version: str | None,
        status: str,
        run_id: str | None = None,
    ) -> Run:
        _check_text(name, "run name")
        if not name or not name.strip():
            raise InputError("run name must not be empty")
        for value, what in ((project, "project"), (algorithm, "algorithm"), (task, "task"),
                            (code_version, "code version")):
            _check_text(value, what)
        if status not in RUN_STATUSES:
            raise InputError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")
        run = Run(
            id=run_id or uuid.uuid4().hex,
            name=name.strip(),
            project=project or "default",
            algorithm=algorithm.upper() if algorithm else None,
            framework=normalize_framework(framework),
            binding_info=declared_binding_info(framework, algorithm),
            task=task,
            code_version=code_version,
            status=status,
        )
        self.limits.check_tags(len(tags or ()))
        self.limits.check_depth(params or {}, "hyperparameters")
        session.add(run)
        seen = set()
        for key, vtype, num, text in iter_typed(params or {}):
            _check_text(key, "hyperparameter name", 300)
            if text is not None and has_unstorable_text(text):
                raise InputError(f"hyperparameter {key!r} has text no database can store (a NUL or a lone surrogate)")
            if key in seen:
                raise InputError(f"hyperparameter {key!r} is given twice")
            seen.add(key)
            session.add(RunParam(run=run, key=key, value_type=vtype, num_value=num, text_value=text))
        for tag in dict.fromkeys(tags or ()):
            _check_text(tag, "tag")
            if tag.strip():
                session.add(RunTag(run=run, tag=tag.strip()))
        return run

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
        run_id: str | None = None,
        semantics: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> RunHandle:
        """Start a run that a training loop will stream into (status ``running``)."""
        with self.transaction() as session:
            if run_id is not None and session.get(Run, run_id) is not None:
                raise AlreadyRegisteredError(run_id, session.get(Run, run_id).name)
            run = self._new_run(
                session, name=name, project=project, algorithm=algorithm, framework=framework, task=task,
                params=params, tags=tags, code_version=code_version, status="running", run_id=run_id,
            )
            return RunHandle(self, run.id, run.framework, run.algorithm, semantics)

    def resume_run(self, ref: str, semantics: Mapping[str, Mapping[str, Any]] | None = None) -> RunHandle:
        """A handle for appending to an existing run (after a trainer restart, say)."""
        with self.read() as session:
            run = self.resolve_run(session, ref)
            return RunHandle(self, run.id, run.framework, run.algorithm, semantics)

    def delete_run(self, ref: str, author: str | None = None) -> str:
        """Delete a run; its history keeps a record of the deletion (``run_history``)."""
        return delete_run(self, ref, author)[0]

    # --- series writes ----------------------------------------------------------

    def _alias_index(self, session: Session) -> AliasIndex:
        """The dictionary's alias index, rebuilt only when a definition was added, removed or edited.

        The check is one aggregate query (``dictionary_stamp``) instead of loading every definition and
        alias for each streamed batch.
        """
        stamp = dictionary_stamp(session)
        cached = getattr(self, "_cached_index", None)
        if cached is None or cached[0] != stamp:
            cached = (stamp, AliasIndex.load(session))
            self._cached_index = cached
        return cached[1]

    def _write_series(
        self, session: Session, run: Run, index: AliasIndex, data: Mapping[str, SeriesData],
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Binding]:
        """Append arrays to a run's series, creating and binding series on first sight."""
        existing = {s.key: s for s in session.scalars(select(Series).where(Series.run_id == run.id))}
        bindings = {}
        context = None
        for key, sd in data.items():
            series = existing.get(key)
            if series is None:
                _check_text(key, "metric key", MAX_KEY_LENGTH)
                context = context or binding_context(run)
                binding = bind_key(index, key, context, overrides)
                bindings[key] = binding
                series = Series(
                    run_id=run.id, key=key, definition_id=binding.definition_id,
                    definition_version=binding.definition_version, alias_framework=binding.alias_framework,
                    sign=binding.sign, semantics=binding.semantics, overrides=binding.overrides,
                    provenance=binding.provenance, labels=binding.labels,
                )
                session.add(series)
                session.flush()
            check_batch(key, sd.steps, sd.values, series.last_step, run.name)
            if len(sd.steps):
                append_points(session, series, sd)
        record_binding_warnings(run, bindings.values())
        run.data_version += 1
        run.updated_at = utcnow()
        session.flush()
        self.hooks.publish_series_written(session, run.id)
        return bindings

    def append(
        self,
        run_ref: str,
        data: Mapping[str, SeriesData],
        *,
        batch_id: str | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> bool:
        """Append points to a running run; returns False when ``batch_id`` was already applied."""
        with self.transaction() as session:
            run = self.resolve_run(session, run_ref)
            if batch_id is not None:
                if session.get(IngestBatch, (run.id, batch_id)) is not None:
                    return False
                session.add(IngestBatch(run_id=run.id, batch_id=batch_id))
            self._write_series(session, run, self._alias_index(session), data, overrides)
            return True

    # --- registration from files -------------------------------------------------

    def register(
        self,
        path: str | Path,
        *,
        format: str | None = None,
        name: str | None = None,
        project: str = "default",
        algorithm: str | None = None,
        framework: str | None = None,
        task: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        code_version: str | None = None,
        status: str = "finished",
        on_disorder: str = DEFAULT_ORDER_POLICY,
        replace: bool = False,
        semantics: Mapping[str, Mapping[str, Any]] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> RegistrationResult:
        """Register one run from a training log (TensorBoard dir, trainer_state.json, verl log, CSV, JSONL),
        or the one run of a tracker's store (MLflow database, file or URL, or ``mlruns/``; trackio database;
        W&B run directory or history export: ``registry.store.tracker_runs``; a store of several runs is
        registered with ``register_all``)."""
        store = store_format(path, format)
        if store is not None:
            return register_store_run(self, path, store, name=name, replace=replace, progress=progress,
                                      project=project, algorithm=algorithm, framework=framework, task=task,
                                      params=params, tags=tags, code_version=code_version, semantics=semantics)
        self.limits.check_line_lengths(Path(path))
        try:
            source = open_source(Path(path), format)
        except RecursionError:  # an importer's parser (JSON, YAML) on absurd nesting
            raise LimitExceededError("nested too deeply to read (thousands of levels)", str(path)) from None
        fp = fingerprint(source)
        with self.read() as session:
            previous = session.scalar(select(Run).where(Run.source_fingerprint == fp))
            if previous is not None and not replace:
                raise AlreadyRegisteredError(previous.id, previous.name)
        self.limits.check_tags(len(tags or ()))
        builder = SeriesBuilder(str(path), on_disorder)
        try:
            for i, point in enumerate(source.points(), 1):
                builder.add(point)
                if i % 1024 == 0:
                    self.limits.check_keys(builder.key_count, str(path))
                if progress is not None and i % 10000 == 0:
                    progress(10000)
        except RecursionError:
            raise LimitExceededError("nested too deeply to read (thousands of levels)", str(path)) from None
        self.limits.check_keys(builder.key_count, str(path))
        data, summary = split_run_summary(builder.build())
        if not data:
            raise InputError("no metric points found", str(path))

        merged_params = merge_params(source.params, dict(params or {}))
        warnings = list(getattr(source, "warnings", []) or []) + builder.warnings
        with self.transaction() as session:
            index = self._alias_index(session)
            info = resolve_framework(index, data, merged_params, framework, algorithm, source.framework,
                                     source.algorithm, source.layout)
            fw = info.get("framework")
            replaced = None
            if replace:
                old = session.scalar(select(Run).where(Run.source_fingerprint == fp))
                if old is not None:
                    replaced = old.id
                    session.delete(old)
                    session.flush()
            run = self._new_run(
                session,
                name=name or source.name or Path(path).name,
                project=project,
                algorithm=algorithm or source.algorithm,
                framework=fw,
                task=task or source.task,
                params=merged_params,
                tags=tags,
                code_version=code_version,
                status=status,
            )
            run.binding_info = info
            run.source_format = source.format
            run.source_path = str(path)
            run.source_fingerprint = fp
            if status != "running":
                run.finished_at = utcnow()
            session.flush()
            bindings = self._write_series(session, run, index, data, semantics)
            if summary:
                self._apply_outcome(session, run, scores=summary)
            result = RegistrationResult(
                run_id=run.id, name=run.name, framework=fw, source_format=source.format,
                series_count=len(data), point_count=builder.point_count - len(summary), summary=summary,
                mapped={k: b.definition_name for k, b in bindings.items() if b.mapped},
                unmapped={k: list(b.suggestions) for k, b in bindings.items() if not b.mapped},
                warnings=warnings + list(run.binding_info.get("warnings", [])), replaced=replaced,
                guessed={k: b.alias_framework for k, b in bindings.items() if b.how == "guessed"},
                binding=dict(run.binding_info),
            )
        self.hooks.publish_run_committed(self, result.run_id)
        return result

    def register_all(self, path: str | Path, *, format: str | None = None, name: str | None = None,
                     **options: Any) -> list[RegistrationResult]:
        """Register every run a path holds: one run, or one per sub-directory of a TensorBoard
        directory of runs (SB3's ``PPO_1/``, ``PPO_2/``; CleanRL's ``runs/<run name>/``).

        Each run is registered in its own transaction; when one fails, the runs this call already
        registered are deleted again, so the registry is left as it was, and the error names the run.
        A run already registered is an error as for ``register`` (``replace=True`` re-registers).

        A tracker's store (MLflow, trackio, W&B) is registered run by run instead: its runs already
        present are skipped (listed in the result's ``skipped``), and a run that fails leaves the
        others registered (``registry.store.tracker_runs.PartialImportError`` says which).
        """
        store = store_format(path, format)
        if store is not None:
            return register_store(self, path, store, name=name, **options)
        paths = run_paths(Path(path), format)
        if len(paths) == 1:
            return [self.register(paths[0], format=format, name=name, **options)]
        results: list[RegistrationResult] = []
        try:
            for run_path in paths:
                results.append(self.register(run_path, format=format, **options))
        except BaseException:
            for done in results:
                with contextlib.suppress(NotFoundError):
                    self.delete_run(done.run_id)
            raise
        return results

    def register_arrays(
        self,
        name: str,
        data: Mapping[str, SeriesData | tuple[Sequence[int], Sequence[float]]],
        *,
        status: str = "finished",
        semantics: Mapping[str, Mapping[str, Any]] | None = None,
        outcome: Mapping[str, Any] | None = None,
        replace: bool = False,
        **run_fields: Any,
    ) -> RegistrationResult:
        """Register a whole run at once from in-memory arrays (one transaction). With a
        ``source_fingerprint`` already registered: AlreadyRegisteredError, or with ``replace`` the
        earlier run is deleted in the same transaction."""
        series = {k: v if isinstance(v, SeriesData) else SeriesData(np.asarray(v[0], np.int64),
                                                                    np.asarray(v[1], np.float64))
                  for k, v in data.items()}
        # Imported histories (MLflow, trackio, W&B) carry where they came from; the fingerprint is the
        # tracker's own run id, so importing the same history twice registers nothing new.
        source = {k: run_fields.pop(k, None) for k in ("source_format", "source_path", "source_fingerprint")}
        replaced = None
        with self.transaction() as session:
            if source["source_fingerprint"] is not None:
                previous = session.scalar(select(Run).where(Run.source_fingerprint == source["source_fingerprint"]))
                if previous is not None and not replace:
                    raise AlreadyRegisteredError(previous.id, previous.name)
                if previous is not None:
                    replaced = previous.id
                    session.delete(previous)
                    session.flush()
            index = self._alias_index(session)
            declared_algorithm = run_fields.pop("algorithm", None)
            params = run_fields.pop("params", None)
            info = resolve_framework(index, series, params or {}, run_fields.pop("framework", None),
                                     declared_algorithm)
            fw = info.get("framework")
            run = self._new_run(session, name=name, framework=fw, status=status,
                                project=run_fields.pop("project", "default"),
                                algorithm=declared_algorithm, task=run_fields.pop("task", None),
                                params=params, tags=run_fields.pop("tags", None),
                                code_version=run_fields.pop("code_version", None),
                                run_id=run_fields.pop("run_id", None))
            run.binding_info = info
            if run_fields:
                raise TypeError(f"unknown run field(s): {', '.join(run_fields)}")
            if status != "running":
                run.finished_at = utcnow()
            for key, value in source.items():
                if value is not None:
                    setattr(run, key, value)
            session.flush()
            bindings = self._write_series(session, run, index, series, semantics)
            if outcome:
                self._apply_outcome(session, run, **outcome)
            result = RegistrationResult(
                run_id=run.id, name=run.name, framework=fw, source_format=source["source_format"] or "api",
                series_count=len(series), point_count=sum(len(s) for s in series.values()),
                mapped={k: b.definition_name for k, b in bindings.items() if b.mapped},
                unmapped={k: list(b.suggestions) for k, b in bindings.items() if not b.mapped},
                warnings=list(run.binding_info.get("warnings", [])), replaced=replaced,
                guessed={k: b.alias_framework for k, b in bindings.items() if b.how == "guessed"},
                binding=dict(run.binding_info),
            )
        self.hooks.publish_run_committed(self, result.run_id)
        return result

    # --- outcome and status -----------------------------------------------------

    def _apply_outcome(
        self, session: Session, run: Run, *, verdict: str | None = None,
        scores: Mapping[str, float] | None = None, notes: str | None = None,
        checkpoints: Sequence[tuple[int, str] | tuple[int, str, str]] | None = None,
    ) -> None:
        if verdict is not None:
            if verdict not in VERDICTS:
                raise InputError(f"verdict must be one of {', '.join(VERDICTS)}; got {verdict!r}")
            run.verdict = verdict
        if notes is not None:
            run.notes = _check_text(notes, "notes", 100000, multiline=True)
        for score_name, value in (scores or {}).items():
            _check_text(score_name, "score name")
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise InputError(f"score {score_name!r} must be a number, got {value!r}") from None
            row = session.get(OutcomeScore, (run.id, score_name))
            if row is None:
                session.add(OutcomeScore(run_id=run.id, name=score_name, value=value))
            else:
                row.value = value
        checkpoints = list(checkpoints or ())
        self.limits.check_checkpoints(len(checkpoints))
        existing: dict[int, Checkpoint] = {}
        if checkpoints:  # one query for the run's checkpoints, not one per checkpoint
            existing = {c.step: c for c in session.scalars(select(Checkpoint).where(Checkpoint.run_id == run.id))}
            self.limits.check_checkpoints(len(existing.keys() | {int(c[0]) for c in checkpoints}))
        for ckpt in checkpoints:
            step, uri, *rest = ckpt
            _check_text(uri, "checkpoint reference", 2000)
            row = existing.get(int(step))
            if row is None:
                row = existing[int(step)] = Checkpoint(run_id=run.id, step=int(step), uri=uri,
                                                       note=rest[0] if rest else None)
                session.add(row)
            else:
                row.uri = uri
                row.note = rest[0] if rest else row.note
        run.data_version += 1
        run.updated_at = utcnow()

    def set_outcome(self, run_ref: str, *, author: str | None = None, **outcome: Any) -> None:
        """Record final scores, verdict, notes and checkpoints (each part optional); the run's history
        records what changed and ``author``."""
        with self.transaction() as session:
            run = self.resolve_run(session, run_ref)
            before = editable_state(session, run)
            self._apply_outcome(session, run, **outcome)
            record_change(session, run, before, "outcome", author)

    def set_status(self, run_ref: str, status: str, author: str | None = None) -> None:
        if status not in RUN_STATUSES:
            raise InputError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")

        with self.transaction() as session:
            run = self.resolve_run(session, run_ref)
            if run.status != status:
                record_event(session, run, "status", {"status": {"before": run.status, "after": status}}, author)
            run.status = status
            if status in ("finished", "crashed"):
                run.finished_at = utcnow()
            run.data_version += 1
            session.flush()
            self.hooks.publish_series_written(session, run.id)
            run_id = run.id
        if status != "running":
            self.hooks.publish_run_committed(self, run_id)

    # --- reads ------------------------------------------------------------------

    def read_series(self, run_ref: str, key: str, *, canonical: bool = False, from_step: float | None = None,
                    to_step: float | None = None, per_step: bool = False,
                    max_points: int | None = None) -> SeriesData:
        """One series of a run by raw key (or canonical name when ``canonical``), sign applied if canonical.

        ``from_step``/``to_step`` keep that step range (inclusive); ``per_step`` averages the points
        logged at one step (``SeriesData.per_step``); ``max_points`` then reduces the finite points
        with MinMaxLTTB (:func:`~registry.store.reader.reduce_points`), in that order.
        """
        with self.read() as session:
            run = self.resolve_run(session, run_ref)
            series = self._find_series(session, run, key, canonical)
            data = read_series_chunks(session, series.id)
        if canonical and series.sign != 1.0:
            data = SeriesData(data.steps, data.values * series.sign, data.wall_times)
        if from_step is not None or to_step is not None:
            data = data.between(-math.inf if from_step is None else from_step,
                                math.inf if to_step is None else to_step)
        if per_step:
            data = data.per_step()
        if max_points:
            data, _ = reduce_points(data, max_points)
        return data

    def _find_series(self, session: Session, run: Run, key: str, canonical: bool) -> Series:
        series = find_series(session, run.id, key, canonical=canonical)
        if series is None:
            raise NotFoundError(f"run {run.name!r} has no metric {key!r}")
        return series

    def canonical_curves(self, run_ref: str) -> dict[str, SeriesData]:
        """Every mapped series of a run under its canonical name, in canonical sign, one point per
        step (the mean where a step holds several: ``SeriesData.per_step``).

        When two raw keys bind to the same definition, the one :data:`~registry.store.reader.CANONICAL_ORDER`
        puts first stands for the name (as everywhere else).
        """
        with self.read() as session:
            run = self.resolve_run(session, run_ref)
            rows = session.execute(
                select(Series, MetricDefinition.name).join(MetricDefinition).where(Series.run_id == run.id)
                .order_by(*CANONICAL_ORDER)
            ).all()
            out: dict[str, SeriesData] = {}
            for series, name in rows:
                if name in out:
                    continue
                data = read_series_chunks(session, series.id).per_step()
                out[name] = (SeriesData(data.steps, data.values * series.sign, data.wall_times, data.counts)
                             if series.sign != 1.0 else data)
            return out

    def run_detail(self, run_ref: str) -> dict[str, Any]:
        """Everything known about a run, JSON-ready (hyperparameters, outcome, bindings, summaries)."""
        with self.read() as session:
            run = self.resolve_run(session, run_ref)
            run = session.scalar(
                select(Run).where(Run.id == run.id).options(
                    selectinload(Run.params), selectinload(Run.tags), selectinload(Run.scores),
                    selectinload(Run.checkpoints), selectinload(Run.series).selectinload(Series.definition),
                )
            )
            return run_to_dict(run, full=True)

    def list_runs(
        self,
        *,
        where: str | None = None,
        project: str | None = None,
        tag: str | None = None,
        verdict: str | None = None,
        status: str | None = None,
        order_by: str = "-created_at",
        limit: int | None = 100,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """Runs matching the filters (``where`` in the filter language), and the total match count."""
        return run_listing.list_runs(self, where=where, project=project, tag=tag, verdict=verdict, status=status,
                                     order_by=order_by, limit=limit, offset=offset)

    def definitions_by_name(self, names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        with self.read() as session:
            return {d.name: definition_to_dict(d) for d in list_definitions(session) if not names or d.name in names}
