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

import socket
from typing import Any

from registry.web.app import create_app


def serve_waitress(url: str, host: str, port: int, threads: int = 8) -> None:
    from waitress import serve

    app = create_app({"DATABASE_URL": url})
    # Waitress enforces the upload limit itself, before spooling a body to disk.
    serve(app, host=host, port=port, threads=threads, max_request_body_size=app.config["MAX_CONTENT_LENGTH"])


def serve_gunicorn(url: str, host: str, port: int, workers: int, threads: int = 8) -> None:
    """gunicorn with ``workers`` processes of ``threads`` threads each (gthread workers).

    Each worker listens on its own socket (``SO_REUSEPORT``), so the kernel spreads new
    connections over the workers. With one shared socket the workers race in ``accept()``, and
    one of them can take every keep-alive connection of a burst of clients: the load benchmark
    then ran at one worker's throughput in half of the two-worker runs measured.
    """
    from gunicorn.app.base import BaseApplication

    create_app({"DATABASE_URL": url}).extensions["rlregistry"].close()  # settings and schema checked before forking
    ensure_port_free(host, port)

    class Application(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            options = {"bind": f"{host}:{port}", "workers": workers, "threads": threads, "worker_class": "gthread",
                       "timeout": 120, "graceful_timeout": 30, "keepalive": 5, "accesslog": None,
                       "preload_app": False, "reuse_port": True}
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return create_app({"DATABASE_URL": url})

    Application().run()


def ensure_port_free(host: str, port: int) -> None:
    """Refuse a port another server holds. Workers bind with ``SO_REUSEPORT``, which would let them
    share the port with another server that also set it (two registries answering by turns);
    a plain bind fails on a port in use, whoever holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: a port left in TIME_WAIT by an earlier server is free; a listening one is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


class ServeError(Exception):
    """The server cannot start (the port is taken)."""
