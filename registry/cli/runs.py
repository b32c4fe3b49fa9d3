"""Runs: ``init``, ``register``, ``runs``, ``show``, ``outcome``, ``delete``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from registry.dictionary.provenance_text import binding_summary, describe_binding, provenance_caption
from registry.core.errors import AlreadyRegisteredError, InputError
from registry.core.run_fields import DEFAULT_ORDER_POLICY, ORDER_POLICIES
from registry.core.run_fields import VERDICTS
from registry.cli.app import json_option, open_from, parse_assignments, parse_semantics, read_rows_from
from registry.cli.output import Progress, console, echo_json, err_console, format_value, print_registration


@click.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create the database, or upgrade it to the current schema, and load the default dictionary."""
    reg = open_from(ctx)
    click.echo(f"registry ready at {reg.engine.url.render_as_string(hide_password=True)}")


class PathOrDatabaseURL(click.Path):
    """An existing path, or a database URL (``sqlite:///mlflow.db``, ``postgresql://user@host/mlflow``:
    an MLflow tracking database, named the way MLflow's ``--backend-store-uri`` names it)."""

    name = "path_or_url"

    def __init__(self) -> None:
        super().__init__(exists=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from registry.importers import is_database_url

        if is_database_url(value):
            return value
        return super().convert(value, param, ctx)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=PathOrDatabaseURL())
@click.option("--format", "fmt", type=click.Choice(["tensorboard", "trainer_state", "verl_log", "csv", "jsonl",
                                                   "mlflow", "trackio", "wandb"]),
              help="Input format; detected from the content when omitted. mlflow, trackio and wandb read a "
                   "tracker's store (an MLflow database, its URL or mlruns/; a trackio database; W&B run "
                   "directories and history exports): one run per tracker run, each imported once.")
@click.option("--recursive", "-r", is_flag=True,
              help="Walk directories and register every run found (tracker stores, TensorBoard dirs, logs).")
@click.option("--name", help="Run name (default: the file or directory name).")
@click.option("--project", default="default", show_default=True)
@click.option("--algorithm", help="PPO, GRPO, RLOO, ...")
@click.option("--framework", help="verl, trl, openrlhf, stable-baselines3, cleanrl, custom (detected when omitted).")
@click.option("--task", help="Task or dataset (e.g. CartPole-v1, gsm8k).")
@click.option("--param", "params", multiple=True, help="Hyperparameter KEY=VALUE (repeatable).")
@click.option("--params", "params_file", type=click.Path(exists=True, path_type=Path),
              help="Hyperparameters from a YAML or JSON file.")
@click.option("--tag", "tags", multiple=True, help="Tag (repeatable).")
@click.option("--code-version", help="Git commit or other code version.")
@click.option("--status", type=click.Choice(["finished", "running", "crashed"]), default="finished", show_default=True)
@click.option("--on-disorder", type=click.Choice(ORDER_POLICIES), default=DEFAULT_ORDER_POLICY, show_default=True,
              help="Several points at one step: keep-all keeps them; a step that goes back (a restart): "
                   "keep-last drops what the restarted run logged again; error refuses both.")
@click.option("--semantics", "semantic_overrides", multiple=True,
              help="Override a series' semantics for this run: KEY:FIELD=VALUE, e.g. kl:kl_estimator=k1.")
