"""The web UI and JSON API: ``create_app(test_config)`` builds the Flask application.

Configuration comes from :class:`config.Config` (environment ``RLREG_*``), overridden by
``test_config`` keys (``DATABASE_URL``, ``SECRET_KEY``, ``PLOT_CACHE_DIR``, ``WTF_CSRF_ENABLED``,
or ``REGISTRY`` to hand in an open :class:`~registry.store.Registry`). Templates live in the
top-level ``templates/`` folder, static files in ``registry/static/``.

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

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

from flask import Flask, current_app, jsonify, render_template, request
from flask_wtf.csrf import CSRFError, CSRFProtect
from markupsafe import Markup
from sqlalchemy.exc import DataError
from werkzeug.exceptions import HTTPException

from config import load_settings, secret_key

from registry.auth import AuthError
from registry.errors import (AlreadyRegisteredError, FilterSyntaxError, InputError, LimitExceededError, NotFoundError,
                      RegistryError)
from registry.store import Registry
from registry.web.cache import DEFAULT_MAX_BYTES, PlotCache

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATE_DIR = PACKAGE_DIR.parents[1] / "templates"
STATIC_DIR = PACKAGE_DIR.parent / "static"

DEFAULT_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)

csrf = CSRFProtect()


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, template_folder=str(TEMPLATE_DIR), static_folder=str(STATIC_DIR),
                static_url_path="/static")
    app.config.update(load_settings())
    app.config.setdefault("PLOT_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)
    app.config.setdefault("CONTENT_SECURITY_POLICY", DEFAULT_CSP)
    app.config["JSON_SORT_KEYS"] = False
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    if test_config:
        app.config.update(test_config)
    # Production: the configured secret or no start at all (config.secret_key raises).
    app.config["SECRET_KEY"] = secret_key(SimpleNamespace(
        SECRET_KEY=app.config.get("SECRET_KEY"), PRODUCTION=bool(app.config.get("PRODUCTION"))))
    app.json.sort_keys = False

    registry = app.config.get("REGISTRY") or Registry(app.config.get("DATABASE_URL"), limits=app.config["LIMITS"])
    app.extensions["rlregistry"] = registry
    from registry.web.queries import RefMemo

    app.extensions["rlregistry.refs"] = RefMemo(ttl=float(app.config.get("PLOT_REF_TTL", 2.0)))
    app.extensions["rlregistry.plot_cache"] = PlotCache(
        max_bytes=app.config["PLOT_CACHE_MAX_BYTES"], directory=app.config.get("PLOT_CACHE_DIR"))

    from registry.web.security import FailureThrottle, Throttles, require_login_for_reads

    window = float(app.config["LOGIN_WINDOW_SECONDS"])
    backoff = float(app.config["LOGIN_MAX_BACKOFF_SECONDS"])
    app.extensions["rlregistry.throttle"] = Throttles(
        FailureThrottle(int(app.config["LOGIN_MAX_FAILURES_PER_USER_AND_CLIENT"]), window, backoff),
        FailureThrottle(int(app.config["LOGIN_MAX_FAILURES_PER_CLIENT"]), window, backoff))

    @app.before_request
    def _refuse_large_bodies():  # noqa: ANN202 - before CSRF, which would read the form
        limit = app.config.get("MAX_CONTENT_LENGTH")
        if limit and request.content_length is not None and request.content_length > limit:
            from werkzeug.exceptions import RequestEntityTooLarge

            raise RequestEntityTooLarge(
                f"the request body is {request.content_length} bytes; the limit is {limit} bytes")

    @app.before_request
    def _refuse_nul_characters():  # noqa: ANN202 - PostgreSQL text cannot hold NUL: a clean 400, not a 500
        values = [*request.args.keys(), *request.args.values(), *(request.view_args or {}).values()]
        if request.mimetype == "application/x-www-form-urlencoded":  # multipart: not parsed before the auth check
            values += [*request.form.keys(), *request.form.values()]
        if any(isinstance(v, str) and ("\x00" in v or not v.encode("utf-8", "surrogatepass").decode(
                "utf-8", "ignore") == v) for v in values):
            raise InputError("the request contains a NUL character or a lone surrogate")

    app.before_request(require_login_for_reads)
    csrf.init_app(app)
    _register_template_helpers(app)
    _register_error_handlers(app)

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

    from registry.web import api, api_docs, auth_views, dictionary_views, plot_api, plots, vendor, views, write_api

    app.register_blueprint(views.bp)
    app.register_blueprint(dictionary_views.bp)
    app.register_blueprint(plots.bp)
    app.register_blueprint(write_api.bp)
    app.register_blueprint(plot_api.bp)
    app.register_blueprint(vendor.bp)
    app.register_blueprint(api_docs.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(auth_views.bp)
    # JSON API: no form tokens. Writes there carry write_access_required, which asks a session
    # login for the CSRF token (X-CSRFToken) and a bearer token for nothing more.
    csrf.exempt(api.bp)
    csrf.exempt(write_api.bp)
    return app


def get_registry() -> Registry:
    return current_app.extensions["rlregistry"]


def get_plot_cache() -> PlotCache:
    return current_app.extensions["rlregistry.plot_cache"]


# --- templates -------------------------------------------------------------------


def format_number(value: Any, digits: int = 4) -> str:
    """Numbers for tables: 4 significant digits, thousands separators for big whole numbers."""
    if value is None:
        return "\u2014"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if 1e4 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        text = f"{value:.{digits}g}"
        if "e" in text:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}e{int(exponent)}"
        return text
    return str(value)


def show_value(value: Any) -> str:
    """A definition field's value in the edit history: compact JSON for structures, "unset" for None."""
    if value is None:
        return "unset"
    if isinstance(value, (dict, list, tuple)):
        import json

        return json.dumps(value, sort_keys=True, default=str)
    return format_number(value, 6) if isinstance(value, (int, float)) else str(value)


