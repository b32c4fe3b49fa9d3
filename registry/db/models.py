"""The database schema (SQLAlchemy 2.x declarative models).

Runs own their hyperparameters, tags, outcome scores, checkpoints and metric series.
A series is stored as chunks of encoded arrays (see ``codec``) plus summary columns
used for filtering without decoding. Metric definitions form the team dictionary; each
edit writes a ``DefinitionVersion`` snapshot, and a series records which version it was
bound to at registration.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship



def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}




class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    project: Mapped[str] = mapped_column(String(200), default="default", index=True)
    algorithm: Mapped[str | None] = mapped_column(String(50), index=True)
    framework: Mapped[str | None] = mapped_column(String(50))
    task: Mapped[str | None] = mapped_column(String(200), index=True)
    code_version: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="running", index=True)
    verdict: Mapped[str | None] = mapped_column(String(20), index=True)
    notes: Mapped[str | None] = mapped_column(Text)
    source_format: Mapped[str | None] = mapped_column(String(30))
    source_path: Mapped[str | None] = mapped_column(Text)
    source_fingerprint: Mapped[str | None] = mapped_column(String(64), unique=True)
    # How the run's keys were bound: framework and algorithm with where each came from (declared,
    # input format, detected with a confidence, config), framework version, and the warnings the
    # run's own configuration raised against its keys (a KL series with TRL beta 0).
    binding_info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Bumped on every append or outcome change: part of every cache key of derived views.
    data_version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    params: Mapped[list[RunParam]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )
    tags: Mapped[list[RunTag]] = relationship(back_populates="run", cascade="all, delete-orphan", passive_deletes=True)
    scores: Mapped[list[OutcomeScore]] = relationship(cascade="all, delete-orphan", passive_deletes=True)
    checkpoints: Mapped[list[Checkpoint]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, order_by="Checkpoint.step"
    )
    series: Mapped[list[Series]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="Series.key"
    )


class RunParam(Base):
    __tablename__ = "run_params"
    __table_args__ = (
        Index("ix_run_params_key_num", "key", "num_value"),
        Index("ix_run_params_key_text", "key", "text_value"),
    )

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    value_type: Mapped[str] = mapped_column(String(10))
    num_value: Mapped[float | None] = mapped_column(Float)
    text_value: Mapped[str | None] = mapped_column(Text)

    run: Mapped[Run] = relationship(back_populates="params")


class RunTag(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(200), primary_key=True, index=True)

    run: Mapped[Run] = relationship(back_populates="tags")


class OutcomeScore(Base):
    __tablename__ = "outcome_scores"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_checkpoints_run_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)


class MetricDefinition(Base):
    __tablename__ = "metric_definitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    display_name: Mapped[str] = mapped_column(String(200))
    layer: Mapped[str] = mapped_column(String(20), index=True)
    quantity: Mapped[str] = mapped_column(String(30))
    description: Mapped[str] = mapped_column(Text, default="")
    formula: Mapped[str] = mapped_column(Text, default="")
    unit: Mapped[str] = mapped_column(String(100), default="")
    higher_is_better: Mapped[bool | None] = mapped_column(Boolean)
    averaging: Mapped[str | None] = mapped_column(String(20))
    kl_estimator: Mapped[str | None] = mapped_column(String(10))
    normalization_axis: Mapped[str | None] = mapped_column(String(20))
    logging_point: Mapped[str | None] = mapped_column(String(40))
    healthy_low: Mapped[float | None] = mapped_column(Float)
    healthy_high: Mapped[float | None] = mapped_column(Float)
    # {task: {"low": x, "high": y}}: healthy ranges that differ per task (CartPole vs Pendulum returns).
    task_ranges: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    smoothing_window: Mapped[int] = mapped_column(Integer, default=10)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(200), default="system")

    aliases: Mapped[list[MetricAlias]] = relationship(
        back_populates="definition", cascade="all, delete-orphan", order_by="MetricAlias.framework"
    )
    versions: Mapped[list[DefinitionVersion]] = relationship(
        back_populates="definition", cascade="all, delete-orphan", order_by="DefinitionVersion.version"
    )


class MetricAlias(Base):
    """A framework's name for a definition, with that framework's own semantics."""

    __tablename__ = "metric_aliases"
    __table_args__ = (UniqueConstraint("framework", "algorithm", "key", name="uq_alias_framework_algorithm_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    definition_id: Mapped[int] = mapped_column(ForeignKey("metric_definitions.id", ondelete="CASCADE"), index=True)
    framework: Mapped[str] = mapped_column(String(50))
    # Empty string, not NULL, for "any algorithm": NULLs never collide in a unique constraint.
    algorithm: Mapped[str] = mapped_column(String(50), default="")
    key: Mapped[str] = mapped_column(String(300), index=True)
    averaging: Mapped[str | None] = mapped_column(String(20))
    kl_estimator: Mapped[str | None] = mapped_column(String(10))
    normalization_axis: Mapped[str | None] = mapped_column(String(20))
    logging_point: Mapped[str | None] = mapped_column(String(40))
    sign: Mapped[float] = mapped_column(Float, default=1.0)
    aggregation: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")

    definition: Mapped[MetricDefinition] = relationship(back_populates="aliases")


class DefinitionVersion(Base):
    """Snapshot of a definition (with its aliases) after each edit."""

    __tablename__ = "definition_versions"
    __table_args__ = (UniqueConstraint("definition_id", "version", name="uq_definition_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    definition_id: Mapped[int] = mapped_column(ForeignKey("metric_definitions.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSON)
    author: Mapped[str] = mapped_column(String(200))
    change_note: Mapped[str] = mapped_column(Text, default="")
    changed_fields: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    definition: Mapped[MetricDefinition] = relationship(back_populates="versions")


class Series(Base):
    """One metric of one run: binding, summary, and the chunks holding its points."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_series_run_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(300))  # raw key, exactly as logged
    definition_id: Mapped[int | None] = mapped_column(
        ForeignKey("metric_definitions.id", ondelete="SET NULL"), index=True
    )
    definition_version: Mapped[int | None] = mapped_column(Integer)
    alias_framework: Mapped[str | None] = mapped_column(String(50))
    # Multiply raw values by this to get the canonical quantity (SB3 logs -entropy).
    sign: Mapped[float] = mapped_column(Float, default=1.0)
    # Effective semantics at registration: definition <- alias <- run override.
    semantics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # What the run itself overrode (kept apart so the page can say "overridden by this run").
    overrides: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # How the key was bound (alias / guessed / canonical / forced, logger prefix stripped) and, per
    # semantic field, where its value came from (alias, config, layout, override, guessed, definition).
    provenance: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Parts of the key a templated alias captured (reward component, data source, @N) and the split.
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    count: Mapped[int] = mapped_column(Integer, default=0)
    nan_count: Mapped[int] = mapped_column(Integer, default=0)
    inf_count: Mapped[int] = mapped_column(Integer, default=0)
    first_step: Mapped[int | None] = mapped_column(BigInteger)
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    first_value: Mapped[float | None] = mapped_column(Float)
    last_value: Mapped[float | None] = mapped_column(Float)
    min_value: Mapped[float | None] = mapped_column(Float)
    max_value: Mapped[float | None] = mapped_column(Float)
    # Sum of finite values; mean = finite_sum / (count - nan_count - inf_count), kept so appends stay O(batch).
    finite_sum: Mapped[float] = mapped_column(Float, default=0.0)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)

    run: Mapped[Run] = relationship(back_populates="series")
    definition: Mapped[MetricDefinition | None] = relationship()

    @property
    def mean_value(self) -> float | None:
        finite = self.count - self.nan_count - self.inf_count
        return self.finite_sum / finite if finite > 0 else None


