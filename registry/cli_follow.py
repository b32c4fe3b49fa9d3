"""``rlreg follow``: register a log while a trainer writes it, or upload a spool file."""
from __future__ import annotations

from pathlib import Path

import click

from .cli import console, echo_json, json_option


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--spool", is_flag=True,
              help="PATH is a spool file a training run left when its registry was unreachable: upload it.")
@json_option
@click.pass_context
def follow(ctx: click.Context, path: Path, spool: bool, as_json: bool) -> None:
    """Follow a growing training log into a run (or, with --spool, upload a spooled run)."""
    from .integrations import spool as spool_io
    from .integrations.targets import LocalTarget

    if spool:
        target = LocalTarget(ctx.obj["db_url"])
        header = spool_io.read_header(path)
        counts = spool_io.replay(path, target)
        if as_json:
            echo_json({"run_id": header["spec"]["run_id"], **counts})
        else:
            console.print(f"uploaded run {header['spec']['name']} ({header['spec']['run_id'][:12]}) from {path}: "
                          f"{counts['batches']} batches, {counts['points']:,} points", highlight=False)
        return
    raise click.UsageError("following a log file: not available yet")
