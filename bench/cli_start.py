"""How fast the CLI answers: ``rlreg --help`` and ``rlreg runs`` on a small registry, each a new process.

Measured in the same run, as references: a bare ``python -c pass``, and the same listing through
the store (``open_registry(url).list_runs()`` plus the table, in a script), which is what
``rlreg runs`` did before it read rows through Core. Each figure is the best of ``--repeat``
runs (bytecode cached, first run discarded). Target: ``rlreg --help`` and ``rlreg runs`` under
0.3 s on a registry of 5 runs.

Run: .venv/bin/python bench/cli_start.py [--repeat N] [--runs N]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SWEEP = ROOT / "tests" / "data" / "real" / "sb3_sweep"
TARGET_S = 0.3

THROUGH_THE_STORE = """
import sys
from registry import open_registry
from registry.cli.run_table import resolve_columns, table_cells
from registry.cli.output import console
from rich.table import Table
reg = open_registry(sys.argv[1])
rows, total = reg.list_runs()
columns = resolve_columns(reg, rows, None)
table = Table(title=f"{len(rows)} of {total} runs")
for c in columns:
    table.add_column(c.name)
for row in table_cells(reg, rows, columns):
    table.add_row(*(str(v) for v in row))
console.print(table)
"""


def best_of(cmd: list[str], repeat: int) -> float:
    subprocess.run(cmd, check=True, capture_output=True)  # warm the bytecode cache and the OS cache
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5, help="runs in the registry listed")
    args = ap.parse_args(argv)
    from registry import open_registry

    rlreg = [sys.executable, "-m", "registry.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        reg = open_registry(url)
        for run in sorted(p for p in SWEEP.iterdir() if p.is_dir())[:args.runs]:
            reg.register(run, name=run.name)
        reg.close()
        figures = {
            "python -c pass": best_of([sys.executable, "-c", "pass"], args.repeat),
            "rlreg --help": best_of([*rlreg, "--help"], args.repeat),
            f"rlreg runs ({args.runs} runs)": best_of([*rlreg, "--db", url, "runs"], args.repeat),
            "the same listing through the store": best_of([sys.executable, "-c", THROUGH_THE_STORE, url], args.repeat),
        }
    store = figures["the same listing through the store"]
    print(f"best of {args.repeat}, each a new process:")
    for name, seconds in figures.items():
        print(f"  {name:<38} {seconds:6.3f} s   {seconds / store:5.2f} x the listing through the store")
    missed = [name for name, s in figures.items() if name.startswith("rlreg") and s >= TARGET_S]
    print("target: rlreg --help and rlreg runs under 0.3 s: " + ("missed by " + ", ".join(missed) if missed else "met"))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
