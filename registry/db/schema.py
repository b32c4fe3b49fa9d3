"""The database schema as SQLAlchemy Core tables: what is stored, with no ORM behaviour.

Runs own their hyperparameters, tags, outcome scores, checkpoints and metric series.
A series is stored as chunks of encoded arrays (see ``codec``) plus summary columns
used for filtering without decoding. Metric definitions form the team dictionary; each
edit writes a ``definition_versions`` snapshot, and a series records which version it was
bound to at registration.

The ORM classes in :mod:`registry.db.models` are mapped onto these tables. Code that only
reads rows (``rlreg runs``, the runs listing) uses the tables directly, so it loads neither the
ORM nor NumPy and a command answers in a fraction of the time.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


metadata = MetaData()

runs = Table(
    'runs', metadata,
    Column('id', String(32), primary_key=True),
    Column('name', String(200), index=True, nullable=False),
    Column('project', String(200), default="default", index=True, nullable=False),
    Column('algorithm', String(50), index=True),
    Column('framework', String(50)),
    Column('task', String(200), index=True),
    Column('code_version', String(100)),
    Column('status', String(20), default="running", index=True, nullable=False),
    Column('verdict', String(20), index=True),
    Column('notes', Text),
    Column('source_format', String(30)),
    Column('source_path', Text),
    Column('source_fingerprint', String(64), unique=True),
    # How the run's keys were bound: framework and algorithm with where each came from (declared,
    # input format, detected with a confidence, config), framework version, and the warnings the
    # run's own configuration raised against its keys (a KL series with TRL beta 0).
    Column('binding_info', JSON, default=dict, nullable=False),
    # Bumped on every append or outcome change: part of every cache key of derived views.
    Column('data_version', Integer, default=0, nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, index=True, nullable=False),
    Column('updated_at', DateTime(timezone=True), default=utcnow, onupdate=utcnow, nullable=False),
    Column('finished_at', DateTime(timezone=True)),
)


run_params = Table(
    'run_params', metadata,
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column('key', String(300), primary_key=True),
    Column('value_type', String(10), nullable=False),
    Column('num_value', Float),
    Column('text_value', Text),
    Index("ix_run_params_key_num", "key", "num_value"),
    Index("ix_run_params_key_text", "key", "text_value"),
)


run_tags = Table(
    'run_tags', metadata,
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column('tag', String(200), primary_key=True, index=True),
)


outcome_scores = Table(
    'outcome_scores', metadata,
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column('name', String(200), primary_key=True),
    Column('value', Float, nullable=False),
)


checkpoints = Table(
    'checkpoints', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), index=True, nullable=False),
    Column('step', BigInteger, nullable=False),
    Column('uri', Text, nullable=False),
    Column('note', Text),
    UniqueConstraint("run_id", "step", name="uq_checkpoints_run_step"),
)


metric_definitions = Table(
    'metric_definitions', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('name', String(100), unique=True, nullable=False),
    Column('display_name', String(200), nullable=False),
    Column('layer', String(20), index=True, nullable=False),
    Column('quantity', String(30), nullable=False),
    Column('description', Text, default="", nullable=False),
    Column('formula', Text, default="", nullable=False),
    Column('unit', String(100), default="", nullable=False),
    Column('higher_is_better', Boolean),
    Column('averaging', String(20)),
    Column('kl_estimator', String(10)),
    Column('normalization_axis', String(20)),
    Column('logging_point', String(40)),
    Column('healthy_low', Float),
    Column('healthy_high', Float),
    # {task: {"low": x, "high": y}}: healthy ranges that differ per task (CartPole vs Pendulum returns).
    Column('task_ranges', JSON, default=dict, nullable=False),
    Column('smoothing_window', Integer, default=10, nullable=False),
    Column('version', Integer, default=1, nullable=False),
    Column('updated_at', DateTime(timezone=True), default=utcnow, nullable=False),
    Column('updated_by', String(200), default="system", nullable=False),
)


metric_aliases = Table(
    'metric_aliases', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('definition_id', ForeignKey("metric_definitions.id", ondelete="CASCADE"), index=True, nullable=False),
    Column('framework', String(50), nullable=False),
    # Empty string, not NULL, for "any algorithm": NULLs never collide in a unique constraint.
    Column('algorithm', String(50), default="", nullable=False),
    Column('key', String(300), index=True, nullable=False),
    Column('averaging', String(20)),
    Column('kl_estimator', String(10)),
    Column('normalization_axis', String(20)),
    Column('logging_point', String(40)),
    Column('sign', Float, default=1.0, nullable=False),
    Column('aggregation', Text, default="", nullable=False),
    Column('source', Text, default="", nullable=False),
    Column('notes', Text, default="", nullable=False),
    UniqueConstraint("framework", "algorithm", "key", name="uq_alias_framework_algorithm_key"),
)


definition_versions = Table(
    'definition_versions', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('definition_id', ForeignKey("metric_definitions.id", ondelete="CASCADE"), nullable=False),
    Column('version', Integer, nullable=False),
    Column('snapshot', JSON, nullable=False),
    Column('author', String(200), nullable=False),
    Column('change_note', Text, default="", nullable=False),
    Column('changed_fields', JSON, default=list, nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
    UniqueConstraint("definition_id", "version", name="uq_definition_version"),
)


series = Table(
    'series', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), index=True, nullable=False),
    Column('key', String(300), nullable=False),
    Column('definition_id', ForeignKey("metric_definitions.id", ondelete="SET NULL"), index=True),
    Column('definition_version', Integer),
    Column('alias_framework', String(50)),
    # Multiply raw values by this to get the canonical quantity (SB3 logs -entropy).
    Column('sign', Float, default=1.0, nullable=False),
    # Effective semantics at registration: definition <- alias <- run override.
    Column('semantics', JSON, default=dict, nullable=False),
    # What the run itself overrode (kept apart so the page can say "overridden by this run").
    Column('overrides', JSON, default=dict, nullable=False),
    # How the key was bound (alias / guessed / canonical / forced, logger prefix stripped) and, per
    # semantic field, where its value came from (alias, config, layout, override, guessed, definition).
    Column('provenance', JSON, default=dict, nullable=False),
    # Parts of the key a templated alias captured (reward component, data source, @N) and the split.
    Column('labels', JSON, default=dict, nullable=False),
    Column('count', Integer, default=0, nullable=False),
    Column('nan_count', Integer, default=0, nullable=False),
    Column('inf_count', Integer, default=0, nullable=False),
    Column('first_step', BigInteger),
    Column('last_step', BigInteger),
    Column('first_value', Float),
    Column('last_value', Float),
    Column('min_value', Float),
    Column('max_value', Float),
    # Sum of finite values; mean = finite_sum / (count - nan_count - inf_count), kept so appends stay O(batch).
    Column('finite_sum', Float, default=0.0, nullable=False),
    Column('chunk_count', Integer, default=0, nullable=False),
    UniqueConstraint("run_id", "key", name="uq_series_run_key"),
)


series_chunks = Table(
    'series_chunks', metadata,
    Column('series_id', ForeignKey("series.id", ondelete="CASCADE"), primary_key=True),
    Column('seq', Integer, primary_key=True),
    Column('n', Integer, nullable=False),
    Column('steps', LargeBinary, nullable=False),
    Column('values', LargeBinary, nullable=False),
    Column('wall_times', LargeBinary),
)


ingest_batches = Table(
    'ingest_batches', metadata,
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column('batch_id', String(64), primary_key=True),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
)


health_baselines = Table(
    'health_baselines', metadata,
    Column('task', String(200), primary_key=True),
    Column('profile', JSON, nullable=False),
    Column('source_runs', JSON, default=list, nullable=False),
    Column('updated_at', DateTime(timezone=True), default=utcnow, nullable=False),
    Column('updated_by', String(200), default="system", nullable=False),
)


curve_embeddings = Table(
    'curve_embeddings', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column('version', String(100), nullable=False),
    Column('metric', String(100), nullable=False),
    Column('series_id', ForeignKey("series.id", ondelete="CASCADE")),
    # Effective semantics of the series; the key holds the fields that must agree to compare.
    Column('semantics', JSON, default=dict, nullable=False),
    Column('semantics_key', String(200), default="", nullable=False),
    Column('point_count', Integer, nullable=False),
    Column('complete', Boolean, default=False, nullable=False),
    Column('first_step', BigInteger, nullable=False),
    Column('last_step', BigInteger, nullable=False),
    # Level scalars of the whole-run grid (prefix levels are in ``level_stats``).
    Column('flat', Boolean, default=False, nullable=False),
    Column('mean', Float, nullable=False),
    Column('std', Float, nullable=False),
    Column('final', Float, nullable=False),
    Column('max', Float, nullable=False),
    Column('argmax', Float, nullable=False),
    Column('level_stats', LargeBinary, nullable=False),
    Column('paa', LargeBinary, nullable=False),
    Column('grid', LargeBinary, nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
    UniqueConstraint("run_id", "metric", "version", name="uq_curve_embeddings_run_metric_version"),
    Index("ix_curve_embeddings_version_id", "version", "id"),
    Index("ix_curve_embeddings_version_metric", "version", "metric", "semantics_key"),
    sqlite_autoincrement=True,
)


users = Table(
    'users', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('username', String(100), unique=True, nullable=False),
    Column('password_hash', String(300), nullable=False),
    Column('disabled', Boolean, default=False, nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
)


api_tokens = Table(
    'api_tokens', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('user_id', ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column('name', String(100), nullable=False),
    Column('token_hash', String(64), unique=True, nullable=False),
    Column('prefix', String(12), nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
    Column('last_used_at', DateTime(timezone=True)),
    Column('revoked_at', DateTime(timezone=True)),
    # read < write < admin (registry.store.auth.SCOPES); tokens made before scopes existed became admin.
    Column('scope', String(10), default="write", nullable=False),
    Index("ix_api_tokens_user_name", "user_id", "name"),
)


user_sessions = Table(
    'user_sessions', metadata,
    Column('id_hash', String(64), primary_key=True),
    Column('user_id', ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column('created_at', DateTime(timezone=True), default=utcnow, nullable=False),
    Column('expires_at', DateTime(timezone=True), nullable=False),
    Index("ix_user_sessions_user", "user_id"),
)


run_findings = Table(
    'run_findings', metadata,
    Column('run_id', ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column('data_version', Integer, nullable=False),
    Column('dictionary_stamp', String(64), nullable=False),
    Column('baseline_stamp', String(64), default="", nullable=False),
    Column('engine_version', Integer, nullable=False),
    Column('worst_severity', String(20)),
    Column('n_info', Integer, default=0, nullable=False),
    Column('n_warning', Integer, default=0, nullable=False),
    Column('n_critical', Integer, default=0, nullable=False),
    Column('last_step', BigInteger),
    Column('summary', JSON, default=dict, nullable=False),
    Column('diagnosis', JSON, default=dict, nullable=False),
    Column('computed_at', DateTime(timezone=True), default=utcnow, nullable=False),
)


run_events = Table(
    'run_events', metadata,
    Column('id', Integer, primary_key=True, autoincrement=True),
    Column('run_id', String(32), nullable=False),
    Column('run_name', String(200), nullable=False),
    Column('at', DateTime(timezone=True), default=utcnow, nullable=False),
    Column('author', String(100)),
    Column('action', String(30), nullable=False),
    Column('changes', JSON, default=dict, nullable=False),
    Column('note', Text),
    Index("ix_run_events_run_at", "run_id", "at"),
)

