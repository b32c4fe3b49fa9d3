"""Serving the application: waitress in one process, or gunicorn with several worker processes.

Every worker builds its own application (``create_app``) after the fork, so no database
connection crosses a fork. Nothing a worker keeps in memory can serve stale data to a client of
another worker: run pages, series and findings are read from the database on every request;
plot images are cached under keys that include the run's data version and the definitions'
versions (read from the database per request); the alias index and the similarity matrices are
revalidated against a stamp read from the database on every use. What stays per process: the
failed-credential counts (a client's backoff is per worker) and the plot cache's memory.
"""
from __future__ import annotations

from typing import Any
from registry.web.app import create_app


def serve_waitress(url: str, host: str, port: int, threads: int = 8) -> None:
    from waitress import serve

    app = create_app({"DATABASE_URL": url})
    # Waitress enforces the upload limit itself, before spooling a body to disk.
    serve(app, host=host, port=port, threads=threads, max_request_body_size=app.config["MAX_CONTENT_LENGTH"])


def serve_gunicorn(url: str, host: str, port: int, workers: int, threads: int = 8) -> None:
    """gunicorn with ``workers`` processes of ``threads`` threads each (gthread workers)."""
    from gunicorn.app.base import BaseApplication

    create_app({"DATABASE_URL": url}).extensions["rlregistry"].close()  # settings and schema checked before forking

    class Application(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            options = {"bind": f"{host}:{port}", "workers": workers, "threads": threads, "worker_class": "gthread",
                       "timeout": 120, "graceful_timeout": 30, "keepalive": 5, "accesslog": None,
                       "preload_app": False}
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return create_app({"DATABASE_URL": url})

    Application().run()
