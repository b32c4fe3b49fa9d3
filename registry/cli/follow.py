"""``rlreg follow``: register a verl log while the trainer writes it, or upload a spool file."""
from __future__ import annotations

from pathlib import Path

import click

from registry.cli.app import parse_semantics
from registry.cli.output import console, echo_json, err_console


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--spool", is_flag=True,
              help="PATH is a spool file a training run left when its registry was unreachable: upload it.")
@click.option("--name", help="Run name (default: the file name).")
@click.option("--project", default="default", show_default=True)
@click.option("--algorithm", help="PPO, GRPO, ...")
@click.option("--task", help="Task or dataset.")
@click.option("--param", "params", multiple=True, help="Hyperparameter KEY=VALUE (repeatable).")
@click.option("--params", "params_file", type=click.Path(exists=True, path_type=Path),
              help="Hyperparameters from a YAML or JSON file.")
@click.option("--tag", "tags", multiple=True, help="Tag (repeatable).")
@click.option("--semantics", "semantic_overrides", multiple=True, help="KEY:FIELD=VALUE, as for register.")
@click.option("--final-step", type=int, help="Stop (and mark the run finished) once this step is logged.")
@click.option("--idle-seconds", type=float, default=300.0, show_default=True,
              help="Stop (and mark the run finished) when the file has not grown for this long.")
@click.option("--poll-seconds", type=float, default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def follow(ctx: click.Context, path: Path, spool: bool, name: str | None, project: str, algorithm: str | None,
           task: str | None, params: tuple[str, ...], params_file: Path | None, tags: tuple[str, ...],
           semantic_overrides: tuple[str, ...], final_step: int | None, idle_seconds: float, poll_seconds: float,
           as_json: bool) -> None:
    """Follow a verl console log or verl file-backend JSONL into a run while it is written
    (tail; resume after a restart without duplicating points), or with --spool upload a spooled run."""
    from registry.integrations import spool as spool_io
    from registry.integrations.targets import LocalTarget

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
    from registry.integrations.follow import Follower
    from registry.importers.params import load_params_file, merge_params, params_from_assignments

    hparams = merge_params(load_params_file(params_file) if params_file else {}, params_from_assignments(params))
    follower = Follower(path, ctx.obj["db_url"], name=name, project=project, algorithm=algorithm, task=task,
                        params=hparams, tags=list(tags), semantics=parse_semantics(semantic_overrides),
                        final_step=final_step, idle_seconds=idle_seconds, poll_seconds=poll_seconds)
    if follower.skip_through is not None and not as_json:
        err_console.print(f"resuming run {follower.run_id[:12]} after step {follower.skip_through}", highlight=False)

    def progress(f: Follower) -> None:
        if not as_json and err_console.is_terminal:
            err_console.print(f"step {f.last_step}: {f.points:,} points", highlight=False)

    follower.run_until_done(progress)
    if as_json:
        echo_json({"run_id": follower.run_id, "points": follower.points, "last_step": follower.last_step})
    else:
        console.print(f"followed {path} into run {follower.run_id[:12]}: {follower.points:,} new points, "
                      f"last step {follower.last_step}", highlight=False)
