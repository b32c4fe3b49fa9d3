"""Load benchmark: the web app under a production WSGI server against SQLite or PostgreSQL, with
readers and streaming writers at once, then an exact count of every point written.

1. Creates a throwaway database: on the PostgreSQL server given by ``--db`` (or
   ``RLREG_BENCH_POSTGRES_URL``), or with ``--db sqlite`` a SQLite file in a temporary directory;
   fills it with the demo runs (``registry.demo.builder.build_demo``) and makes a user with a write token.
2. Starts ``rlreg serve --workers N --threads T`` in production mode with a random secret key, on
   127.0.0.1 on a free port: waitress for one process, gunicorn for several.
   With ``--baseline`` the same load first runs against one process (``--workers 1``) on its own
   fresh database, and the figures of both are printed with the throughput ratio.
3. For ``--seconds`` (default 60), ``--readers`` threads request the runs page, run dashboards,
   dashboard plot images (PNG), the JSON run list and JSON series (of the demo runs and of the
   runs being written), while ``--writers`` threads each stream one run through
   ``registry.client.RemoteRun`` (8 metrics a step, a batch every ``--batch-steps`` steps).
4. Stops the writers (each flushes and finishes its run), then reads every written run back from
   the database and checks each series point by point.

Prints requests/s, p50 and p99 latency per request kind, the error count and the lost-point count;
exits 1 on any error, any failed request, or any lost or duplicated point. Run:
``.venv/bin/python bench/load.py --db sqlite --workers 2 --baseline --seconds 60``. Only 127.0.0.1
is ever contacted.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from registry import open_registry  # noqa: E402
from registry.store.auth import create_token, create_user  # noqa: E402
from registry.client import RemoteError, RemoteRegistry  # noqa: E402

WRITER_KEYS = ("actor/ppo_kl", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm", "actor/kl_loss",
               "critic/score/mean", "critic/rewards/mean", "response_length/mean")


def writer_value(writer: int, key: str, step: int) -> float:
    """Deterministic, so the check can recompute every point; one non-finite value per 500 steps."""
    if key == "actor/grad_norm" and step % 500 == 0:
        return float("nan")
    return writer * 100.0 + WRITER_KEYS.index(key) + step * 1e-3


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []

    def record(self, kind: str, seconds: float, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.latency[kind].append(seconds)
            if not ok:
                self.errors[kind] += 1
                if len(self.error_samples) < 10:
                    self.error_samples.append(f"{kind}: {detail}")


class TimedSession(requests.Session):
    """Times every request the client library makes, by kind."""

    def __init__(self, stats: Stats) -> None:
        super().__init__()
        self.stats = stats

    def request(self, method, url, *args, **kwargs):  # noqa: ANN001, ANN201
        kind = ("write_batch" if url.endswith("/metrics") else "write_status" if url.endswith("/status")
                else "write_create" if url.endswith("/api/runs") and method == "POST" else f"client_{method.lower()}")
        start = time.perf_counter()
        try:
            response = super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            self.stats.record(kind, time.perf_counter() - start, False, repr(exc))
            raise
        self.stats.record(kind, time.perf_counter() - start, response.status_code < 400,
                          f"HTTP {response.status_code} {response.text[:200]}")
        return response


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def throwaway_database(server_url: str) -> tuple[str, Any]:
    name = f"rlreg_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(server_url).set(database=name).render_as_string(hide_password=False), (admin, name)


def drop_database(handle: Any) -> None:
    admin, name = handle
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live children (Linux /proc), 0 where unknown."""
    total = 0.0
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat_file.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def reader(base: str, stats: Stats, stop: threading.Event, seeded: list[dict[str, Any]],
           live: list[str], seed: int) -> None:
    rng = random.Random(seed)
    session = requests.Session()
    kinds = ("runs_page", "dashboard", "plot_png", "api_runs", "api_series", "api_series")
    while not stop.is_set():
        kind = rng.choice(kinds)
        use_live = bool(live) and rng.random() < 0.3
        if use_live:
            run_id, key = rng.choice(live), rng.choice(WRITER_KEYS)
        else:
            run = rng.choice(seeded)
            run_id, key = run["id"], rng.choice(run["keys"])
        url, params = {
            "runs_page": ("/runs", {"page": rng.randint(1, 2), "size": 20}),
            "dashboard": (f"/runs/{run_id}", None),
            "plot_png": (f"/plots/run/{run_id}", {"key": key}),
            "api_runs": ("/api/runs", {"filter": rng.choice(["algorithm=GRPO", "status=finished", "tag=demo",
                                                              "learning_rate>1e-6"]), "limit": 50}),
            "api_series": (f"/api/runs/{run_id}/series", {"key": key, "points": rng.choice([0, 500])}),
        }[kind]
        start = time.perf_counter()
        try:
            response = session.get(base + url, params=params, timeout=60)
            ok = response.status_code == 200
            detail = f"HTTP {response.status_code} {url} {response.text[:200]}"
            _ = response.content
        except requests.RequestException as exc:
            ok, detail = False, f"{url}: {exc!r}"
        stats.record(kind + ("_live" if use_live and kind not in ("runs_page", "api_runs") else ""),
                     time.perf_counter() - start, ok, detail)


