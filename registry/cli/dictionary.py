"""``rlreg dictionary``: list, show, import, export, and check a framework's keys."""
from __future__ import annotations


import sys
from pathlib import Path

import click
from rich.table import Table

from registry import open_registry
from registry.cli.app import json_option, open_from
from registry.cli.output import console, echo_json, format_value


@click.group()
def dictionary() -> None:
    """The metric dictionary: list, show, import, export, check-keys."""


@dictionary.command("list")
@click.option("--layer", type=click.Choice(["objective", "constraint", "diagnostic"]))
@json_option
@click.pass_context
def dictionary_list(ctx: click.Context, layer: str | None, as_json: bool) -> None:
    """Every canonical metric definition, by layer."""
    from registry.dictionary.definitions import definition_to_dict, list_definitions

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
        healthy = "" if hr["low"] is None and hr["high"] is None else f"{format_value(hr['low'])}..{format_value(hr['high'])}"
        table.add_row(d["layer"], d["name"], d["quantity"], d["averaging"] or "", d["kl_estimator"] or "",
                      d["normalization_axis"] or "", d["logging_point"] or "", healthy, str(len(d["aliases"])))
    console.print(table)


@dictionary.command("show")
@click.argument("name")
@json_option
@click.pass_context
def dictionary_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One definition with its semantics and framework aliases."""
    from registry.dictionary.definitions import definition_to_dict, get_definition

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
    console.print(f"  healthy range: {format_value(hr['low'])} .. {format_value(hr['high'])}", markup=False)
    for task, r in data["task_ranges"].items():
        console.print(f"    {task}: {format_value(r['low'])} .. {format_value(r['high'])}", markup=False)
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
    from registry.dictionary.definitions import import_definitions, read_document

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
    from registry.dictionary.binding import AliasIndex
    from registry.dictionary.keycheck import check_key_lists

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

    from registry.dictionary.binding import AliasIndex

    with tempfile.TemporaryDirectory() as tmp:
        reg = open_registry(f"sqlite:///{tmp}/check.db")
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
    from registry.dictionary.definitions import dump_document, export_document

    reg = open_from(ctx.find_root())
    with reg.read() as session:
        text = dump_document(export_document(session), fmt)
    if output:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)
