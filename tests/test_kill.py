"""A registration killed with SIGKILL part-way leaves no half-written run; re-running completes it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from registry import Registry, open_registry

# Many series make the write transaction a large share of the run, so kills land inside it.
ROWS, COLS = 400, 1500


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.csv"
    rng = np.random.default_rng(0)
    data = np.column_stack([np.arange(1, ROWS + 1), rng.normal(size=(ROWS, COLS))])
    header = "step," + ",".join(f"m{i}" for i in range(COLS))
    np.savetxt(path, data, delimiter=",", header=header, comments="", fmt=["%d"] + ["%.17g"] * COLS)
    return path


def _register(url: str, path: Path) -> subprocess.Popen:
    env = {**os.environ, "RLREG_DATABASE_URL": url}
    return subprocess.Popen([sys.executable, "-m", "registry.cli", "register", str(path), "--name", "big"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _assert_consistent(reg: Registry) -> bool:
    rows, total = reg.list_runs(limit=None)
    if total == 0:
        return False
    assert total == 1
    detail = reg.run_detail(rows[0]["id"])
    assert detail["status"] == "finished"
    assert sorted(s["count"] for s in detail["series"]) == [ROWS] * COLS
    return True


def test_sigkill_mid_registration(db_url: str, big_csv: Path, tmp_path: Path):
    # Time one whole registration, then kill at points spread over that duration, so some
    # kills land while reading the file and some inside the write transaction.
    start = time.perf_counter()
    assert _register(f"sqlite:///{tmp_path / 'timing.db'}", big_csv).wait(120) == 0
    duration = time.perf_counter() - start
    open_registry(db_url).close()
    seen_complete = False
    for fraction in (0.55, 0.65, 0.75, 0.85, 0.92):
        delay = duration * fraction
        proc = _register(db_url, big_csv)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reg = open_registry(db_url)
        seen_complete = _assert_consistent(reg) or seen_complete
        reg.close()
        if seen_complete:
            break
    proc = _register(db_url, big_csv)
    # When a killed attempt had already committed, registering again is refused as a duplicate (exit 2).
    assert proc.wait(120) == (2 if seen_complete else 0)
    reg = open_registry(db_url)
    assert _assert_consistent(reg)
    if db_url.startswith("sqlite"):
        with reg.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    reg.close()
