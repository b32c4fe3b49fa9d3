"""``rlreg demo`` and ``rlreg serve``: the web UI on a demo registry or on yours."""
from __future__ import annotations


from pathlib import Path

import click



@click.command()
@click.option("--db", "demo_db", default="demo-registry/rlregistry.db", show_default=True,
              help="SQLite file the demo fills (reused when it exists).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--serve/--no-serve", default=True, show_default=True, help="Serve the web UI afterwards.")
@click.option("--shared-data", type=click.Path(path_type=Path), help="Directory of real TensorBoard runs to add.")
def demo(demo_db: str, host: str, port: int, serve: bool, shared_data: Path | None) -> None:
    """Fill a SQLite registry with realistic PPO and GRPO runs, then serve the UI on 127.0.0.1."""
    from registry.demo.builder import build_demo

    url = f"sqlite:///{Path(demo_db).resolve()}"
    Path(demo_db).resolve().parent.mkdir(parents=True, exist_ok=True)
    summary = build_demo(url, shared_data=shared_data, echo=click.echo)
    click.echo(summary)
    if serve:
        _serve(url, host, port)


def _serve(url: str, host: str, port: int, workers: int = 1, threads: int = 8) -> None:
    try:
        from registry.web import server
    except ImportError:
        click.echo("the web UI is not part of this build; the registry is ready for the CLI and Python API")
        return
    from config import ConfigError

    click.echo(f"serving on http://{host}:{port}/ with {workers} process(es) x {threads} threads  (Ctrl-C to stop)")
    try:
        if workers > 1:
            try:
                import gunicorn  # noqa: F401
            except ImportError:
                raise click.ClickException("--workers above 1 needs gunicorn: pip install 'rlregistry[server]' "
                                           "(or pip install gunicorn)") from None
            server.serve_gunicorn(url, host, port, workers, threads)
        else:
            server.serve_waitress(url, host, port, threads)
    except (ConfigError, server.ServeError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes (gunicorn when above 1; about one per core, over PostgreSQL).")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 256), help="Threads per process.")
@click.option("--db", "serve_db", help="Database URL to serve (the same as rlreg --db URL serve).")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, workers: int, threads: int, serve_db: str | None) -> None:
    """Serve the web UI and JSON API (127.0.0.1 by default)."""
    from registry.db.engine import default_database_url

    _serve(serve_db or ctx.obj["db_url"] or default_database_url(), host, port, workers, threads)