class SeriesChunk(Base):
    __tablename__ = "series_chunks"

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    steps: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)
    wall_times: Mapped[bytes | None] = mapped_column(LargeBinary)


class IngestBatch(Base):
    """Batch ids already applied to a run, so a client retrying after a timeout never duplicates points."""

    __tablename__ = "ingest_batches"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class HealthBaseline(Base):
    """A team's learned profile of healthy curves for one task (editable)."""

    __tablename__ = "health_baselines"

    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_runs: Mapped[list[str]] = mapped_column(JSON, default=list)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(200), default="system")


class CurveEmbedding(Base):
    """Similarity features of one canonical metric of one run (see ``registry.analysis.similarity``).

    ``version`` names the preprocessing (``features.EMBEDDING_VERSION``): a query only ever
    compares rows of one version. Rows are replaced (delete + insert), never updated, so the
    autoincrement ``id`` only grows and ``(max(id), count)`` identifies the table's state
    for the per-process cache (on SQLite, triggers keep the count per version in the unmapped
    table ``embedding_row_counts``, migration 0005). On a PostgreSQL server with pgvector the migration adds
    ``v010 v025 v050 v100 vector(32)`` columns (one per level) with HNSW indexes; they are
    written by ``registry.analysis.similarity.index`` and are not mapped here.
    """

    __tablename__ = "curve_embeddings"
    __table_args__ = (
        UniqueConstraint("run_id", "metric", "version", name="uq_curve_embeddings_run_metric_version"),
        Index("ix_curve_embeddings_version_id", "version", "id"),
        Index("ix_curve_embeddings_version_metric", "version", "metric", "semantics_key"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(100))
    metric: Mapped[str] = mapped_column(String(100))  # canonical name
    series_id: Mapped[int | None] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"))
    # Effective semantics of the series; the key holds the fields that must agree to compare.
    semantics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    semantics_key: Mapped[str] = mapped_column(String(200), default="")
    point_count: Mapped[int] = mapped_column(Integer)
    complete: Mapped[bool] = mapped_column(Boolean, default=False)  # computed after the run ended
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    # Level scalars of the whole-run grid (prefix levels are in ``level_stats``).
    flat: Mapped[bool] = mapped_column(Boolean, default=False)
    mean: Mapped[float] = mapped_column(Float)
    std: Mapped[float] = mapped_column(Float)
    final: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    argmax: Mapped[float] = mapped_column(Float)  # fraction of the run where the grid peaks
    level_stats: Mapped[bytes] = mapped_column(LargeBinary)  # float64 (levels, stats)
    paa: Mapped[bytes] = mapped_column(LargeBinary)          # float32 (levels, 32)
    grid: Mapped[bytes] = mapped_column(LargeBinary)         # float16 (levels, 128) z-normalised
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class User(Base):
    """Someone who may write through the web UI or own API tokens."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(100), unique=True)
    password_hash: Mapped[str] = mapped_column(String(300))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the secret is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = (Index("ix_api_tokens_user_name", "user_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))  # shown in listings so a user can tell tokens apart
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # read < write < admin (registry.store.auth.SCOPES); tokens made before scopes existed became admin.
    scope: Mapped[str] = mapped_column(String(10), default="write")


class UserSession(Base):
    """A web login: the cookie carries a random id, this row its SHA-256. Logging out, changing the
    password or disabling the user deletes rows, which ends those sessions in every server process."""

    __tablename__ = "user_sessions"
    __table_args__ = (Index("ix_user_sessions_user", "user_id"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RunFindings(Base):
    """The stored result of a run's automatic diagnosis (``registry.analysis.health``), so listings never diagnose.

    A row is *fresh* while ``data_version`` equals the run's, ``dictionary_stamp`` the metric
    dictionary's (count, sum of versions, max id of its definitions), ``baseline_stamp`` the
    run's task baseline (its ``updated_at``, ``""`` without one) and ``engine_version``
    ``health.DIAGNOSIS_VERSION``; otherwise it is *stale* and recomputed on the next read that
    can afford it. ``summary`` holds what a runs table shows (one-liners, the shaded step
    spans per metric); ``diagnosis`` the whole ``Diagnosis.to_dict()``.
    """

    __tablename__ = "run_findings"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    data_version: Mapped[int] = mapped_column(Integer)
    dictionary_stamp: Mapped[str] = mapped_column(String(64))
    baseline_stamp: Mapped[str] = mapped_column(String(64), default="")
    engine_version: Mapped[int] = mapped_column(Integer)
    worst_severity: Mapped[str | None] = mapped_column(String(20))  # None: no finding at all
    n_info: Mapped[int] = mapped_column(Integer, default=0)
    n_warning: Mapped[int] = mapped_column(Integer, default=0)
    n_critical: Mapped[int] = mapped_column(Integer, default=0)
    last_step: Mapped[int | None] = mapped_column(BigInteger)  # the last step diagnosed
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    diagnosis: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    computed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RunEvent(Base):
    """One change to a run: who made it, when, and each changed field's value before and after.

    ``run_id`` is no foreign key on purpose: the record of a deletion outlives the run.
    ``changes`` maps a field (``verdict``, ``tags``, ``scores``, ``notes``, ``checkpoints``,
    ``status``, ...) to ``{"before": ..., "after": ...}``; a registration or a deletion records
    what it registered or removed under the same shape.
    """

    __tablename__ = "run_events"
    __table_args__ = (Index("ix_run_events_run_at", "run_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(32))
    run_name: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    author: Mapped[str | None] = mapped_column(String(100))  # None: no login (CLI, Python API)
    action: Mapped[str] = mapped_column(String(30))  # registered, edited, outcome, status, deleted
    changes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    note: Mapped[str | None] = mapped_column(Text)
