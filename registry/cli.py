"""The ``rlreg`` command line. Library errors are caught here, once, and become exit code 1."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from registry.binding import binding_summary, describe_binding, provenance_caption
from registry.errors import AlreadyRegisteredError, InputError, RegistryError
from registry.jsonsafe import json_safe
from registry.series import DEFAULT_ORDER_POLICY, ORDER_POLICIES

# Piped output (files, grep, tests) gets wide tables instead of 80-column folding.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(json_safe(value), indent=2, allow_nan=False, default=str))


class RegistryGroup(click.Group):
    """Turns every RegistryError into a one-line message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AlreadyRegisteredError as exc:
            # Not a failure of the input, but nothing was registered: scripts must be able to tell.
            err_console.print(f"[yellow]{exc}[/yellow]", markup=True, highlight=False)
            ctx.exit(2)
        except RegistryError as exc:
            err_console.print(f"error: {exc}", markup=False, highlight=False)
            ctx.exit(1)
        except Exception as exc:  # noqa: BLE001 - the environment failing (disk, permissions), said in one line
            message = environment_error_message(exc)
            if message is None:
                raise
            err_console.print(f"error: {message}", markup=False, highlight=False)
            ctx.exit(1)


def environment_error_message(exc: BaseException) -> str | None:
    """One line for the failures of the machine rather than of the input (None: a bug, let it show)."""
    import errno

    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        text = str(exc.orig) if exc.orig is not None else str(exc)
        lowered = text.lower()
        if "readonly" in lowered or "read-only" in lowered or "read only" in lowered:
            return f"the database is read-only ({text}); nothing was changed"
        if "disk is full" in lowered or "no space" in lowered or "could not extend" in lowered:
            return f"the disk is full ({text}); the transaction was rolled back, nothing was changed"
        if "disk i/o error" in lowered:
            return (f"the database could not write to disk ({text}: a full disk, a quota or a failing device); "
                    "the transaction was rolled back, nothing was changed")
        if "unable to open" in lowered or "could not connect" in lowered or "connection" in lowered:
            return f"cannot reach the database ({text})"
        return f"the database refused the operation ({text}); nothing was changed"
    if isinstance(exc, OSError) and exc.errno is not None:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return f"no space left to write{where} ({exc.strerror})"
        return f"{exc.strerror}{where}"
    if isinstance(exc, UnicodeError):
        return f"an argument or file name is not valid UTF-8 ({exc.reason})"
    return None


@click.group(cls=RegistryGroup)
@click.option("--db", "db_url", envvar="RLREG_DATABASE_URL",
              help="Database URL (sqlite:///path or postgresql+psycopg://...); default: ./rlregistry.db")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """rlregistry: runs, their metrics, and what every number means."""
    ctx.obj = {"db_url": db_url}


