"""The registry: the Python API every surface (CLI, web, importers, training loops) goes through.

Every public write is one database transaction: a registration either lands whole or not
at all. Series are append-only; points arrive as encoded chunks (see ``codec``) and the
series row keeps summary columns current so listings never decode arrays.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, selectinload

from registry import codec, migrate
from registry.binding import AliasIndex, Binding, BindingContext, normalize_framework, split_framework
from registry.db import default_database_url, make_engine, make_session_factory
from registry.dictionary import ensure_default_dictionary
from registry.errors import AlreadyRegisteredError, InputError, NotFoundError, RegistryError
from registry.errors import LimitExceededError
from registry.hparams import flatten, iter_typed, restore_value
from registry.limits import DEFAULT_LIMITS, Limits
from registry.models import (
    RUN_STATUSES,
    VERDICTS,
    Checkpoint,
    IngestBatch,
    MetricDefinition,
    OutcomeScore,
    Run,
    RunParam,
    RunTag,
    Series,
    SeriesChunk,
    utcnow,
)
from registry.run_summary import split_run_summary
from registry.semantics import SEMANTIC_FIELDS, check_enum
from registry.series import DEFAULT_ORDER_POLICY, SeriesBuilder, SeriesData, check_batch, summarize

# Points per stored chunk: a 100k-point curve is two rows; streamed appends are compacted
# back into chunks of this size once a series has collected many small ones.
CHUNK_POINTS = 65536
COMPACT_AFTER_CHUNKS = 32
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


def _check_text(value: str | None, what: str, max_len: int = MAX_NAME_LENGTH) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, got {type(value).__name__}")
    if len(value) > max_len:
        raise InputError(f"{what} is longer than {max_len} characters")
    if any(ord(c) < 32 and c not in "\t" for c in value):
        raise InputError(f"{what} contains control characters")
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
            binding_info=_declared_binding_info(framework, algorithm),
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

    def delete_run(self, ref: str) -> str:
        with self.transaction() as session:
            run = self.resolve_run(session, ref)
            run_id = run.id
            session.delete(run)
        return run_id

    # --- series writes ----------------------------------------------------------

    def _alias_index(self, session: Session) -> AliasIndex:
        """The dictionary's alias index, rebuilt only when a definition was added, removed or edited.

        Every edit bumps a definition's version and its update time, so the stamp (count, highest id,
        sum of versions, latest update) changes with it; the check is one aggregate query instead of
        loading every definition and alias for each streamed batch.
        """
        stamp = tuple(session.execute(
            select(func.count(MetricDefinition.id), func.max(MetricDefinition.id),
                   func.coalesce(func.sum(MetricDefinition.version), 0), func.max(MetricDefinition.updated_at))
        ).one())
        cached = getattr(self, "_cached_index", None)
        if cached is None or cached[0] != stamp:
            cached = (stamp, AliasIndex.load(session))
            self._cached_index = cached
        return cached[1]

    def _bind(
        self, index: AliasIndex, key: str, context: BindingContext,
        overrides: Mapping[str, Mapping[str, Any]] | None,
    ) -> Binding:
        override = dict((overrides or {}).get(key) or {})
        forced = override.pop("definition", None)
        bad = set(override) - set(SEMANTIC_FIELDS)
        if bad:
            raise InputError(f"metric {key!r}: cannot override {', '.join(sorted(bad))}")
        for f, v in override.items():
            try:
                check_enum(f, v)
            except ValueError as exc:
                raise InputError(f"metric {key!r}: {exc}") from None
        try:
            return index.bind(key, context, override=override, definition=forced)
        except KeyError:
            raise InputError(f"metric {key!r}: no definition named {forced!r}") from None

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
                context = context or binding_context(run)
                binding = self._bind(index, key, context, overrides)
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
                self._append_chunks(session, series, sd)
        _record_binding_warnings(run, bindings.values())
        run.data_version += 1
        run.updated_at = utcnow()
        session.flush()
        _refresh_embeddings(session, run.id)
        return bindings

    def _write_chunks(self, session: Session, series: Series, sd: SeriesData) -> None:
        """Store ``sd`` as chunks numbered on from the series' current chunk count."""
        rows = []
        for start in range(0, len(sd.steps), CHUNK_POINTS):
            sl = slice(start, start + CHUNK_POINTS)
            rows.append(
                {
                    "series_id": series.id,
                    "seq": series.chunk_count + len(rows),
                    "n": len(sd.steps[sl]),
                    "steps": codec.encode_steps(sd.steps[sl]),
                    "values": codec.encode_values(sd.values[sl]),
                    "wall_times": None if sd.wall_times is None else codec.encode_values(sd.wall_times[sl]),
                }
            )
        session.execute(SeriesChunk.__table__.insert(), rows)
        series.chunk_count += len(rows)

    def _append_chunks(self, session: Session, series: Series, sd: SeriesData) -> None:
        self._write_chunks(session, series, sd)
        s = summarize(sd.steps, sd.values)
        if series.count == 0:
            series.first_step, series.first_value = s.first_step, s.first_value
        series.last_step, series.last_value = s.last_step, s.last_value
        series.count += s.count
        series.nan_count += s.nan_count
        series.inf_count += s.inf_count
        series.finite_sum += s.finite_sum
        if s.min_value is not None:
            series.min_value = s.min_value if series.min_value is None else min(series.min_value, s.min_value)
            series.max_value = s.max_value if series.max_value is None else max(series.max_value, s.max_value)
        if series.chunk_count > COMPACT_AFTER_CHUNKS:
            self._compact(session, series)

    def _compact(self, session: Session, series: Series) -> None:
        data = read_series_chunks(session, series.id)
        session.execute(delete(SeriesChunk).where(SeriesChunk.series_id == series.id))
        series.chunk_count = 0
        self._write_chunks(session, series, data)

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
        """Register one run from a training log (TensorBoard dir, trainer_state.json, verl log, CSV, JSONL)."""
        from registry.importers import fingerprint, open_source

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
        from registry.importers.params import merge_params

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
        _refresh_findings(self, result.run_id)
        return result

    def register_all(self, path: str | Path, *, format: str | None = None, name: str | None = None,
                     **options: Any) -> list[RegistrationResult]:
        """Register every run a path holds: one run, or one per sub-directory of a TensorBoard
        directory of runs (SB3's ``PPO_1/``, ``PPO_2/``; CleanRL's ``runs/<run name>/``).

        Each run is registered in its own transaction; when one fails, the runs this call already
        registered are deleted again, so the registry is left as it was, and the error names the run.
        A run already registered is an error as for ``register`` (``replace=True`` re-registers).
        """
        from registry.importers import run_paths

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
        **run_fields: Any,
    ) -> RegistrationResult:
        """Register a whole run at once from in-memory arrays (one transaction)."""
        series = {k: v if isinstance(v, SeriesData) else SeriesData(np.asarray(v[0], np.int64),
                                                                    np.asarray(v[1], np.float64))
                  for k, v in data.items()}
        # Imported histories (MLflow, trackio, W&B) carry where they came from; the fingerprint is the
        # tracker's own run id, so importing the same history twice registers nothing new.
        source = {k: run_fields.pop(k, None) for k in ("source_format", "source_path", "source_fingerprint")}
        with self.transaction() as session:
            if source["source_fingerprint"] is not None:
                previous = session.scalar(select(Run).where(Run.source_fingerprint == source["source_fingerprint"]))
                if previous is not None:
                    raise AlreadyRegisteredError(previous.id, previous.name)
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
                warnings=list(run.binding_info.get("warnings", [])),
                guessed={k: b.alias_framework for k, b in bindings.items() if b.how == "guessed"},
                binding=dict(run.binding_info),
            )
        _refresh_findings(self, result.run_id)
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
            run.notes = _check_text(notes, "notes", 100000)
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

    def set_outcome(self, run_ref: str, **outcome: Any) -> None:
        """Record final scores, verdict, notes and checkpoints (each part optional)."""
        with self.transaction() as session:
            self._apply_outcome(session, self.resolve_run(session, run_ref), **outcome)

    def set_status(self, run_ref: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise InputError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")
        with self.transaction() as session:
            run = self.resolve_run(session, run_ref)
            run.status = status
            if status in ("finished", "crashed"):
                run.finished_at = utcnow()
            run.data_version += 1
            session.flush()
            _refresh_embeddings(session, run.id)
            run_id = run.id
        if status != "running":
            _refresh_findings(self, run_id)

    # --- reads ------------------------------------------------------------------

    def read_series(self, run_ref: str, key: str, *, canonical: bool = False) -> SeriesData:
        """One series of a run by raw key (or canonical name when ``canonical``), sign applied if canonical."""
        with self.read() as session:
            run = self.resolve_run(session, run_ref)
            series = self._find_series(session, run, key, canonical)
            data = read_series_chunks(session, series.id)
            if canonical and series.sign != 1.0:
                data = SeriesData(data.steps, data.values * series.sign, data.wall_times)
            return data

    def _find_series(self, session: Session, run: Run, key: str, canonical: bool) -> Series:
        series = session.scalar(select(Series).where(Series.run_id == run.id, Series.key == key))
        if series is None and canonical:
            series = session.scalar(
                select(Series).join(MetricDefinition).where(Series.run_id == run.id, MetricDefinition.name == key)
                .order_by(Series.key).limit(1)
            )
        if series is None:
            raise NotFoundError(f"run {run.name!r} has no metric {key!r}")
        return series

    def canonical_curves(self, run_ref: str) -> dict[str, SeriesData]:
        """Every mapped series of a run under its canonical name, in canonical sign, one point per
        step (the mean where a step holds several: ``SeriesData.per_step``).

        When two raw keys bind to the same definition (rare: a run logging both verl's
        ``actor/kl_loss`` and a custom ``kl``), the one with more points wins.
        """
        with self.read() as session:
            run = self.resolve_run(session, run_ref)
            rows = session.execute(
                select(Series, MetricDefinition.name).join(MetricDefinition).where(Series.run_id == run.id)
                .order_by(Series.count.desc())
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
        from registry.filters import compile_filter, hyperparameter_fields, sort_keys

        query = select(Run)
        conditions = []
        if where:
            conditions.append(compile_filter(where))
            self._check_hyperparameters_exist(hyperparameter_fields(where))
        if project:
            conditions.append(Run.project == project)
        if tag:
            conditions.append(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
        if verdict:
            conditions.append(Run.verdict == verdict)
        if status:
            conditions.append(Run.status == status)
        if conditions:
            query = query.where(*conditions)
        desc = order_by.startswith("-")
        keys = [k.desc().nulls_last() if desc else k.asc().nulls_last() for k in sort_keys(order_by.lstrip("-"))]
        with self.read() as session:
            total = session.scalar(select(func.count()).select_from(query.subquery()))
            page = query.order_by(*keys, Run.id).offset(offset)
            if limit is not None:
                page = page.limit(limit)
            page = page.options(selectinload(Run.params), selectinload(Run.tags), selectinload(Run.scores))
            return [run_to_dict(r) for r in session.scalars(page)], total

    def _check_hyperparameters_exist(self, keys: Sequence[str]) -> None:
        """A filter on a hyperparameter no run has is a typo (``lr`` for ``learning_rate``): say so, with
        the keys it may have meant, instead of answering with an empty list."""
        if not keys:
            return
        from registry.filters import suggest_params

        with self.read() as session:
            present = set(session.scalars(select(RunParam.key).where(RunParam.key.in_(list(keys))).distinct()))
            missing = [k for k in keys if k not in present]
            if not missing:
                return
            known = list(session.scalars(select(RunParam.key).distinct().limit(20000)))
        if not known:
            return  # an empty registry: nothing to have mistyped
        key = missing[0]
        hint = suggest_params(key, known)
        raise InputError(f"no run has a hyperparameter {key!r}"
                         + (f"; did you mean {', '.join(hint)}?" if hint else ""))

    def definitions_by_name(self, names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        from registry.dictionary import definition_to_dict, list_definitions

        with self.read() as session:
            return {d.name: definition_to_dict(d) for d in list_definitions(session) if not names or d.name in names}


def read_series_chunks(session: Session, series_id: int) -> SeriesData:
    """All points of one stored series, in step order, from one query."""
    rows = session.execute(
        select(SeriesChunk.steps, SeriesChunk.values, SeriesChunk.wall_times)
        .where(SeriesChunk.series_id == series_id)
        .order_by(SeriesChunk.seq)
    ).all()
    if not rows:
        return SeriesData(np.empty(0, np.int64), np.empty(0, np.float64))
    if len(rows) == 1:
        steps, values, walls = rows[0]
        return SeriesData(codec.decode_steps(steps), codec.decode_values(values), codec.decode_values(walls))
    steps = np.concatenate([codec.decode_steps(r[0]) for r in rows])
    values = np.concatenate([codec.decode_values(r[1]) for r in rows])
    walls = None
    if any(r[2] is not None for r in rows):
        walls = np.concatenate([
            codec.decode_values(r[2]) if r[2] is not None else np.full(len(codec.decode_steps(r[0])), np.nan)
            for r in rows
        ])
    return SeriesData(steps, values, walls)


def _refresh_embeddings(session: Session, run_id: str) -> None:
    """Keep the similar-run search's shape embeddings current, in the same transaction."""
    from registry.similarity import refresh_embeddings

    refresh_embeddings(session, run_id)


def _refresh_findings(registry: Registry, run_id: str) -> None:
    """Diagnose a run that was just registered or finished and store its findings (after the commit).

    A failure is logged, never raised: the registration stands, and the run is diagnosed
    when it is next read (``registry.health``).
    """
    from registry.health import refresh_findings

    try:
        refresh_findings(registry, run_id)
    except Exception as exc:  # noqa: BLE001 - diagnosis must never fail a registration
        import logging

        logging.getLogger(__name__).warning("run %s registered; its diagnosis failed: %s", run_id, exc)


def run_to_dict(run: Run, full: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": run.id,
        "name": run.name,
        "project": run.project,
        "algorithm": run.algorithm,
        "framework": run.framework,
        "task": run.task,
        "status": run.status,
        "verdict": run.verdict,
        "code_version": run.code_version,
        "tags": sorted(t.tag for t in run.tags),
        "params": {p.key: restore_value(p.value_type, p.num_value, p.text_value)
                   for p in sorted(run.params, key=lambda p: p.key)},
        "scores": {s.name: s.value for s in run.scores},
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "data_version": run.data_version,
    }
    if full:
        out["notes"] = run.notes
        out["source"] = {"format": run.source_format, "path": run.source_path, "fingerprint": run.source_fingerprint}
        out["binding"] = dict(run.binding_info or {})
        out["checkpoints"] = [{"step": c.step, "uri": c.uri, "note": c.note} for c in run.checkpoints]
        out["series"] = [series_to_dict(s) for s in run.series]
    return out


def series_to_dict(s: Series) -> dict[str, Any]:
    return {
        "key": s.key,
        "definition": s.definition.name if s.definition else None,
        "layer": s.definition.layer if s.definition else None,
        "definition_version": s.definition_version,
        "definition_current_version": s.definition.version if s.definition else None,
        "alias_framework": s.alias_framework,
        "sign": s.sign,
        "semantics": s.semantics,
        "overrides": s.overrides,
        "provenance": dict(s.provenance or {}),
        "labels": dict(s.labels or {}),
        "count": s.count,
        "nan_count": s.nan_count,
        "inf_count": s.inf_count,
        "first_step": s.first_step,
        "last_step": s.last_step,
        "first": s.first_value,
        "last": s.last_value,
        "min": s.min_value,
        "max": s.max_value,
        "mean": s.mean_value,
    }


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


def _declared_binding_info(framework: str | None, algorithm: str | None) -> dict[str, Any]:
    fw, version = split_framework(framework)
    info: dict[str, Any] = {}
    if fw:
        info.update(framework=fw, framework_from="declared")
        if version:
            info["framework_version"] = version
    if algorithm:
        info.update(algorithm=algorithm.lower(), algorithm_from="declared")
    return info


def resolve_framework(
    index: AliasIndex, keys: Any, params: Mapping[str, Any], declared: str | None, declared_algorithm: str | None,
    format_framework: str | None = None, format_algorithm: str | None = None,
    layout: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's framework and algorithm, each with where it came from (the run's ``binding_info``).

    Declared beats the input format's own hint, which beats detection from the keys; the
    algorithm used to pick per-algorithm aliases is declared, else named by the config, else detected.
    """
    from registry.config_semantics import algorithm_from_config

    info = _declared_binding_info(declared, declared_algorithm)
    detection = index.detect(keys)
    if not info.get("framework") and format_framework:
        fw, version = split_framework(format_framework)
        info.update(framework=fw, framework_from="format")
        if version:
            info["framework_version"] = version
    if not info.get("framework") and detection.framework:
        info.update(framework=detection.framework, framework_from="detected")
    if detection.framework or detection.confidence:
        info["detection"] = {"framework": detection.framework, "confidence": detection.confidence,
                             "algorithm": detection.algorithm, "evidence": detection.evidence}
    if not info.get("algorithm"):
        from_config = algorithm_from_config(info.get("framework"), flatten(params or {}))
        if format_algorithm:
            info.update(algorithm=format_algorithm.lower(), algorithm_from="format")
        elif from_config:
            info.update(algorithm=from_config[0], algorithm_from=f"config: {from_config[1]}")
        elif detection.algorithm and detection.framework == info.get("framework"):
            info.update(algorithm=detection.algorithm, algorithm_from="detected")
    if layout:
        info["layout"] = dict(layout)
    return info


def binding_context(run: Run) -> BindingContext:
    """What binding needs to know about a run: framework, version, algorithm and flattened params."""
    info = dict(run.binding_info or {})
    params = {p.key: restore_value(p.value_type, p.num_value, p.text_value) for p in run.params}
    return BindingContext(
        framework=run.framework,
        framework_version=info.get("framework_version"),
        framework_from=info.get("framework_from"),
        algorithm=info.get("algorithm") or (run.algorithm.lower() if run.algorithm else None),
        algorithm_from=info.get("algorithm_from"),
        params=params,
    )


def _record_binding_warnings(run: Run, bindings: Iterable[Binding]) -> None:
    """Keep the config-vs-key warnings of newly bound series on the run (shown with it)."""
    new = [w for b in bindings for w in b.warnings]
    if not new:
        return
    info = dict(run.binding_info or {})
    info["warnings"] = list(dict.fromkeys(list(info.get("warnings", [])) + new))
    run.binding_info = info


def open_registry(url: str | None = None) -> Registry:
    """Open (and create or upgrade) a registry; ``sqlite:///path`` or ``postgresql+psycopg://...``."""
    return Registry(url)
