"""Ingest benchmark: 1,000,000 points (100 metrics x 10,000 steps) into a SQLite registry.

Prints points/second for a registration through the API, next to a reference measured in the
same run: raw ``sqlite3.executemany`` of the same rows into an indexed table in one transaction.
Also times reading one 100,000-point curve back. Run: ``.venv/bin/python bench/ingest.py``.
"""
from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import SeriesData, open_registry  # noqa: E402


def make_data(n_metrics: int, n_steps: int, seed: int = 0) -> dict[str, SeriesData]:
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n_steps + 1, dtype=np.int64)
    return {f"metric_{i:03d}": SeriesData(steps, rng.normal(size=n_steps).cumsum()) for i in range(n_metrics)}


def bench_reference(data: dict[str, SeriesData], path: Path) -> float:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE points (run_id TEXT, key TEXT, step INTEGER, value REAL)")
    conn.execute("CREATE INDEX ix_points ON points (run_id, key, step)")
    rows = [("run0", key, int(s), float(v)) for key, sd in data.items() for s, v in zip(sd.steps, sd.values)]
    start = time.perf_counter()
    with conn:
        conn.executemany("INSERT INTO points VALUES (?, ?, ?, ?)", rows)
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def bench_registry(data: dict[str, SeriesData], url: str) -> float:
    reg = open_registry(url)
    start = time.perf_counter()
    reg.register_arrays("bench", data, project="bench")
    elapsed = time.perf_counter() - start
    reg.close()
    return elapsed


def bench_read(url: str, n_points: int, repeats: int = 20) -> float:
    reg = open_registry(url)
    steps = np.arange(n_points, dtype=np.int64)
    run = reg.register_arrays("long", {"reward": SeriesData(steps, np.sin(steps / 1000.0))})
    reg.read_series(run.run_id, "reward")  # warm the connection pool
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        curve = reg.read_series(run.run_id, "reward")
        times.append(time.perf_counter() - start)
    assert len(curve.steps) == n_points
    reg.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    data = make_data(args.metrics, args.steps)
    n = args.metrics * args.steps
    with tempfile.TemporaryDirectory() as tmp:
        ref = bench_reference(data, Path(tmp) / "reference.db")
        ours = bench_registry(data, f"sqlite:///{Path(tmp) / 'registry.db.engine'}")
        read = bench_read(f"sqlite:///{Path(tmp) / 'read.db'}", 100_000)
    print(f"points: {n:,} ({args.metrics} metrics x {args.steps:,} steps)")
    print(f"reference  sqlite3.executemany, indexed table, one transaction: {n / ref:12,.0f} points/s  ({ref:.3f} s)")
    print(f"rlregistry register (one transaction):                           {n / ours:12,.0f} points/s  "
          f"({ours:.3f} s)")
    print(f"ratio rlregistry / reference: {ref / ours:.1f}x  (target >= 1.0x)")
    print(f"read one 100,000-point curve: {read * 1000:.2f} ms median  (target < 10 ms)")
    if ours > ref or read > 0.010:
        sys.exit(1)


if __name__ == "__main__":
    main()