def open_from(ctx: click.Context):  # -> Registry (imported lazily: keeps `rlreg --help` fast)
    from registry.store import Registry

    if "registry" not in ctx.obj:
        from config import ConfigError, load_limits

        try:
            limits = load_limits()
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        ctx.obj["registry"] = Registry(ctx.obj["db_url"], limits=limits)
        ctx.call_on_close(ctx.obj["registry"].close)
    return ctx.obj["registry"]


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@cli.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create the database, or upgrade it to the current schema, and load the default dictionary."""
    reg = open_from(ctx)
    click.echo(f"registry ready at {reg.engine.url.render_as_string(hide_password=True)}")


def _parse_assignments(values: tuple[str, ...], what: str) -> list[tuple[str, str]]:
    out = []
    for item in values:
        if "=" not in item:
            raise InputError(f"{what} {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        if not key.strip():
            raise InputError(f"{what} {item!r} has an empty key")
        out.append((key.strip(), value))
    return out


def _parse_semantics(values: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``--semantics actor/kl_loss:kl_estimator=k1`` -> {"actor/kl_loss": {"kl_estimator": "k1"}}."""
    out: dict[str, dict[str, str]] = {}
    for key_field, value in _parse_assignments(values, "--semantics"):
        if ":" not in key_field:
            raise InputError(f"--semantics {key_field!r} must look like METRIC_KEY:FIELD=VALUE")
        key, field = key_field.rsplit(":", 1)
        out.setdefault(key, {})[field] = value
    return out


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["tensorboard", "trainer_state", "verl_log", "csv", "jsonl",
                                                   "mlflow", "trackio", "wandb"]),
              help="Input format; detected from the content when omitted. mlflow, trackio and wandb read a "
                   "tracker's store: one run per tracker run, each imported once.")
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
    from trackers' stores (MLflow database or mlruns/, trackio database, W&B run dirs and history exports)."""
    from registry.importers.history import sniff_history
    from registry.importers.params import load_params_file, merge_params, params_from_assignments

    hparams = merge_params(load_params_file(params_file) if params_file else {}, params_from_assignments(params))
    semantics = _parse_semantics(semantic_overrides)
    if name and (len(paths) > 1 or recursive):
        raise InputError("--name applies to one run; register several paths without it")
    from registry.importers import run_paths

    reg = open_from(ctx)
    if recursive or fmt in ("mlflow", "trackio", "wandb") or (not fmt and any(sniff_history(p) for p in paths)):
        from registry.cli_history import register_many

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
        with _progress(f"reading {path.name}", quiet=as_json) as advance:
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
                _print_registration(result)
    if as_json:
        echo_json([r.to_dict() for r in results])


class _progress:
    """A live point counter on stderr for long imports (silent for --json and non-terminals)."""

    def __init__(self, label: str, quiet: bool):
        self.label = label
        self.quiet = quiet or not err_console.is_terminal

    def __enter__(self) -> Callable[[int], None]:
        if self.quiet:
            return lambda n: None
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                             TextColumn("{task.completed:,.0f} points"), TimeElapsedColumn(),
                             console=err_console, transient=True)
        self._bar.start()
        task = self._bar.add_task(self.label, total=None)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if not self.quiet:
            self._bar.stop()


def _print_registration(result) -> None:  # result: RegistrationResult
    verb = "replaced" if result.replaced else "registered"
    console.print(
        f"{verb} run [bold]{result.name}[/bold] ({result.run_id[:12]}): {result.series_count} series, "
        f"{result.point_count:,} points, format {result.source_format}, framework {result.framework or 'unknown'}",
        highlight=False,
    )
    if result.mapped:
        console.print(f"  mapped {len(result.mapped)}: "
                      + ", ".join(f"{k} -> {v}" for k, v in sorted(result.mapped.items())),
                      highlight=False, markup=False)
    for key, suggestions in sorted(result.unmapped.items()):
        hint = f" (did you mean {', '.join(suggestions)}?)" if suggestions else ""
        console.print(f"  unmapped: {key}{hint}", highlight=False, markup=False)
    if result.summary:
        console.print("  end-of-training summary, stored as scores: "
                      + ", ".join(f"{k}={v:g}" for k, v in result.summary.items()), highlight=False, markup=False)
    for warning in result.warnings:
        console.print(f"  warning: {warning}", highlight=False, markup=False, style="yellow")


