"""Integration benchmarks: what logging costs a training loop, and how fast an MLflow history imports.

1. Per-``log``-call overhead of 30 metrics through ``StreamingRun`` (what every integration calls),
   into a local SQLite registry and into a registry server over HTTP (waitress on 127.0.0.1, API
   token), amortised over the run including the final flush; printed next to the same loop
   logging with ``mlflow.log_metrics`` (SQLite tracking store) and ``trackio.log``, in the same run.
   Target: < 1 ms per call for the registry.
2. Importing an MLflow tracking database of R runs x M metrics x S steps (``rlreg register``'s
   path, ``Registry.register_all`` with the format detected: read and register every run) against MLflow's own client reading the same metrics
   (``MlflowClient.get_metric_history`` for every run and metric). Target: >= 20x faster.
   The runs are created with MLflow's client; their metric rows are inserted with SQL into
   MLflow's own ``metrics`` table (logging 30 M points through the client would take hours).

Run: ``.venv/bin/python bench/log_overhead.py`` (defaults: 5,000 calls; 100 runs x 30 x 10,000);
``--quick`` for 1,000 calls and 10 runs x 30 x 2,000. Needs the ``integrations`` extra.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from registry import open_registry  # noqa: E402
from registry.store.auth import create_token, create_user  # noqa: E402
from registry.integrations.stream import StreamingRun  # noqa: E402

KEYS = [f"actor/metric_{i:02d}" for i in range(30)]
SERVER = """
import sys
from waitress import serve
from registry.web.app import create_app
app = create_app({"DATABASE_URL": sys.argv[1], "UPLOAD_DIR": sys.argv[3]})
serve(app, host="127.0.0.1", port=int(sys.argv[2]), threads=4, ident="rlregistry")
"""


def metrics(step: int) -> dict[str, float]:
    return {k: math.sin(step / 100 + i) for i, k in enumerate(KEYS)}


def time_loop(log, calls: int, finish) -> tuple[float, float]:
    """(seconds per call with the final flush/finish amortised in, seconds the finish took)."""
    start = time.perf_counter()
    for step in range(1, calls + 1):
        log(step, metrics(step))
    before_finish = time.perf_counter()
    finish()
    end = time.perf_counter()
    return (end - start) / calls, end - before_finish


def registry_local(tmp: Path, calls: int) -> tuple[float, float]:
    run = StreamingRun("bench-local", db=f"sqlite:///{tmp / 'local.db'}", spool_dir=tmp / "spool")
    return time_loop(run.log, calls, run.finish)


def registry_remote(tmp: Path, calls: int) -> tuple[float, float]:
    url = f"sqlite:///{tmp / 'server.db'}"
    with open_registry(url) as reg:
        create_user(reg, "bench", "bench-password")
        token = create_token(reg, "bench", "bench")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RLREG_ENV="production", RLREG_SECRET_KEY="bench-secret", PYTHONPATH=str(REPO))
    server = subprocess.Popen([sys.executable, "-c", SERVER, url, str(port), str(tmp / "uploads")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import requests

        for _ in range(300):
            try:
                if requests.get(f"http://127.0.0.1:{port}/api/openapi.yaml", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        run = StreamingRun("bench-remote", url=f"http://127.0.0.1:{port}", token=token, spool_dir=tmp / "spool")
        per_call = time_loop(run.log, calls, run.finish)
        assert run.spool_path is None, "the server did not take the points"
        return per_call
    finally:
        server.terminate()
        server.wait(30)


def mlflow_loop(tmp: Path, calls: int) -> tuple[float, float]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp / 'mlflow-log.db'}")
    mlflow.set_experiment("bench")
    mlflow.start_run(run_name="bench")
    return time_loop(lambda step, m: mlflow.log_metrics(m, step=step), calls, mlflow.end_run)


def trackio_loop(tmp: Path, calls: int) -> tuple[float, float]:
    os.environ["TRACKIO_DIR"] = str(tmp / "trackio")
    import trackio

    trackio.init(project="bench", name="bench")
    return time_loop(lambda step, m: trackio.log(m, step=step), calls, trackio.finish)


# --- MLflow import ----------------------------------------------------------------------------

def make_mlflow_db(path: Path, runs: int, n_metrics: int, steps: int) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{path}")
    experiment = client.create_experiment("bench")
    run_ids = []
    for r in range(runs):
        run = client.create_run(experiment, run_name=f"run-{r:03d}")
        client.log_param(run.info.run_id, "lr", 1e-6 * (r + 1))
        client.set_terminated(run.info.run_id)
        run_ids.append(run.info.run_id)
    conn = sqlite3.connect(path)
    rng = random.Random(0)
    keys = KEYS[:n_metrics]
    with conn:
        for run_id in run_ids:
            rows = ((key, rng.random(), 1_700_000_000_000 + step, run_id, step, 0)
                    for key in keys for step in range(steps))
            conn.executemany("insert into metrics (key, value, timestamp, run_uuid, step, is_nan) "
                             "values (?, ?, ?, ?, ?, ?)", rows)
    conn.close()


def import_with_registry(mlflow_db: Path, tmp: Path) -> tuple[float, float, int]:
    """``rlreg register mlflow.db``'s path (Registry.register_all, the format detected): (wall s, CPU s, points).
    A second import, which must register nothing, is checked outside the timing."""
    reg = open_registry(f"sqlite:///{tmp / 'import.db'}")
    start, cpu = time.perf_counter(), time.process_time()
    results = reg.register_all(mlflow_db)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    again = reg.register_all(mlflow_db)
    assert list(again) == [] and len(again.skipped) == len(results), "a second import registered something"
    reg.close()
    return elapsed, cpu, sum(r.point_count for r in results)


def read_with_mlflow(mlflow_db: Path, keys: list[str]) -> tuple[float, float, int]:
    """MLflow's own client reading every metric of every run: (wall s, CPU s, points)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{mlflow_db}")
    start, cpu = time.perf_counter(), time.process_time()
    points = 0
    runs = client.search_runs(experiment_ids=[e.experiment_id for e in client.search_experiments()],
                              max_results=50000)
    for run in runs:
        for key in keys:  # the rows went in with SQL, so MLflow's latest_metrics does not list them
            points += len(client.get_metric_history(run.info.run_id, key))
    return time.perf_counter() - start, time.process_time() - cpu, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="log calls per logger")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--metrics", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--quick", action="store_true", help="1,000 calls; 10 runs x 30 metrics x 2,000 steps")
    parser.add_argument("--skip-import", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.runs, args.steps = 1000, 10, 2000
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if not args.skip_overhead:
            print(f"per-log-call cost, {len(KEYS)} metrics, {args.calls:,} calls, final flush included:")
            for label, fn in (("registry, local SQLite", registry_local), ("registry, remote HTTP", registry_remote),
                              ("mlflow.log_metrics (SQLite store)", mlflow_loop), ("trackio.log", trackio_loop)):
                try:
                    per_call, finish = fn(tmp, args.calls)
                except ImportError as exc:
                    print(f"  {label:36s} skipped ({exc})")
                    continue
                flag = "  (target < 1 ms)" if label.startswith("registry") else ""
                print(f"  {label:36s} {per_call * 1e3:8.3f} ms/call, of which the finish {finish:6.2f} s{flag}",
                      flush=True)
        if not args.skip_import:
            total = args.runs * args.metrics * args.steps
            print(f"\nMLflow import: {args.runs} runs x {args.metrics} metrics x {args.steps:,} steps "
                  f"= {total:,} points")
            mlflow_db = tmp / "mlflow.db"
            start = time.perf_counter()
            make_mlflow_db(mlflow_db, args.runs, args.metrics, args.steps)
            print(f"  (database built in {time.perf_counter() - start:.1f} s, "
                  f"{mlflow_db.stat().st_size / 1e6:.0f} MB)", flush=True)
            ours, ours_cpu, ours_points = import_with_registry(mlflow_db, tmp)
            print(f"  registry import (read + register)      {ours:8.1f} s  {ours_points / ours / 1e6:6.2f} M points/s"
                  f"  (CPU {ours_cpu:.1f} s)", flush=True)
            theirs, theirs_cpu, their_points = read_with_mlflow(mlflow_db, KEYS[:args.metrics])
            print(f"  MlflowClient.get_metric_history (read) {theirs:8.1f} s  "
                  f"{their_points / theirs / 1e6:6.2f} M points/s  (CPU {theirs_cpu:.1f} s)")
            assert ours_points == their_points == total, (ours_points, their_points, total)
            # Wall time is the figure; CPU time is printed too, as the machine may be shared.
            print(f"  ratio: {theirs / ours:.1f}x wall, {theirs_cpu / ours_cpu:.1f}x CPU (target >= 20x)")


if __name__ == "__main__":
    main()