@click.option("--replace", is_flag=True, help="Register again a source that was registered before.")
@json_option
@click.pass_context
def register(ctx: click.Context, paths: tuple[Path, ...], fmt: str | None, name: str | None, project: str,
             algorithm: str | None, framework: str | None, task: str | None, params: tuple[str, ...],
             params_file: Path | None, tags: tuple[str, ...], code_version: str | None, status: str,
             on_disorder: str, semantic_overrides: tuple[str, ...], replace: bool, as_json: bool,
             recursive: bool = False) -> None:
    """Register runs from training logs (TensorBoard dirs, trainer_state.json, verl logs, CSV, JSONL) and
    from trackers' stores (MLflow database, its URL or mlruns/, trackio database, W&B run dirs and
    history exports)."""
    from registry.importers.params import load_params_file, merge_params, params_from_assignments
    from registry.store.tracker_runs import store_format

    hparams = merge_params(load_params_file(params_file) if params_file else {}, params_from_assignments(params))
    semantics = parse_semantics(semantic_overrides)
    if name and (len(paths) > 1 or recursive):
        raise InputError("--name applies to one run; register several paths without it")
    from registry.importers import run_paths

    reg = open_from(ctx)
    if recursive or any(store_format(p, fmt) for p in paths):
        from registry.cli.history import register_many

        register_many(reg, paths, fmt=fmt, recursive=recursive, as_json=as_json, quiet=False, options=dict(
            name=name, project=project, algorithm=algorithm, framework=framework, task=task, params=hparams,
            tags=list(tags), code_version=code_version, semantics=semantics, status=status,
            on_disorder=on_disorder, replace=replace))
        return
    results = []
    for path in paths:
        several = len(run_paths(path, fmt)) > 1
        if name and several:
            raise InputError(f"--name applies to one run; {path} holds several runs (one per sub-directory)")
        # One progress bar per path, also when the path is a directory of several runs.
        with Progress(f"reading {path.name}", quiet=as_json) as advance:
            try:
                registered = reg.register_all(
                    path, format=fmt, name=name, project=project, algorithm=algorithm, framework=framework,
                    task=task, params=hparams, tags=list(tags), code_version=code_version, status=status,
                    on_disorder=on_disorder, replace=replace, semantics=semantics, progress=advance,
                )
            except AlreadyRegisteredError as exc:
                if len(paths) == 1 and not several:
                    raise
                err_console.print(f"[yellow]{path}: {exc}[/yellow]")
                continue
        results += registered
        if not as_json:
            for result in registered:
                print_registration(result)
    if as_json:
        echo_json([r.to_dict() for r in results])


@click.command()
@click.option("--where", "where", help="Filter expression, e.g. 'learning_rate>1e-4 and algorithm=PPO'.")
@click.option("--project")
@click.option("--tag")
@click.option("--verdict", type=click.Choice(VERDICTS))
@click.option("--status", type=click.Choice(["running", "finished", "crashed", "incomplete"]))
@click.option("--sort", "order_by", default="-created_at", show_default=True, help="Column; prefix - for descending.")
@click.option("--limit", default=50, show_default=True)
@click.option("--offset", default=0)
@click.option("--param", "show_params", multiple=True, help="Hyperparameter column to show (repeatable).")
@click.option("--columns", "columns", help="Comma-separated columns: run fields (id, name, project, algorithm, "
              "framework, task, status, verdict, tags, created), hyperparameters, score.NAME, metrics as "
              "NAME[:last|min|max|mean|first]. Default: the run fields, the hyperparameters that vary "
              "and the headline metrics' last values.")
@json_option
@click.pass_context
def runs(ctx: click.Context, where: str | None, project: str | None, tag: str | None, verdict: str | None,
         status: str | None, order_by: str, limit: int, offset: int, show_params: tuple[str, ...],
         columns: str | None, as_json: bool) -> None:
    """List runs, filtered by project, tag, outcome or hyperparameter expressions."""
    from registry.cli.run_table import resolve_columns, table_cells
    from registry.store.run_listing import list_runs

    reg = read_rows_from(ctx)
    rows, total = list_runs(reg, where=where, project=project, tag=tag, verdict=verdict, status=status,
                            order_by=order_by, limit=limit, offset=offset)
    chosen = resolve_columns(reg, rows, columns, list(show_params))
    cells = table_cells(reg, rows, chosen)
    if as_json:
        echo_json({"total": total, "runs": rows, "columns": [c.name for c in chosen],
                   "cells": [{c.name: v for c, v in zip(chosen, row)} for row in cells]})
        return
    table = Table(title=f"{len(rows)} of {total} runs", title_justify="left")
    for col in chosen:
        table.add_column(col.name, overflow="fold", justify="right" if col.numeric else "left",
                         no_wrap=col.name == "id", min_width=min(len(col.name), 16) if col.kind != "field" else None)
    for row in cells:
        table.add_row(*(format_value(v) if not isinstance(v, str) else v for v in row))
    console.print(table)