@cli.command()
@click.option("--where", "where", help="Filter expression, e.g. 'learning_rate>1e-4 and algorithm=PPO'.")
@click.option("--project")
@click.option("--tag")
@click.option("--verdict", type=click.Choice(["success", "failed", "diverged", "inconclusive"]))
@click.option("--status", type=click.Choice(["running", "finished", "crashed", "incomplete"]))
@click.option("--sort", "order_by", default="-created_at", show_default=True, help="Column; prefix - for descending.")
@click.option("--limit", default=50, show_default=True)
@click.option("--offset", default=0)
@click.option("--param", "show_params", multiple=True, help="Hyperparameter column to show (repeatable).")
@json_option
@click.pass_context
def runs(ctx: click.Context, where: str | None, project: str | None, tag: str | None, verdict: str | None,
         status: str | None, order_by: str, limit: int, offset: int, show_params: tuple[str, ...],
         as_json: bool) -> None:
    """List runs, filtered by project, tag, outcome or hyperparameter expressions."""
    rows, total = open_from(ctx).list_runs(where=where, project=project, tag=tag, verdict=verdict, status=status,
                                           order_by=order_by, limit=limit, offset=offset)
    if as_json:
        echo_json({"total": total, "runs": rows})
        return
    table = Table(title=f"{len(rows)} of {total} runs", title_justify="left")
    for col in ("id", "name", "project", "algorithm", "framework", "task", "status", "verdict", "tags", *show_params):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["id"][:12], r["name"], r["project"], r["algorithm"] or "", r["framework"] or "",
                      r["task"] or "", r["status"], r["verdict"] or "", ", ".join(r["tags"]),
                      *(str(r["params"].get(p, "")) for p in show_params))
    console.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@cli.command()
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
        console.print("  scores: " + ", ".join(f"{k}={_fmt(v)}" for k, v in detail["scores"].items()), markup=False)
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
            params.add_row(k, _fmt(v))
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
                        str(s["count"]), f"{s['nan_count']}/{s['inf_count']}", _fmt(s["first"]), _fmt(s["last"]),
                        _fmt(s["min"]), _fmt(s["max"]))
    console.print(metrics)


@cli.command()
@click.argument("run")
@click.option("--verdict", type=click.Choice(["success", "failed", "diverged", "inconclusive"]))
@click.option("--score", "scores", multiple=True, help="Final score NAME=VALUE (repeatable).")
@click.option("--notes", help="Free-text notes (replaces earlier notes).")
@click.option("--checkpoint", "checkpoints", multiple=True, help="Checkpoint STEP=URI (repeatable).")
@click.option("--status", type=click.Choice(["running", "finished", "crashed"]))
@click.pass_context
def outcome(ctx: click.Context, run: str, verdict: str | None, scores: tuple[str, ...], notes: str | None,
            checkpoints: tuple[str, ...], status: str | None) -> None:
    """Record a run's outcome: verdict, final scores, notes, checkpoints."""
    parsed_scores = {}
    for key, value in _parse_assignments(scores, "--score"):
        try:
            parsed_scores[key] = float(value)
        except ValueError:
            raise InputError(f"--score {key}={value}: {value!r} is not a number") from None
    parsed_ckpts = []
    for step, uri in _parse_assignments(checkpoints, "--checkpoint"):
        if not step.lstrip("-").isdigit():
            raise InputError(f"--checkpoint {step}={uri}: the step must be a whole number")
        parsed_ckpts.append((int(step), uri))
    reg = open_from(ctx)
    reg.set_outcome(run, verdict=verdict, scores=parsed_scores, notes=notes, checkpoints=parsed_ckpts)
    if status:
        reg.set_status(run, status)
    click.echo(f"outcome of {run} updated")


@cli.command()
@click.argument("run")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, run: str, yes: bool) -> None:
    """Delete a run and all its series."""
    if not yes:
        click.confirm(f"delete run {run} and all its metrics?", abort=True)
    click.echo(f"deleted run {open_from(ctx).delete_run(run)}")


@cli.group()
def dictionary() -> None:
    """The metric dictionary: list, show, import, export, check-keys."""


@dictionary.command("list")
@click.option("--layer", type=click.Choice(["objective", "constraint", "diagnostic"]))
@json_option
@click.pass_context
def dictionary_list(ctx: click.Context, layer: str | None, as_json: bool) -> None:
    """Every canonical metric definition, by layer."""
    from registry.dictionary import definition_to_dict, list_definitions

    reg = open_from(ctx.find_root())
    with reg.read() as session:
        defs = [definition_to_dict(d) for d in list_definitions(session, layer)]
    if as_json:
        echo_json(defs)
        return
    table = Table(title=f"{len(defs)} metric definitions", title_justify="left")
    for col in ("layer", "name", "quantity", "averaging", "KL est.", "norm. axis", "logging point", "healthy",
                "aliases"):
        table.add_column(col, overflow="fold")
    for d in defs:
        hr = d["healthy_range"]
        healthy = "" if hr["low"] is None and hr["high"] is None else f"{_fmt(hr['low'])}..{_fmt(hr['high'])}"
        table.add_row(d["layer"], d["name"], d["quantity"], d["averaging"] or "", d["kl_estimator"] or "",
                      d["normalization_axis"] or "", d["logging_point"] or "", healthy, str(len(d["aliases"])))
    console.print(table)