def writer(base: str, token: str, stats: Stats, stop: threading.Event, index: int, batch_steps: int,
           live: list[str], results: dict[int, Any]) -> None:
    client = RemoteRegistry(base, token, session=TimedSession(stats), retry_seconds=120)
    try:
        run = client.create_run(f"load-writer-{index}", project="load", algorithm="GRPO", framework="verl",
                                params={"actor": {"lr": 1e-6 * (index + 1)}}, tags=["load"],
                                flush_points=batch_steps * len(WRITER_KEYS), flush_seconds=3600)
        step = 0
        while not stop.is_set():
            step += 1
            run.log(step, {k: writer_value(index, k, step) for k in WRITER_KEYS})
            if run.sent_points and run.id not in live:
                live.append(run.id)  # readers look at it once its first batch is in
        run.finish()
        results[index] = {"run_id": run.id, "steps": step, "duplicates": run.duplicates, "retries": client.retries,
                          "sent_points": run.sent_points, "pending": len(run.pending), "rejected": len(run.rejected)}
    except RemoteError as exc:
        results[index] = {"error": str(exc)}


def verify(url: str, results: dict[int, Any]) -> tuple[list[str], int]:
    """Problems found, and the number of logged points not stored exactly once (lost or duplicated)."""
    problems = []
    lost = 0
    reg = open_registry(url)
    try:
        for index, res in sorted(results.items()):
            if "error" in res:
                problems.append(f"writer {index}: {res['error']}")
                continue
            detail = reg.run_detail(res["run_id"])
            if detail["status"] != "finished":
                problems.append(f"writer {index}: status {detail['status']}")
            counts = {s["key"]: s["count"] for s in detail["series"]}
            expected_steps = np.arange(1, res["steps"] + 1)
            for key in WRITER_KEYS:
                if counts.get(key) != res["steps"]:
                    problems.append(f"writer {index} {key}: {counts.get(key)} points stored, {res['steps']} logged")
                    lost += abs(res["steps"] - (counts.get(key) or 0))
                    continue
                data = reg.read_series(res["run_id"], key)
                want = np.array([writer_value(index, key, int(s)) for s in expected_steps])
                if not np.array_equal(data.steps, expected_steps) or not np.array_equal(data.values, want,
                                                                                       equal_nan=True):
                    problems.append(f"writer {index} {key}: stored points differ from the logged ones")
                    lost += int(np.sum(data.values != want)) if len(data.values) == len(want) else res["steps"]
            if res["pending"] or res["rejected"]:
                problems.append(f"writer {index}: {res['pending']} batches pending, {res['rejected']} rejected")
    finally:
        reg.close()
    return problems, lost


def new_database(spec: str, workdir: Path) -> tuple[str, Any]:
    """A throwaway database: a SQLite file under ``workdir``, or a new database on a PostgreSQL server."""
    if spec == "sqlite" or spec.startswith("sqlite"):
        return f"sqlite:///{workdir / f'load-{uuid.uuid4().hex[:6]}.db'}", None
    return throwaway_database(spec)