def breakable(text: str) -> Markup:
    """Escaped text that may wrap after underscores and dots (long hyperparameter names in headers)."""
    out = Markup.escape(text)
    return out.replace("_", Markup("_<wbr>")).replace(".", Markup(".<wbr>"))


def modify_query(**changes: Any) -> str:
    """The current URL with some query parameters replaced (None removes one); lists repeat a key."""
    args = request.args.to_dict(flat=False)
    for key, value in changes.items():
        if value is None or value == "":
            args.pop(key, None)
        elif isinstance(value, (list, tuple)):
            args[key] = [str(v) for v in value]
        else:
            args[key] = [str(value)]
    query = urlencode([(k, v) for k, vs in args.items() for v in vs])
    return request.path + ("?" + query if query else "")


def _register_template_helpers(app: Flask) -> None:
    from registry.web.security import session_user

    app.jinja_env.globals["session_user"] = session_user
    app.jinja_env.filters["num"] = format_number
    app.jinja_env.filters["show"] = show_value
    app.jinja_env.filters["breakable"] = breakable
    app.jinja_env.globals["modify_query"] = modify_query
    app.jinja_env.trim_blocks = True
    app.jinja_env.lstrip_blocks = True

    @app.template_filter("when")
    def _when(value: Any) -> str:
        if not value:
            return "\u2014"
        text = value.isoformat() if hasattr(value, "isoformat") else str(value)
        return text.replace("T", " ")[:16]

    @app.template_filter("query")
    def _query(params: dict[str, Any]) -> str:
        items = [(k, v) for k, vals in params.items() for v in (vals if isinstance(vals, (list, tuple)) else [vals])
                 if v is not None and v != ""]
        return urlencode(items)


# --- errors ----------------------------------------------------------------------


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def _status_for(exc: RegistryError) -> int:
    if isinstance(exc, LimitExceededError):
        return exc.status
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, AuthError):
        return 401
    if isinstance(exc, AlreadyRegisteredError):
        return 409
    return 400


def _register_error_handlers(app: Flask) -> None:
    @app.errorhandler(RegistryError)
    def _registry_error(exc: RegistryError):  # noqa: ANN202
        status = _status_for(exc)
        if _wants_json():
            return jsonify({"error": str(exc)}), status
        title = {404: "Not found", 413: "Too large", 422: "Beyond a limit"}.get(status, "Bad request")
        return render_template("error.html", status=status, message=str(exc), title=title), status

    @app.errorhandler(CSRFError)
    def _csrf_error(exc: CSRFError):  # noqa: ANN202
        message = f"the form could not be accepted: {exc.description} Reload the page and try again."
        if _wants_json():
            return jsonify({"error": message}), 400
        return render_template("error.html", status=400, message=message, title="Form expired"), 400

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):  # noqa: ANN202
        extra = {k: v for k, v in exc.get_headers() if k.lower() in ("retry-after", "allow", "www-authenticate")}
        if _wants_json():
            return jsonify({"error": exc.description or exc.name}), exc.code, extra
        return (render_template("error.html", status=exc.code, message=exc.description, title=exc.name),
                exc.code, extra)

    @app.errorhandler(DataError)
    def _data_error(exc: DataError):  # noqa: ANN202 - a value the database cannot store: the client's fault
        message = "the database cannot store a value of this request"
        if _wants_json():
            return jsonify({"error": message}), 400
        return render_template("error.html", status=400, message=message, title="Bad request"), 400

    @app.errorhandler(500)
    def _server_error(exc: Exception):  # noqa: ANN202 - never a traceback or SQL in the answer
        message = "internal server error"
        if _wants_json():
            return jsonify({"error": message}), 500
        return render_template("error.html", status=500, message=message, title="Server error"), 500


__all__ = ["create_app", "get_registry", "get_plot_cache", "FilterSyntaxError", "InputError"]
