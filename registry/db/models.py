"""The ORM classes (SQLAlchemy 2.x declarative), mapped onto the Core tables of :mod:`registry.db.schema`.

The tables say what is stored; these classes add what the store's write paths and the web views
need on top: relationships, cascades and a few derived properties. The annotations are for
readers and type checkers; every column comes from the table.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import DeclarativeBase, Mapped, relationship

from registry.db import schema
from registry.db.schema import utcnow

__all__ = ["Base", "utcnow", "Run", "RunParam", "RunTag", "OutcomeScore", "Checkpoint", "MetricDefinition",
           "MetricAlias", "DefinitionVersion", "Series", "SeriesChunk", "IngestBatch", "HealthBaseline",
           "CurveEmbedding", "User", "ApiToken", "UserSession", "RunFindings", "RunEvent"]


class Base(DeclarativeBase):
    metadata = schema.metadata


class Run(Base):
    __table__ = schema.runs

    id: Mapped[str]
    name: Mapped[str]
    project: Mapped[str]
    algorithm: Mapped[str | None]
    framework: Mapped[str | None]
    task: Mapped[str | None]
    code_version: Mapped[str | None]
    status: Mapped[str]
    verdict: Mapped[str | None]
    notes: Mapped[str | None]
    source_format: Mapped[str | None]
    source_path: Mapped[str | None]
    source_fingerprint: Mapped[str | None]
    binding_info: Mapped[dict[str, Any]]
    data_version: Mapped[int]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]

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
    __table__ = schema.run_params

    run_id: Mapped[str]
    key: Mapped[str]
    value_type: Mapped[str]
    num_value: Mapped[float | None]
    text_value: Mapped[str | None]

    run: Mapped[Run] = relationship(back_populates="params")


class RunTag(Base):
    __table__ = schema.run_tags

    run_id: Mapped[str]
    tag: Mapped[str]

    run: Mapped[Run] = relationship(back_populates="tags")


class OutcomeScore(Base):
    __table__ = schema.outcome_scores

    run_id: Mapped[str]
    name: Mapped[str]
    value: Mapped[float]


class Checkpoint(Base):
    __table__ = schema.checkpoints

    id: Mapped[int]
    run_id: Mapped[str]
    step: Mapped[int]
    uri: Mapped[str]
    note: Mapped[str | None]


class MetricDefinition(Base):
    __table__ = schema.metric_definitions

    id: Mapped[int]
    name: Mapped[str]
    display_name: Mapped[str]
    layer: Mapped[str]
    quantity: Mapped[str]
    description: Mapped[str]
    formula: Mapped[str]
    unit: Mapped[str]
    higher_is_better: Mapped[bool | None]
    averaging: Mapped[str | None]
    kl_estimator: Mapped[str | None]
    normalization_axis: Mapped[str | None]
    logging_point: Mapped[str | None]
    healthy_low: Mapped[float | None]
    healthy_high: Mapped[float | None]
    task_ranges: Mapped[dict[str, Any]]
    smoothing_window: Mapped[int]
    version: Mapped[int]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str]

    aliases: Mapped[list[MetricAlias]] = relationship(
        back_populates="definition", cascade="all, delete-orphan", order_by="MetricAlias.framework"
    )
    versions: Mapped[list[DefinitionVersion]] = relationship(
        back_populates="definition", cascade="all, delete-orphan", order_by="DefinitionVersion.version"
    )


class MetricAlias(Base):
    """A framework's name for a definition, with that framework's own semantics."""

    __table__ = schema.metric_aliases

    id: Mapped[int]
    definition_id: Mapped[int]
    framework: Mapped[str]
    algorithm: Mapped[str]
    key: Mapped[str]
    averaging: Mapped[str | None]
    kl_estimator: Mapped[str | None]
    normalization_axis: Mapped[str | None]
    logging_point: Mapped[str | None]
    sign: Mapped[float]
    aggregation: Mapped[str]
    source: Mapped[str]
    notes: Mapped[str]

    definition: Mapped[MetricDefinition] = relationship(back_populates="aliases")


class DefinitionVersion(Base):
    """Snapshot of a definition (with its aliases) after each edit."""

    __table__ = schema.definition_versions

    id: Mapped[int]
    definition_id: Mapped[int]
    version: Mapped[int]
    snapshot: Mapped[dict[str, Any]]
    author: Mapped[str]
    change_note: Mapped[str]
    changed_fields: Mapped[list[str]]
    created_at: Mapped[datetime]

    definition: Mapped[MetricDefinition] = relationship(back_populates="versions")


class Series(Base):
    """One metric of one run: binding, summary, and the chunks holding its points."""

    __table__ = schema.series

    id: Mapped[int]
    run_id: Mapped[str]
    key: Mapped[str]
    definition_id: Mapped[int | None]
    definition_version: Mapped[int | None]
    alias_framework: Mapped[str | None]
    sign: Mapped[float]
    semantics: Mapped[dict[str, Any]]
    overrides: Mapped[dict[str, Any]]
    provenance: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, Any]]
    count: Mapped[int]
    nan_count: Mapped[int]
    inf_count: Mapped[int]
    first_step: Mapped[int | None]
    last_step: Mapped[int | None]
    first_value: Mapped[float | None]
    last_value: Mapped[float | None]
    min_value: Mapped[float | None]
    max_value: Mapped[float | None]
    finite_sum: Mapped[float]
    chunk_count: Mapped[int]

    run: Mapped[Run] = relationship(back_populates="series")
    definition: Mapped[MetricDefinition | None] = relationship()

    @property
    def mean_value(self) -> float | None:
        finite = self.count - self.nan_count - self.inf_count
        return self.finite_sum / finite if finite > 0 else None


class SeriesChunk(Base):
    __table__ = schema.series_chunks

    series_id: Mapped[int]
    seq: Mapped[int]
    n: Mapped[int]
    steps: Mapped[bytes]
    values: Mapped[bytes]
    wall_times: Mapped[bytes | None]


class IngestBatch(Base):
    """Batch ids already applied to a run, so a client retrying after a timeout never duplicates points."""

    __table__ = schema.ingest_batches

    run_id: Mapped[str]
    batch_id: Mapped[str]
    created_at: Mapped[datetime]


class HealthBaseline(Base):
    """A team's learned profile of healthy curves for one task (editable)."""

    __table__ = schema.health_baselines

    task: Mapped[str]
    profile: Mapped[dict[str, Any]]
    source_runs: Mapped[list[str]]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str]


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

    __table__ = schema.curve_embeddings

    id: Mapped[int]
    run_id: Mapped[str]
    version: Mapped[str]
    metric: Mapped[str]
    series_id: Mapped[int | None]
    semantics: Mapped[dict[str, Any]]
    semantics_key: Mapped[str]
    point_count: Mapped[int]
    complete: Mapped[bool]
    first_step: Mapped[int]
    last_step: Mapped[int]
    flat: Mapped[bool]
    mean: Mapped[float]
    std: Mapped[float]
    final: Mapped[float]
    max: Mapped[float]
    argmax: Mapped[float]
    level_stats: Mapped[bytes]
    paa: Mapped[bytes]
    grid: Mapped[bytes]
    created_at: Mapped[datetime]