@click.command()
@click.argument("run")
@json_option
@click.pass_context
def show(ctx: click.Context, run: str, as_json: bool) -> None:
    """A run's hyperparameters, outcome, and every metric with its binding and summary."""
    detail = open_from(ctx).run_detail(run)
    if as_json:
        echo_json(detail)
        return
    console.print(f"[bold]{detail['name']}[/bold]  {detail['id']}", highlight=False)
    for label in ("project", "algorithm", "framework", "task", "status", "verdict", "code_version"):
        if detail.get(label):
            console.print(f"  {label}: {detail[label]}", highlight=False, markup=False)
    if detail["tags"]:
        console.print(f"  tags: {', '.join(detail['tags'])}", highlight=False, markup=False)
    if detail["scores"]:
        console.print("  scores: " + ", ".join(f"{k}={format_value(v)}" for k, v in detail["scores"].items()), markup=False)
    if detail.get("notes"):
        console.print(f"  notes: {detail['notes']}", markup=False)
    for c in detail["checkpoints"]:
        console.print(f"  checkpoint @ {c['step']}: {c['uri']}" + (f" ({c['note']})" if c["note"] else ""),
                      markup=False)
    if detail["params"]:
        params = Table(title="hyperparameters", title_justify="left")
        params.add_column("key")
        params.add_column("value")
        for k, v in detail["params"].items():
            params.add_row(k, format_value(v))
        console.print(params)
    for line in binding_summary(detail.get("binding") or {}):
        console.print(f"  {line}", highlight=False, markup=False)
    metrics = Table(title="metrics", title_justify="left")
    for col in ("key", "definition", "layer", "semantics", "points", "NaN/Inf", "first", "last", "min", "max"):
        metrics.add_column(col, overflow="fold")
    for s in detail["series"]:
        sem = s["semantics"] or {}
        sem_text = ", ".join(f"{k}={v}" for k, v in sem.items() if v not in (None, "n/a", "none"))
        if s["sign"] != 1.0:
            sem_text += f", sign={s['sign']:g}"
        if s["overrides"]:
            sem_text += " (run override: " + ", ".join(f"{k}={v}" for k, v in s["overrides"].items()) + ")"
        origin = provenance_caption(s.get("provenance"))
        if origin:
            sem_text += f" ({origin})"
        if s.get("labels"):
            sem_text += " {" + ", ".join(f"{k}={v}" for k, v in s["labels"].items()) + "}"
        sem_text = escape(sem_text)
        bound = "[red]unmapped[/red]"
        if s["definition"]:
            bound = f"{s['definition']} v{s['definition_version']}"
            if s["definition_current_version"] != s["definition_version"]:
                bound += f" (now v{s['definition_current_version']})"
            how = (s.get("provenance") or {}).get("how")
            if how == "guessed":
                bound += " [yellow](guessed)[/yellow]"
            elif how:
                bound += escape(f" ({describe_binding(s['provenance'])})")
        metrics.add_row(s["key"], bound, s["layer"] or "", sem_text,
                        str(s["count"]), f"{s['nan_count']}/{s['inf_count']}", format_value(s["first"]), format_value(s["last"]),
                        format_value(s["min"]), format_value(s["max"]))
    console.print(metrics)


@click.command()
@click.argument("run")
@click.option("--verdict", type=click.Choice(VERDICTS))
@click.option("--score", "scores", multiple=True, help="Final score NAME=VALUE (repeatable).")
@click.option("--notes", help="Free-text notes (replaces earlier notes).")
@click.option("--checkpoint", "checkpoints", multiple=True, help="Checkpoint STEP=URI (repeatable).")
@click.option("--status", type=click.Choice(["running", "finished", "crashed"]))
@click.pass_context
def outcome(ctx: click.Context, run: str, verdict: str | None, scores: tuple[str, ...], notes: str | None,
            checkpoints: tuple[str, ...], status: str | None) -> None:
    """Record a run's outcome: verdict, final scores, notes, checkpoints."""
    parsed_scores = {}
    for key, value in parse_assignments(scores, "--score"):
        try:
            parsed_scores[key] = float(value)
        except ValueError:
            raise InputError(f"--score {key}={value}: {value!r} is not a number") from None
    parsed_ckpts = []
    for step, uri in parse_assignments(checkpoints, "--checkpoint"):
        if not step.lstrip("-").isdigit():
            raise InputError(f"--checkpoint {step}={uri}: the step must be a whole number")
        parsed_ckpts.append((int(step), uri))
    reg = open_from(ctx)
    reg.set_outcome(run, verdict=verdict, scores=parsed_scores, notes=notes, checkpoints=parsed_ckpts)
    if status:
        reg.set_status(run, status)
    click.echo(f"outcome of {run} updated")


@click.command()
@click.argument("run")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, run: str, yes: bool) -> None:
    """Delete a run and all its series."""
    if not yes:
        click.confirm(f"delete run {run} and all its metrics?", abort=True)
    click.echo(f"deleted run {open_from(ctx).delete_run(run)}")