@dictionary.command("show")
@click.argument("name")
@json_option
@click.pass_context
def dictionary_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One definition with its semantics and framework aliases."""
    from registry.dictionary import definition_to_dict, get_definition

    reg = open_from(ctx.find_root())
    with reg.read() as session:
        defn = get_definition(session, name)
        data = definition_to_dict(defn)
        data["version"] = defn.version
        data["history"] = [
            {"version": v.version, "author": v.author, "at": v.created_at.isoformat(), "note": v.change_note,
             "changed": v.changed_fields}
            for v in defn.versions
        ]
    if as_json:
        echo_json(data)
        return
    console.print(f"[bold]{data['name']}[/bold] — {data['display_name']} (v{data['version']}, {data['layer']})",
                  highlight=False)
    for f in ("description", "formula", "unit", "quantity", "averaging", "kl_estimator", "normalization_axis",
              "logging_point", "higher_is_better", "smoothing_window"):
        if data[f] not in (None, ""):
            console.print(f"  {f}: {data[f]}", highlight=False, markup=False)
    hr = data["healthy_range"]
    console.print(f"  healthy range: {_fmt(hr['low'])} .. {_fmt(hr['high'])}", markup=False)
    for task, r in data["task_ranges"].items():
        console.print(f"    {task}: {_fmt(r['low'])} .. {_fmt(r['high'])}", markup=False)
    aliases = Table(title="aliases", title_justify="left")
    for col in ("framework", "algorithm", "key", "semantics", "aggregation", "source"):
        aliases.add_column(col, overflow="fold")
    for a in data["aliases"]:
        sem = ", ".join(f"{k}={a[k]}" for k in ("kl_estimator", "averaging", "normalization_axis",
                                                "logging_point") if a[k])
        if a["sign"] != 1.0:
            sem += f", sign={a['sign']:g}"
        aliases.add_row(a["framework"], a["algorithm"], a["key"], sem, a["aggregation"], a["source"])
    console.print(aliases)


@dictionary.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--author", default="cli", show_default=True)
@click.option("--note", default="", help="Why: recorded in each changed definition's history.")
@json_option
@click.pass_context
def dictionary_import(ctx: click.Context, path: Path, author: str, note: str, as_json: bool) -> None:
    """Import definitions from YAML or JSON; each changed definition gets a new version."""
    from registry.dictionary import import_definitions, read_document

    specs = read_document(path)
    reg = open_from(ctx.find_root())
    with reg.transaction() as session:
        report = import_definitions(session, specs, author=author, note=note or f"imported from {path.name}")
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"created {len(report.created)}, updated {len(report.updated)}, unchanged {len(report.unchanged)}")


@dictionary.command("check-keys")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--shipped", is_flag=True, help="Check the shipped default dictionary instead of the registry's.")
@json_option
@click.pass_context
def dictionary_check_keys(ctx: click.Context, directory: Path, shipped: bool, as_json: bool) -> None:
    """Fail (exit 1) when a key of a pinned key list (DIRECTORY/*.txt) has no alias of its framework."""
    from registry.binding import AliasIndex
    from registry.keycheck import check_key_lists

    if shipped:
        index = shipped_alias_index()
    else:
        reg = open_from(ctx.find_root())
        with reg.read() as session:
            index = AliasIndex.load(session)
    report = check_key_lists(index, directory)
    if as_json:
        echo_json(report)
    else:
        for name, problems in report.items():
            click.echo(f"{name}: {'ok' if not problems else f'{len(problems)} key(s) without a definition'}")
            for problem in problems:
                click.echo(f"  {problem}")
    if any(report.values()):
        sys.exit(1)


def shipped_alias_index():  # -> AliasIndex over the shipped dictionary, in a throwaway SQLite registry
    import tempfile

    from registry.binding import AliasIndex
    from registry.store import Registry

    with tempfile.TemporaryDirectory() as tmp:
        reg = Registry(f"sqlite:///{tmp}/check.db")
        try:
            with reg.read() as session:
                return AliasIndex.load(session)
        finally:
            reg.close()


@dictionary.command("export")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="File (default: stdout).")
@click.pass_context
def dictionary_export(ctx: click.Context, fmt: str, output: Path | None) -> None:
    """Export the whole dictionary, ready to keep in git and import elsewhere."""
    from registry.dictionary import dump_document, export_document

    reg = open_from(ctx.find_root())
    with reg.read() as session:
        text = dump_document(export_document(session), fmt)
    if output:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)


@cli.group()
def user() -> None:
    """Users who may write through the web UI."""


@user.command("create")
@click.argument("username")
@click.password_option(help="Password (asked for when omitted).")
@click.pass_context
def user_create(ctx: click.Context, username: str, password: str) -> None:
    from registry.auth import create_user

    create_user(open_from(ctx.find_root()), username, password)
    click.echo(f"created user {username}")


@user.command("disable")
@click.argument("username")
@click.pass_context
def user_disable(ctx: click.Context, username: str) -> None:
    """Stop a user: their tokens and web sessions stop working at once (nothing is deleted)."""
    from registry.auth import set_user_disabled

    set_user_disabled(open_from(ctx.find_root()), username, True)
    click.echo(f"disabled user {username}: their tokens and sessions no longer work")


@user.command("enable")
@click.argument("username")
@click.pass_context
def user_enable(ctx: click.Context, username: str) -> None:
    """Let a disabled user in again (their unrevoked tokens work again; they log in anew)."""
    from registry.auth import set_user_disabled

    set_user_disabled(open_from(ctx.find_root()), username, False)
    click.echo(f"enabled user {username}")


@user.command("password")
@click.argument("username")
@click.password_option(help="New password (asked for when omitted).")
@click.pass_context
def user_password(ctx: click.Context, username: str, password: str) -> None:
    """Change a user's password; every web session of theirs ends."""
    from registry.auth import set_password

    ended = set_password(open_from(ctx.find_root()), username, password)
    click.echo(f"changed the password of {username}; ended {ended} session(s)")


@user.command("list")
@json_option
@click.pass_context
def user_list(ctx: click.Context, as_json: bool) -> None:
    from registry.auth import list_users

    rows = list_users(open_from(ctx.find_root()))
    if as_json:
        echo_json(rows)
        return
    table = Table(title=f"{len(rows)} users", title_justify="left")
    for col in ("user", "created", "state"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["user"], r["created_at"][:19], "disabled" if r["disabled"] else "active")
    console.print(table)


@cli.group()
def token() -> None:
    """API tokens for the Python client and scripts (sent as a bearer header)."""


@token.command("create")
@click.option("--user", "username", required=True)
@click.option("--name", required=True, help="What the token is for, e.g. 'cluster-a training'.")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), default="write", show_default=True,
              help="read: reads only (dashboards, CI); write: also runs, metrics, outcomes, uploads; "
                   "admin: also deleting runs and editing the dictionary and baselines.")
@click.pass_context
def token_create(ctx: click.Context, username: str, name: str, scope: str) -> None:
    """Create a token; its secret is printed once and never stored."""
    from registry.auth import create_token

    secret = create_token(open_from(ctx.find_root()), username, name, scope)
    click.echo(secret)
    err_console.print("store it now: only its hash is kept, it cannot be shown again", style="yellow")


@token.command("revoke")
@click.option("--user", "username", required=True)
@click.option("--name", required=True)
@click.pass_context
def token_revoke(ctx: click.Context, username: str, name: str) -> None:
    from registry.auth import revoke_token

    revoke_token(open_from(ctx.find_root()), username, name)
    click.echo(f"revoked token {name!r} of {username}")


@token.command("list")
@json_option
@click.pass_context
def token_list(ctx: click.Context, as_json: bool) -> None:
    from registry.auth import list_tokens

    rows = list_tokens(open_from(ctx.find_root()))
    if as_json:
        echo_json(rows)
        return
    table = Table(title=f"{len(rows)} tokens", title_justify="left")
    for col in ("user", "name", "scope", "prefix", "created", "last used", "state"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["user"], r["name"], r["scope"], r["prefix"] + "...", r["created_at"][:19],
                      (r["last_used_at"] or "")[:19], "revoked" if r["revoked"] else "active")
    console.print(table)


@cli.command("export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
@click.option("--without-credentials", is_flag=True,
              help="Leave out users (password hashes) and API tokens (hashes and scopes).")
@click.pass_context
def export_cmd(ctx: click.Context, path: Path, force: bool, without_credentials: bool) -> None:
    """Write the whole registry to one file: runs, series, outcomes, the dictionary with its history,
    baselines, findings, embeddings, and (unless --without-credentials) users' password hashes and
    token hashes. It ends with a manifest (rows and a checksum per table) that import verifies."""
    from registry.transfer import export_registry

    counts = export_registry(open_from(ctx), path, overwrite=force, without_credentials=without_credentials)
    click.echo(f"wrote {path}: " + ", ".join(f"{n} {t}" for t, n in counts.items() if n))
    if without_credentials:
        click.echo("without users and API tokens")
    elif counts.get("users") or counts.get("api_tokens"):
        err_console.print(f"it holds {counts.get('users', 0)} users' password hashes and {counts.get('api_tokens', 0)} "
                          "API token hashes: keep it as safe as the database (or use --without-credentials)",
                          style="yellow", highlight=False)


@cli.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_cmd(ctx: click.Context, path: Path) -> None:
    """Load an export into a new, empty registry (SQLite or PostgreSQL), in one transaction."""
    from registry.transfer import import_registry

    counts = import_registry(open_from(ctx), path)
    click.echo(f"imported {path}: " + ", ".join(f"{n} {t}" for t, n in counts.items() if n))


@cli.command()
@click.argument("run")
@click.option("--no-baseline", is_flag=True, help="Do not compare with the task's health baseline.")
@json_option
@click.pass_context
def diagnose(ctx: click.Context, run: str, no_baseline: bool, as_json: bool) -> None:
    """Where did this run go wrong? Findings in triage order, joint readings, rollback point."""
    from registry.health import diagnose_run

    result = diagnose_run(open_from(ctx), run, use_baseline=not no_baseline)
    if as_json:
        echo_json(result.to_dict())
        return
    console.print(f"[bold]{run}[/bold]: {result.summary()}", highlight=False)
    styles = {"critical": "bold red", "warning": "yellow", "info": "dim"}
    for f in result.findings:
        console.print(f.summary(), style=styles.get(f.severity), highlight=False, markup=False)
        if f.severity != "info":
            if f.cause is not None:
                c = f.causes[0]
                console.print(f"    cause ({f.confidence} confidence finding; support {c.support:.2f}): {c.text}",
                              highlight=False, markup=False)
            elif f.likely_causes:
                console.print(f"    likely ({f.confidence} confidence finding; no cause stands out): "
                              f"{'; '.join(f.likely_causes)}", highlight=False, markup=False)
            if f.suggested_action:
                console.print(f"    do: {f.suggested_action}", highlight=False, markup=False)
    for j in result.joint_readings:
        console.print(f"joint reading {j.summary()}\n    {j.interpretation}\n    do: {j.suggested_action}",
                      highlight=False, markup=False)
    if result.triage:
        console.print("triage:", style="bold")
        for t in result.triage:
            console.print(f"  {t.order}. [{t.layer}] {t.text}", highlight=False, markup=False)


def _prefix_value(text: str | None) -> float | int | None:
    """``0.2`` is a fraction of training; ``2000`` (a whole number above 1) is a step count."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"--prefix {text!r} must be a fraction (0.25) or a step count (2000)") from None
    return int(value) if value > 1 and value.is_integer() else value


@cli.command()
@click.argument("run")
@click.option("--metrics", help="Comma-separated metrics: canonical names, raw keys, or reward / kl / entropy ...")
@click.option("--prefix", help="Match only the first part: a fraction (0.2) or a number of steps (2000).")
@click.option("--window", help="Match a window: START,END as fractions (0.2,0.4) or steps (1000,3000).")
@click.option("--anywhere", is_flag=True,
              help="Match the window or prefix against windows of the same length anywhere in each run "
                   "(where else did this pattern happen?).")
@click.option("-k", "k", default=10, show_default=True, help="How many neighbours.")
@click.option("--align", type=click.Choice(["fraction", "step"]), default="fraction", show_default=True)
@click.option("--normalize", type=click.Choice(["z", "raw"]), default="z", show_default=True)
@click.option("--where", help="Filter the candidates with the run filter language.")
@click.option("--same-task", is_flag=True)
@click.option("--same-project", is_flag=True)
@click.option("--same-algorithm", is_flag=True)
@click.option("--outcome", "outcomes", multiple=True,
              type=click.Choice(["success", "failed", "diverged", "inconclusive"]))
@json_option
@click.pass_context
def similar(ctx: click.Context, run: str, metrics: str | None, prefix: str | None, window: str | None,
            anywhere: bool, k: int, align: str, normalize: str, where: str | None, same_task: bool, same_project: bool,
            same_algorithm: bool, outcomes: tuple[str, ...], as_json: bool) -> None:
    """Which past runs looked like this one, and how did they end?"""
    from registry.similarity import find_similar_for_run

    span = None
    if window:
        parts = [_prefix_value(p.strip()) for p in window.split(",")]
        if len(parts) != 2:
            raise InputError(f"--window {window!r} must be START,END")
        span = (parts[0], parts[1])
    reg = open_from(ctx)
    detail = reg.run_detail(run)
    result = find_similar_for_run(
        reg, detail["id"], status=detail["status"], metrics=metrics, k=k, prefix=_prefix_value(prefix), window=span,
        align=align, normalize=normalize, where=where, same_task=same_task, same_project=same_project,
        same_algorithm=same_algorithm, outcome=list(outcomes) or None, anywhere=anywhere,
    )
    if as_json:
        echo_json(result.to_dict())
        return
    console.print(result.summary, highlight=False, markup=False)
    table = Table(title=f"{len(result.neighbours)} nearest runs over {', '.join(result.metrics)} "
                        f"({result.engine})", title_justify="left")
    where_col = ("matched at",) if anywhere else ()
    for col in ("#", "run", "distance", *where_col, *result.metrics, "verdict", "scores", "differs in"):
        table.add_column(col, overflow="fold")
    for n in result.neighbours:
        diff = ", ".join(f"{key}={vals[1]}" for key, vals in list(n.param_diff.items())[:4])
        where_cell = (n.matched_at() or "",) if anywhere else ()
        table.add_row(str(n.rank), n.name, f"{n.distance:.3g}", *where_cell,
                      *(_fmt(n.metric_distances.get(m)) for m in result.metrics), n.verdict or "",
                      ", ".join(f"{a}={_fmt(b)}" for a, b in n.scores.items()), diff)
    if result.neighbours:
        console.print(table)
    for group in result.excluded:
        names = [r["name"] for r in group.get("runs", [])]
        example = f" (e.g. {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else ""
        why = "; ".join(group.get("differences") or []) or group.get("reason", "")
        console.print(f"not compared on {group.get('metric', 'any metric')}: {group.get('count', len(names))} run(s), "
                      f"{why}{example}", highlight=False, markup=False, style="dim")
    for warning in result.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False, style="yellow")


@cli.command()
@json_option
@click.pass_context
def reindex(ctx: click.Context, as_json: bool) -> None:
    """Recompute every run's similarity embeddings (after an upgrade, a method change, or installing pgvector)."""
    from registry.similarity import pgvector_status, rebuild_embeddings
    from registry.similarity.index import NEEDS_SUPERUSER, NOT_ENABLED_HINT

    reg = open_from(ctx)
    report = rebuild_embeddings(reg)
    if as_json:
        echo_json(report)
    else:
        click.echo(f"embeddings rebuilt for {report['runs']} runs: {report['rows_written']} rows written, "
                   f"{report['old_version_rows_dropped']} rows of older versions dropped")
        status = pgvector_status(reg.engine)
        where = {"ready": "inside PostgreSQL (pgvector HNSW)", "not postgresql": "in-process NumPy (SQLite)"}
        click.echo(f"candidate stage: {where.get(status, f'in-process NumPy (pgvector {status})')}")
        if status == NEEDS_SUPERUSER:
            click.echo(NOT_ENABLED_HINT)


@cli.group()
def baseline() -> None:
    """Health baselines per task, learned from runs marked healthy."""


@baseline.command("build")
@click.argument("task")
@click.option("--run", "runs", multiple=True,
              help="Learn from these runs (default: runs with verdict success or tag healthy).")
@click.option("--author", default="cli", show_default=True)
@click.option("--allow-weak", is_flag=True,
              help="Accept fewer than 3 healthy runs (the baseline is labelled weak wherever it is used).")
@json_option
@click.pass_context
def baseline_build(ctx: click.Context, task: str, runs: tuple[str, ...], author: str, allow_weak: bool,
                   as_json: bool) -> None:
    """Learn (or re-learn) the baseline profile of TASK and store it."""
    from registry.diagnosis.baseline import baseline_strength
    from registry.health import build_task_baseline

    profile = build_task_baseline(open_from(ctx.find_root()), task, list(runs) or None, author=author,
                                  allow_weak=allow_weak)
    if as_json:
        echo_json(profile.to_dict())
    else:
        click.echo(f"baseline for {task}: {len(profile.metrics)} metrics from {profile.n_runs} healthy run(s)"
                   f" ({baseline_strength(profile)})")


@baseline.command("show")
@click.argument("task")
@json_option
@click.pass_context
def baseline_show(ctx: click.Context, task: str, as_json: bool) -> None:
    """The baseline table: metric, early range, mid range, warning signal."""
    from registry.health import require_baseline

    profile, meta = require_baseline(open_from(ctx.find_root()), task)
    if as_json:
        echo_json({**profile.to_dict(), **meta})
        return
    table = Table(title=f"baseline {task}: {profile.n_runs} run(s), updated {meta['updated_at'][:19]} by "
                        f"{meta['updated_by']}", title_justify="left")
    for col in ("metric", f"early (<= step {profile.early_end_step})",
                f"mid (steps {profile.mid_start_step}-{profile.mid_end_step})", "warning signal"):
        table.add_column(col, overflow="fold")
    band = lambda b: "" if b is None else f"{b.low:.4g} .. {b.high:.4g} (median {b.median:.4g})"  # noqa: E731
    for name, m in profile.metrics.items():
        table.add_row(name, band(m.early), band(m.mid), m.warning)
    console.print(table)


@cli.command()
@click.option("--db", "demo_db", default="demo-registry/rlregistry.db", show_default=True,
              help="SQLite file the demo fills (reused when it exists).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--serve/--no-serve", default=True, show_default=True, help="Serve the web UI afterwards.")
@click.option("--shared-data", type=click.Path(path_type=Path), help="Directory of real TensorBoard runs to add.")
def demo(demo_db: str, host: str, port: int, serve: bool, shared_data: Path | None) -> None:
    """Fill a SQLite registry with realistic PPO and GRPO runs, then serve the UI on 127.0.0.1."""
    from registry.demo import build_demo

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
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes (gunicorn when above 1; about one per core, over PostgreSQL).")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 256), help="Threads per process.")
@click.option("--db", "serve_db", help="Database URL to serve (the same as rlreg --db URL serve).")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, workers: int, threads: int, serve_db: str | None) -> None:
    """Serve the web UI and JSON API (127.0.0.1 by default)."""
    from registry.db import default_database_url

    _serve(serve_db or ctx.obj["db_url"] or default_database_url(), host, port, workers, threads)


# Defined in its own module (it needs the helpers above): following growing logs and spool files.
from registry.cli_follow import follow  # noqa: E402

cli.add_command(follow)


def main() -> None:
    cli(prog_name="rlreg")


if __name__ == "__main__":
    sys.exit(main())