def run_load(args: argparse.Namespace, workers: int, workdir: Path) -> dict[str, Any]:
    """One measured run against a fresh database with ``workers`` server processes; returns its figures."""
    url, db_handle = new_database(args.db, workdir)
    server = None
    try:
        print(f"\n== {workers} server process(es) over {make_url(url).get_backend_name()}: seeding demo runs ...",
              flush=True)
        from registry.demo.builder import build_demo

        build_demo(url, shared_data=workdir / "none", echo=lambda _: None)
        reg = open_registry(url)
        create_user(reg, "bench", secrets.token_urlsafe(12))
        token = create_token(reg, "bench", "load", scope="write")
        seeded = [{"id": r["id"], "keys": [s["key"] for s in reg.run_detail(r["id"])["series"]]}
                  for r in reg.list_runs(limit=None)[0]]
        reg.close()

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = dict(os.environ, RLREG_ENV="production", RLREG_SECRET_KEY=secrets.token_hex(32),
                   RLREG_DATABASE_URL=url, RLREG_UPLOAD_DIR=str(workdir / "uploads"), PYTHONPATH=str(REPO))
        log_path = workdir / f"server-{port}.log"
        log = open(log_path, "wb")
        command = [sys.executable, "-m", "registry.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--workers", str(workers), "--threads", str(args.threads)]
        what = (f"gunicorn ({workers} workers x {args.threads} threads)" if workers > 1
                else f"waitress (1 process, {args.threads} threads)")
        server = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(base + "/api/openapi.yaml", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text(), file=sys.stderr)
                raise SystemExit(1)
            time.sleep(0.2)
        print(f"{what} on {base}, {len(seeded)} seeded runs; "
              f"{args.readers} readers + {args.writers} writers for {args.seconds:g} s", flush=True)

        stats = Stats()
        stop = threading.Event()
        live: list[str] = []
        results: dict[int, Any] = {}
        threads = [threading.Thread(target=writer, args=(base, token, stats, stop, i, args.batch_steps, live, results))
                   for i in range(args.writers)]
        threads += [threading.Thread(target=reader, args=(base, stats, stop, seeded, live, 1000 + i))
                    for i in range(args.readers)]
        started = time.perf_counter()
        cpu_start = cpu_seconds(server.pid)
        own_start = sum(os.times()[:2])
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join(300)
        elapsed = time.perf_counter() - started
        server_cpu = (cpu_seconds(server.pid) - cpu_start) / elapsed
        client_cpu = (sum(os.times()[:2]) - own_start) / elapsed

        problems, lost = verify(url, results)
        server_errors = log_path.read_text(errors="replace").count("Traceback")

        rows = []
        total = 0
        for kind in sorted(stats.latency):
            lat = np.asarray(stats.latency[kind]) * 1000
            total += len(lat)
            rows.append({"kind": kind, "requests": len(lat), "per_second": len(lat) / elapsed,
                         "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                         "errors": stats.errors.get(kind, 0)})
        errors = sum(stats.errors.values())
        points = sum(r.get("steps", 0) for r in results.values()) * len(WRITER_KEYS)
        print(f"\n{'request kind':<20}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
        for r in rows:
            print(f"{r['kind']:<20}{r['requests']:>10}{r['per_second']:>9.1f}{r['p50_ms']:>9.1f}"
                  f"{r['p99_ms']:>9.1f}{r['errors']:>8}")
        print(f"{'all':<20}{total:>10}{total / elapsed:>9.1f}{'':>18}{errors:>8}")
        print(f"\nwritten: {points:,} points in {len(results)} runs ({points / elapsed:,.0f} points/s); lost or "
              f"duplicated points: {lost}; client retries {sum(r.get('retries', 0) for r in results.values())}, "
              f"duplicate batches {sum(r.get('duplicates', 0) for r in results.values())}; server tracebacks "
              f"{server_errors}; CPU: server {server_cpu:.2f} cores, load clients {client_cpu:.2f} cores "
              f"(of {os.cpu_count()})")
        for sample in stats.error_samples:
            print("  error:", sample)
        if problems:
            print("LOSS OR MISMATCH:\n  " + "\n  ".join(problems))
        else:
            print("verified: every written point arrived exactly once (count, steps and values per series)")
        return {"workers": workers, "backend": make_url(url).get_backend_name(), "seconds": elapsed, "rows": rows,
                "requests_per_second": total / elapsed, "errors": errors, "points": points, "lost_points": lost,
                "problems": problems, "server_tracebacks": server_errors, "server_cpu_cores": server_cpu,
                "client_cpu_cores": client_cpu, "ok": not (errors or problems or server_errors
                                                           or len(results) != args.writers)}
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        if db_handle is not None and not args.keep_db:
            drop_database(db_handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("RLREG_BENCH_POSTGRES_URL") or "sqlite",
                        help="'sqlite' (a file in a temporary directory) or a PostgreSQL server URL on 127.0.0.1 "
                             "(a throwaway database is created on it)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8, help="threads per server process")
    parser.add_argument("--workers", type=int, default=2, help="server processes (1: waitress; more: gunicorn)")
    parser.add_argument("--baseline", action="store_true",
                        help="first run the same load against one process, then compare throughput")
    parser.add_argument("--batch-steps", type=int, default=50, help="steps per metrics batch (8 points a step)")
    parser.add_argument("--keep-db", action="store_true", help="keep the throwaway database afterwards")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.db != "sqlite" and not args.db.startswith("sqlite"):
        host = make_url(args.db).host
        if host not in (None, "", "localhost") and not host.startswith("127.") and host != "::1":
            parser.error("the benchmark only talks to a PostgreSQL server on this machine (127.0.0.1)")
    workdir = Path(tempfile.mkdtemp(prefix="rlreg-load-"))
    figures = []
    if args.baseline and args.workers != 1:
        figures.append(run_load(args, 1, workdir))
    figures.append(run_load(args, args.workers, workdir))
    report = dict(figures[-1])
    if len(figures) == 2:
        single, scaled = figures
        ratio = scaled["requests_per_second"] / max(single["requests_per_second"], 1e-9)
        print(f"\nthroughput: {scaled['requests_per_second']:.1f} req/s with {args.workers} processes vs "
              f"{single['requests_per_second']:.1f} req/s with one, measured in this run: {ratio:.2f}x")
        report.update(baseline=single, throughput_ratio=ratio)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if all(f["ok"] for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
