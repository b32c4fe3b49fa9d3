"""Error pages and JSON errors: a registry error's status, and never a traceback in an answer."""
from __future__ import annotations

from flask import Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import DataError
from werkzeug.exceptions import HTTPException

from registry.core.errors import AlreadyRegisteredError, LimitExceededError, NotFoundError, RegistryError
from registry.store.auth import AuthError

def _wants_json() -> bool:
    return request.path.startswith("/api/")


def status_for(exc: RegistryError) -> int:
    if isinstance(exc, LimitExceededError):
        return exc.status
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, AuthError):
        return 401
    if isinstance(exc, AlreadyRegisteredError):
        return 409
    return 400


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(RegistryError)
    def _registry_error(exc: RegistryError):  # noqa: ANN202
        status = status_for(exc)
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
