"""Diagnosis, similar runs and baselines: ``diagnose``, ``similar``, ``reindex``, ``baseline``."""
from __future__ import annotations



import click
from rich.table import Table

from registry.core.errors import InputError
from registry.core.run_fields import VERDICTS
from registry.cli.app import json_option, open_from
from registry.cli.output import console, echo_json, format_value


@click.command()
@click.argument("run")
@click.option("--no-baseline", is_flag=True, help="Do not compare with the task's health baseline.")
@json_option
@click.pass_context
def diagnose(ctx: click.Context, run: str, no_baseline: bool, as_json: bool) -> None:
    """Where did this run go wrong? Findings in triage order, joint readings, rollback point."""
    from registry.analysis.health import diagnose_run

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


@click.command()
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
              type=click.Choice(VERDICTS))
@json_option
@click.pass_context
def similar(ctx: click.Context, run: str, metrics: str | None, prefix: str | None, window: str | None,
            anywhere: bool, k: int, align: str, normalize: str, where: str | None, same_task: bool, same_project: bool,
            same_algorithm: bool, outcomes: tuple[str, ...], as_json: bool) -> None:
    """Which past runs looked like this one, and how did they end?"""
    from registry.analysis.similarity import find_similar_for_run

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
    for col in ("#", "run", "distance", "compared on", *where_col, *result.metrics, "verdict", "scores",
                "differs in"):
        table.add_column(col, overflow="fold")
    for n in result.neighbours:
        diff = ", ".join(f"{key}={vals[1]}" for key, vals in list(n.param_diff.items())[:4])
        where_cell = (n.matched_at() or "",) if anywhere else ()
        table.add_row(str(n.rank), n.name, f"{n.distance:.3g}", n.coverage, *where_cell,
                      *(format_value(n.metric_distances.get(m)) for m in result.metrics), n.verdict or "",
                      ", ".join(f"{a}={format_value(b)}" for a, b in n.scores.items()), diff)
    if result.neighbours:
        console.print(table)
    # the summary above already says "No close match" and the outcome; a close match is said here
    closeness = result.closeness or {}
    if closeness.get("message") and not closeness.get("no_close_match"):
        console.print("closeness: " + closeness["message"], highlight=False, markup=False, style="dim")
    for group in result.excluded:
        names = [r["name"] for r in group.get("runs", [])]
        example = f" (e.g. {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else ""
        why = "; ".join(group.get("differences") or []) or group.get("reason", "")
        console.print(f"not compared on {group.get('metric', 'any metric')}: {group.get('count', len(names))} run(s), "
                      f"{why}{example}", highlight=False, markup=False, style="dim")
    for warning in result.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False, style="yellow")


@click.command()
@json_option
@click.pass_context
def reindex(ctx: click.Context, as_json: bool) -> None:
    """Recompute every run's similarity embeddings (after an upgrade, a method change, or installing pgvector)."""
    from registry.analysis.similarity import pgvector_status, rebuild_embeddings
    from registry.analysis.similarity.index import NEEDS_SUPERUSER, NOT_ENABLED_HINT

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


@click.group()
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
    from registry.analysis.diagnosis.baseline import baseline_strength
    from registry.analysis.baselines import build_task_baseline

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
    """The baseline table: metric, early, mid and late ranges, warning signal."""
    from registry.analysis.baselines import require_baseline

    profile, meta = require_baseline(open_from(ctx.find_root()), task)
    if as_json:
        echo_json({**profile.to_dict(), **meta})
        return
    table = Table(title=f"baseline {task}: {profile.n_runs} run(s), updated {meta['updated_at'][:19]} by "
                        f"{meta['updated_by']}", title_justify="left")
    late = "late (not learned)" if profile.late_start_step is None else f"late (from step {profile.late_start_step})"
    for col in ("metric", f"early (<= step {profile.early_end_step})",
                f"mid (steps {profile.mid_start_step}-{profile.mid_end_step})", late, "warning signal"):
        table.add_column(col, overflow="fold")
    band = lambda b: "" if b is None else f"{b.low:.4g} .. {b.high:.4g} (median {b.median:.4g})"  # noqa: E731
    for name, m in profile.metrics.items():
        table.add_row(name, band(m.early), band(m.mid), band(m.late), m.warning)
    console.print(table)