class User(Base):
    """Someone who may write through the web UI or own API tokens."""

    __table__ = schema.users

    id: Mapped[int]
    username: Mapped[str]
    password_hash: Mapped[str]
    disabled: Mapped[bool]
    created_at: Mapped[datetime]


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the secret is shown once."""

    __table__ = schema.api_tokens

    id: Mapped[int]
    user_id: Mapped[int]
    name: Mapped[str]
    token_hash: Mapped[str]
    prefix: Mapped[str]
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    scope: Mapped[str]


class UserSession(Base):
    """A web login: the cookie carries a random id, this row its SHA-256. Logging out, changing the
    password or disabling the user deletes rows, which ends those sessions in every server process."""

    __table__ = schema.user_sessions

    id_hash: Mapped[str]
    user_id: Mapped[int]
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class RunFindings(Base):
    """The stored result of a run's automatic diagnosis (``registry.analysis.health``), so listings never diagnose.

    A row is *fresh* while ``data_version`` equals the run's, ``dictionary_stamp`` the metric
    dictionary's (count, sum of versions, max id of its definitions), ``baseline_stamp`` the
    run's task baseline (its ``updated_at``, ``""`` without one) and ``engine_version``
    ``health.DIAGNOSIS_VERSION``; otherwise it is *stale* and recomputed on the next read that
    can afford it. ``summary`` holds what a runs table shows (one-liners, the shaded step
    spans per metric); ``diagnosis`` the whole ``Diagnosis.to_dict()``.
    """

    __table__ = schema.run_findings

    run_id: Mapped[str]
    data_version: Mapped[int]
    dictionary_stamp: Mapped[str]
    baseline_stamp: Mapped[str]
    engine_version: Mapped[int]
    worst_severity: Mapped[str | None]
    n_info: Mapped[int]
    n_warning: Mapped[int]
    n_critical: Mapped[int]
    last_step: Mapped[int | None]
    summary: Mapped[dict[str, Any]]
    diagnosis: Mapped[dict[str, Any]]
    computed_at: Mapped[datetime]


class RunEvent(Base):
    """One change to a run: who made it, when, and each changed field's value before and after.

    ``run_id`` is no foreign key on purpose: the record of a deletion outlives the run.
    ``changes`` maps a field (``verdict``, ``tags``, ``scores``, ``notes``, ``checkpoints``,
    ``status``, ...) to ``{"before": ..., "after": ...}``; a registration or a deletion records
    what it registered or removed under the same shape.
    """

    __table__ = schema.run_events

    id: Mapped[int]
    run_id: Mapped[str]
    run_name: Mapped[str]
    at: Mapped[datetime]
    author: Mapped[str | None]
    action: Mapped[str]
    changes: Mapped[dict[str, Any]]
    note: Mapped[str | None]
