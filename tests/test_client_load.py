"""bench/load.py end to end, briefly: a production server, readers and streaming writers, exact counts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_load_bench_runs_clean_for_a_few_seconds(pg_url, tmp_path):
    out = tmp_path / "load.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "load.py"), "--db", pg_url, "--seconds", "4", "--readers", "2",
         "--writers", "2", "--threads", "4", "--batch-steps", "20", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    kinds = {r["kind"] for r in figures["rows"]}
    assert {"write_batch", "write_create", "write_status"} <= kinds and len(kinds) >= 6
    assert figures["errors"] == 0 and figures["problems"] == [] and figures["points"] > 0
    assert "every written point arrived exactly once" in result.stdout


def test_load_bench_on_sqlite_with_two_workers_against_one(tmp_path):
    pytest.importorskip("gunicorn")
    out = tmp_path / "load.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "load.py"), "--db", "sqlite", "--workers", "2", "--baseline",
         "--seconds", "3", "--readers", "2", "--writers", "2", "--threads", "4", "--batch-steps", "20",
         "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["workers"] == 2 and figures["baseline"]["workers"] == 1 and figures["backend"] == "sqlite"
    for run in (figures, figures["baseline"]):
        assert run["errors"] == 0 and run["lost_points"] == 0 and run["points"] > 0
    assert figures["throughput_ratio"] > 0 and "measured in this run" in result.stdout
