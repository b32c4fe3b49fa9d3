"""bench/load.py end to end, briefly: a production server, readers and streaming writers, exact counts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
