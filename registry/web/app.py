"""The web UI and JSON API: ``create_app(test_config)`` builds the Flask application.

Configuration comes from :class:`config.Config` (environment ``RLREG_*``), overridden by
``test_config`` keys (``DATABASE_URL``, ``SECRET_KEY``, ``PLOT_CACHE_DIR``, ``WTF_CSRF_ENABLED``,
or ``REGISTRY`` to hand in an open :class:`~registry.store.facade.Registry`). Templates live in the
top-level ``templates/`` folder, static files in ``registry/web/static/``.

Blueprints: ``ui`` (runs table, run dashboard, comparison), ``dictionary`` (metric
dictionary, edit form), ``plots`` (rendered images and their data), ``api`` (JSON reads under
/api/), ``write_api`` (JSON writes and uploads under /api/), ``auth`` (login and logout).

Security: every write view is guarded by :func:`registry.web.security.write_access_required`
(API token or session login + CSRF token); reads need a login only with
``REQUIRE_LOGIN_FOR_READS``. ``RLREG_ENV=production`` refuses to start without
``RLREG_SECRET_KEY``. Bodies larger than ``MAX_CONTENT_LENGTH`` are refused with 413 from
their ``Content-Length`` before a byte of them is read (a body without one is cut off at
the limit while it streams).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flask import Flask, request
from werkzeug.exceptions import RequestEntityTooLarge

from config import load_settings, secret_key
from registry import open_registry
from registry.core.errors import InputError
from registry.core.jsonsafe import has_unstorable_text
from registry.web import (
    api,
    api_docs,
    auth_views,
    baseline_views,
    dictionary_views,
    edit_views,
    plot_api,
    plots,
    runs_views,
    vendor,
    views,
    write_api,
)
from registry.web.cache import PlotCache
from registry.web.context import csrf
from registry.web.error_pages import register_error_handlers
from registry.web.formatting import register_template_helpers
from registry.web.queries import RefMemo
from registry.web.security import FailureThrottle, Throttles, require_login_for_reads

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATE_DIR = PACKAGE_DIR / "templates"  # a link to the top-level templates/ (a copy in a wheel)
STATIC_DIR = PACKAGE_DIR / "static"



def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, template_folder=str(TEMPLATE_DIR), static_folder=str(STATIC_DIR),
                static_url_path="/static")
    app.config.update(load_settings())
    if test_config:
        app.config.update(test_config)
    # Production: the configured secret or no start at all (config.secret_key raises).
    app.config["SECRET_KEY"] = secret_key(SimpleNamespace(
        SECRET_KEY=app.config.get("SECRET_KEY"), PRODUCTION=bool(app.config.get("PRODUCTION"))))
    app.json.sort_keys = False

    registry = app.config.get("REGISTRY") or open_registry(app.config.get("DATABASE_URL"), limits=app.config["LIMITS"])
    app.extensions["rlregistry"] = registry
    app.extensions["rlregistry.refs"] = RefMemo(ttl=float(app.config["PLOT_REF_TTL"]))
    app.extensions["rlregistry.plot_cache"] = PlotCache(
        max_bytes=app.config["PLOT_CACHE_MAX_BYTES"], directory=app.config.get("PLOT_CACHE_DIR"))

    window = float(app.config["LOGIN_WINDOW_SECONDS"])
    backoff = float(app.config["LOGIN_MAX_BACKOFF_SECONDS"])
    app.extensions["rlregistry.throttle"] = Throttles(
        FailureThrottle(int(app.config["LOGIN_MAX_FAILURES_PER_USER_AND_CLIENT"]), window, backoff),
        FailureThrottle(int(app.config["LOGIN_MAX_FAILURES_PER_CLIENT"]), window, backoff))

    @app.before_request
    def _refuse_large_bodies():  # noqa: ANN202 - before CSRF, which would read the form
        limit = app.config.get("MAX_CONTENT_LENGTH")
        if limit and request.content_length is not None and request.content_length > limit:
            raise RequestEntityTooLarge(
                f"the request body is {request.content_length} bytes; the limit is {limit} bytes")

    @app.before_request
    def _refuse_nul_characters():  # noqa: ANN202 - PostgreSQL text cannot hold NUL: a clean 400, not a 500
        values = [*request.args.keys(), *request.args.values(), *(request.view_args or {}).values()]
        if request.mimetype == "application/x-www-form-urlencoded":  # multipart: not parsed before the auth check
            values += [*request.form.keys(), *request.form.values()]
        if has_unstorable_text(values):
            raise InputError("the request contains a NUL character or a lone surrogate")

    app.before_request(require_login_for_reads)
    csrf.init_app(app)
    register_template_helpers(app)
    register_error_handlers(app)

    @app.after_request
    def _security_headers(response):  # noqa: ANN001, ANN202
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        csp = app.config.get("CONTENT_SECURITY_POLICY")
        if csp:
            response.headers.setdefault("Content-Security-Policy", csp)
        return response

    app.register_blueprint(views.bp)
    app.register_blueprint(baseline_views.bp)
    app.register_blueprint(dictionary_views.bp)
    app.register_blueprint(plots.bp)
    app.register_blueprint(write_api.bp)
    app.register_blueprint(plot_api.bp)
    app.register_blueprint(vendor.bp)
    app.register_blueprint(api_docs.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(auth_views.bp)
    app.register_blueprint(edit_views.bp)
    app.register_blueprint(runs_views.bp)
    # JSON API: no form tokens. Writes there carry write_access_required, which asks a session
    # login for the CSRF token (X-CSRFToken) and a bearer token for nothing more.
    csrf.exempt(api.bp)
    csrf.exempt(write_api.bp)
    return app
