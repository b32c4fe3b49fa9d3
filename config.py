"""Configuration of the web application and the CLI.

Values come from the environment (``RLREG_*``) so a team server needs no edited files;
``create_app(test_config)`` overrides them in tests.
"""
from __future__ import annotations

import os
import secrets


class Config:
    DATABASE_URL = os.environ.get("RLREG_DATABASE_URL")  # None: a SQLite file in the working directory
    SECRET_KEY = os.environ.get("RLREG_SECRET_KEY")
    # Reads open to anyone who can reach the server unless this is set; writes always need a token or login.
    REQUIRE_LOGIN_FOR_READS = os.environ.get("RLREG_REQUIRE_LOGIN_FOR_READS", "0") == "1"
    MAX_CONTENT_LENGTH = int(os.environ.get("RLREG_MAX_UPLOAD_BYTES", str(256 * 1024 * 1024)))
    PLOT_CACHE_DIR = os.environ.get("RLREG_PLOT_CACHE_DIR")  # None: in-memory cache only
    RUNS_PAGE_SIZE = 50
    PRODUCTION = os.environ.get("RLREG_ENV", "development") == "production"


def secret_key(config: Config) -> str:
    """The configured secret; a random one per process in development, none at all in production."""
    if config.SECRET_KEY:
        return config.SECRET_KEY
    if config.PRODUCTION:
        raise RuntimeError("RLREG_SECRET_KEY must be set when RLREG_ENV=production")
    return secrets.token_hex(32)
