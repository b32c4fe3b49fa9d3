"""Configuration of the web application and the CLI: the one place that reads the environment.

Values come from the environment (``RLREG_*``) so a team server needs no edited files;
:func:`load_settings` reads them when an application is made (not at import time, so a server
may set them later) and ``create_app(test_config)`` overrides them in tests. A malformed value
stops the start with a message naming the variable.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Mapping

MIN_SECRET_KEY_LENGTH = 32
DEFAULT_SQLITE_FILE = "rlregistry.db"
# Page security: no inline scripts, nothing from another origin (plotly.js is served locally).
DEFAULT_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
DEFAULT_PLOT_CACHE_BYTES = 256 * 1024 * 1024


class ConfigError(RuntimeError):
    """A setting is missing or malformed; the message names the environment variable."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be a number") from None
    if not value >= minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} must be 1 or 0")


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def database_url(environ: Mapping[str, str] | None = None) -> str:
    """``RLREG_DATABASE_URL`` if set, else a SQLite file in the current directory."""
    return _environ(environ).get("RLREG_DATABASE_URL") or f"sqlite:///{Path.cwd() / DEFAULT_SQLITE_FILE}"


def logging_target(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Where trainer integrations send runs: a server (``RLREG_URL`` + ``RLREG_TOKEN``) or a database.

    ``db`` is ``RLREG_DATABASE_URL`` (None: the default SQLite file); ``spool_dir`` is where points
    wait while the registry cannot be reached (``RLREG_SPOOL_DIR``).
    """
    env = _environ(environ)
    return {"url": env.get("RLREG_URL") or None, "token": env.get("RLREG_TOKEN") or None,
            "db": env.get("RLREG_DATABASE_URL") or None,
            "spool_dir": env.get("RLREG_SPOOL_DIR") or str(Path.home() / ".cache" / "rlregistry" / "spool")}


def wandb_settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The W&B variables a script written for ``wandb`` sets (``WANDB_PROJECT``, ``WANDB_NAME``, ``WANDB_MODE``)."""
    env = _environ(environ)
    return {"project": env.get("WANDB_PROJECT") or None, "name": env.get("WANDB_NAME") or None,
            "mode": env.get("WANDB_MODE") or None}


def load_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting of the web application, as Flask config keys, from ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ
    upload_limit = _int(env, "RLREG_MAX_UPLOAD_BYTES", 256 * 1024 * 1024, 1)
    return {
        "DATABASE_URL": env.get("RLREG_DATABASE_URL") or None,  # None: a SQLite file in the working directory
        "SECRET_KEY": env.get("RLREG_SECRET_KEY") or None,
        "PRODUCTION": env.get("RLREG_ENV", "development") == "production",
        # Reads open to anyone who can reach the server unless this is set; writes always need a token or login.
        "REQUIRE_LOGIN_FOR_READS": _flag(env, "RLREG_REQUIRE_LOGIN_FOR_READS"),
        "MAX_CONTENT_LENGTH": upload_limit,
        "UPLOAD_DIR": env.get("RLREG_UPLOAD_DIR") or None,  # None: ./rlregistry-uploads
        "PLOT_CACHE_DIR": env.get("RLREG_PLOT_CACHE_DIR") or None,  # None: in-memory cache only
        "RUNS_PAGE_SIZE": 50,
        # Sessions: Flask reads these two keys itself, so they are set (never setdefault: Flask has defaults).
        "SESSION_COOKIE_SECURE": _flag(env, "RLREG_SECURE_COOKIES"),
        "PERMANENT_SESSION_LIFETIME": _int(env, "RLREG_SESSION_HOURS", 12, 1) * 3600,
        # Failed credentials: a client (address) backs off after this many failures within the window.
        "LOGIN_MAX_FAILURES_PER_CLIENT": _int(env, "RLREG_LOGIN_MAX_FAILURES", 20, 1),
        "LOGIN_MAX_FAILURES_PER_USER_AND_CLIENT": _int(env, "RLREG_LOGIN_MAX_FAILURES_PER_USER", 5, 1),
        "LOGIN_WINDOW_SECONDS": _float(env, "RLREG_LOGIN_WINDOW_SECONDS", 300.0, 1.0),
        "LOGIN_MAX_BACKOFF_SECONDS": _float(env, "RLREG_LOGIN_MAX_BACKOFF_SECONDS", 300.0, 1.0),
        # Bounded work per request.
        "MAX_UNPACKED_BYTES": _int(env, "RLREG_MAX_UNPACKED_BYTES", 4 * upload_limit, 1),
        "MAX_ARCHIVE_MEMBERS": _int(env, "RLREG_MAX_ARCHIVE_MEMBERS", 10000, 1),
        "LIMITS": load_limits(env),
        "PLOT_CACHE_MAX_BYTES": _int(env, "RLREG_PLOT_CACHE_MAX_BYTES", DEFAULT_PLOT_CACHE_BYTES, 0),
        "PLOT_REF_TTL": 2.0,
        "CONTENT_SECURITY_POLICY": DEFAULT_CSP,
        "JSON_SORT_KEYS": False,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
    }


def load_limits(environ: Mapping[str, str] | None = None) -> Any:
    """The bounds on work per registration or request (``registry.core.limits.Limits``) from the environment."""
    from registry.core.limits import Limits

    env = os.environ if environ is None else environ
    d = Limits()
    return Limits(
        max_metric_keys=_int(env, "RLREG_MAX_METRIC_KEYS", d.max_metric_keys, 1),
        max_line_bytes=_int(env, "RLREG_MAX_LINE_BYTES", d.max_line_bytes, 1024),
        max_tags=_int(env, "RLREG_MAX_TAGS", d.max_tags, 1),
        max_checkpoints=_int(env, "RLREG_MAX_CHECKPOINTS", d.max_checkpoints, 1),
        max_json_depth=_int(env, "RLREG_MAX_JSON_DEPTH", d.max_json_depth, 2),
        max_page=_int(env, "RLREG_MAX_PAGE", d.max_page, 1),
        max_decompress_seconds=_float(env, "RLREG_MAX_DECOMPRESS_SECONDS", d.max_decompress_seconds, 0.1),
    )


def secret_key(config: Any) -> str:
    """The configured secret; a random one per process in development, none at all in production.

    Production refuses a missing secret and one shorter than 32 characters (a session cookie
    signed with a guessable key can be forged).
    """
    if config.SECRET_KEY:
        if config.PRODUCTION and len(config.SECRET_KEY) < MIN_SECRET_KEY_LENGTH:
            raise ConfigError(f"RLREG_SECRET_KEY is {len(config.SECRET_KEY)} characters; production needs at "
                              f"least {MIN_SECRET_KEY_LENGTH} (e.g. python -c 'import secrets; "
                              "print(secrets.token_hex(32))')")
        return config.SECRET_KEY
    if config.PRODUCTION:
        raise ConfigError("RLREG_SECRET_KEY must be set when RLREG_ENV=production "
                          "(e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return secrets.token_hex(32)

