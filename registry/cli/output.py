"""How the CLI prints: consoles, JSON, number formatting, registration reports and progress."""
from __future__ import annotations


import json
import sys
from typing import Any, Callable

import click
from rich.console import Console

from registry.core.jsonsafe import json_safe



# Piped output (files, grep, tests) gets wide tables instead of 80-column folding.
console = Console(width=None if sys.stdout.isatty() else 200)


err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(json_safe(value), indent=2, allow_nan=False, default=str))


class Progress:
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


def print_registration(result) -> None:  # result: RegistrationResult
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


def format_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
