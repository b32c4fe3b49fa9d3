"""``rlreg export`` and ``rlreg import``: a whole registry as one JSON-lines file."""
from __future__ import annotations


from pathlib import Path

import click

from registry.cli.app import open_from
from registry.cli.output import err_console


@click.command("export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
@click.option("--without-credentials", is_flag=True,
              help="Leave out users (password hashes) and API tokens (hashes and scopes).")
@click.pass_context
def export_cmd(ctx: click.Context, path: Path, force: bool, without_credentials: bool) -> None:
    """Write the whole registry to one file: runs, series, outcomes, the dictionary with its history,
    baselines, findings, embeddings, and (unless --without-credentials) users' password hashes and
    token hashes. It ends with a manifest (rows and a checksum per table) that import verifies."""
    from registry.store.transfer import export_registry

    counts = export_registry(open_from(ctx), path, overwrite=force, without_credentials=without_credentials)
    click.echo(f"wrote {path}: " + ", ".join(f"{n} {t}" for t, n in counts.items() if n))
    if without_credentials:
        click.echo("without users and API tokens")
    elif counts.get("users") or counts.get("api_tokens"):
        err_console.print(f"it holds {counts.get('users', 0)} users' password hashes and {counts.get('api_tokens', 0)} "
                          "API token hashes: keep it as safe as the database (or use --without-credentials)",
                          style="yellow", highlight=False)


@click.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_cmd(ctx: click.Context, path: Path) -> None:
    """Load an export into a new, empty registry (SQLite or PostgreSQL), in one transaction."""
    from registry.store.transfer import import_registry

    counts = import_registry(open_from(ctx), path)
    click.echo(f"imported {path}: " + ", ".join(f"{n} {t}" for t, n in counts.items() if n))
