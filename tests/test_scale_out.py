"""Several server processes over one database: each sees the others' writes at once (no process keeps
runs, dictionary versions, findings or similar-run results of its own), and `rlreg serve --workers N`
serves through gunicorn workers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from registry import open_registry
from registry.store.auth import create_token, create_user
from test_client import free_port

REPO = Path(__file__).resolve().parents[1]
SECRET = "scale-out-test-secret-key-0123456789"


def _start(db_url: str, port: int, workdir: Path, workers: int = 1, db_option: bool = False) -> subprocess.Popen:
    """``rlreg serve`` in a process of its own; the database from the environment, or ``serve --db``."""
    env = dict(os.environ, RLREG_ENV="production", RLREG_SECRET_KEY=SECRET,
               RLREG_UPLOAD_DIR=str(workdir / "uploads"), PYTHONPATH=str(REPO))
    env.pop("RLREG_DATABASE_URL", None)
    if not db_option:
        env["RLREG_DATABASE_URL"] = db_url
    log = open(workdir / f"server-{port}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "registry.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", str(workers), "--threads", "4", *(["--db", db_url] if db_option else [])],
                            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((workdir / f"server-{port}.log").read_text())
        try:
            if requests.get(f"http://127.0.0.1:{port}/api/openapi.yaml", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not come up")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and, under gunicorn, its workers
        proc.wait(60)


def _curve(seed: int, n: int = 200, blowup: bool = False) -> dict[str, tuple[list[int], list[float]]]:
    rng = np.random.default_rng(seed)
    steps = list(range(1, n + 1))
    kl = np.abs(0.01 + 0.001 * rng.standard_normal(n))
    if blowup:
        kl[n // 2:] += np.linspace(0, 2, n - n // 2)
    reward = np.linspace(0, 1, n) + 0.02 * rng.standard_normal(n)
    return {"actor/ppo_kl": (steps, kl.tolist()), "critic/score/mean": (steps, reward.tolist())}


@pytest.fixture
def two_servers(db_url, tmp_path):
    reg = open_registry(db_url)
    create_user(reg, "alice", "alice-password")
    token = create_token(reg, "alice", "ci", scope="admin")
    for seed in range(4):
        reg.register_arrays(f"base-{seed}", _curve(seed), framework="verl", algorithm="GRPO", task="gsm8k")
    ports = [free_port(), free_port()]
    procs = [_start(db_url, port, tmp_path) for port in ports]
    yield [f"http://127.0.0.1:{p}" for p in ports], {"Authorization": f"Bearer {token}"}, reg
    for proc in procs:
        _stop(proc)
    reg.close()


def test_two_server_processes_see_each_others_writes_at_once(two_servers):
    (a, b), auth, reg = two_servers
    # Warm every per-process cache on B first, so a stale copy would show.
    assert requests.get(f"{b}/api/runs", timeout=30).json()["total"] == 4
    version_b = requests.get(f"{b}/api/definitions/kl_old_mean", timeout=30).json()["version"]
    base = reg.list_runs(where="name=base-0")[0][0]["id"]
    similar_before = requests.get(f"{b}/api/runs/{base}/similar", params={"metrics": "kl"}, timeout=60).json()
    assert requests.get(f"{b}/runs", timeout=30).status_code == 200

    created = requests.post(f"{a}/api/runs", json={"name": "written-on-a", "framework": "verl", "algorithm": "GRPO",
                                                  "task": "gsm8k"}, headers=auth, timeout=30)
    assert created.status_code == 201
    run_id = created.json()["id"]
    assert requests.get(f"{b}/api/runs/{run_id}", timeout=30).json()["name"] == "written-on-a"
    assert requests.get(f"{b}/api/runs", timeout=30).json()["total"] == 5
    assert "written-on-a" in requests.get(f"{b}/runs", timeout=30).text

    steps, kl = _curve(9, blowup=True)["actor/ppo_kl"]
    _, reward = _curve(9)["critic/score/mean"]
    batch = {"batch_id": "one", "points": {"actor/ppo_kl": {"steps": steps, "values": kl},
                                           "critic/score/mean": {"steps": steps, "values": reward}}}
    assert requests.post(f"{a}/api/runs/{run_id}/metrics", json=batch, headers=auth, timeout=60).status_code == 200
    series = requests.get(f"{b}/api/runs/{run_id}/series", params={"key": "actor/ppo_kl"}, timeout=30).json()
    assert series["steps"] == steps
    # Findings computed for the new data, whichever process is asked.
    finding_b = requests.get(f"{b}/api/runs/{run_id}/diagnosis", timeout=60).json()
    finding_a = requests.get(f"{a}/api/runs/{run_id}/diagnosis", timeout=60).json()
    # (computed_at is the same moment; the process that computed it shows its offset, the other reads
    # SQLite's naive copy: the same instant, formatted two ways)
    finding_a.pop("computed_at"), finding_b.pop("computed_at")
    assert finding_b == finding_a and finding_b["findings"], finding_b
    # The similar-run search on B includes the run A just wrote.
    similar_after = requests.get(f"{b}/api/runs/{base}/similar", params={"metrics": "kl"}, timeout=60).json()
    names_before = {n["name"] for n in similar_before["neighbours"]}
    names_after = {n["name"] for n in similar_after["neighbours"]}
    assert "written-on-a" not in names_before and "written-on-a" in names_after
    # A dictionary edit on A is the version B serves, and B binds new runs with it.
    edit = requests.patch(f"{a}/api/definitions/kl_old_mean", json={"changes": {"smoothing_window": 11},
                                                                     "note": "from A"}, headers=auth, timeout=30)
    assert edit.status_code == 200
    after = requests.get(f"{b}/api/definitions/kl_old_mean", timeout=30).json()
    assert after["version"] == version_b + 1 and after["smoothing_window"] == 11
    # A delete on B is gone on A.
    assert requests.delete(f"{b}/api/runs/{run_id}", headers=auth, timeout=30).status_code == 200
    assert requests.get(f"{a}/api/runs/{run_id}", timeout=30).status_code == 404


def test_serve_with_gunicorn_workers(sqlite_url, tmp_path):
    pytest.importorskip("gunicorn")
    reg = open_registry(sqlite_url)
    create_user(reg, "alice", "alice-password")
    token = create_token(reg, "alice", "ci")
    auth = {"Authorization": f"Bearer {token}"}
    port = free_port()
    proc = _start(sqlite_url, port, tmp_path, workers=2)
    try:
        url = f"http://127.0.0.1:{port}"
        pids = set()
        for i in range(12):  # fresh connections spread over the workers; every one sees every write
            with requests.Session() as s:
                made = s.post(f"{url}/api/runs", json={"name": f"w{i}"}, headers={**auth, "Connection": "close"},
                              timeout=30)
                assert made.status_code == 201
                assert s.get(f"{url}/api/runs", timeout=30).json()["total"] == i + 1
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        pids.update(children)
        assert len(pids) == 2, pids
    finally:
        _stop(proc)
    assert reg.list_runs()[1] == 12
    reg.close()


def _sockets_by_process(pids: list[str], port: int, state: str) -> dict[str, set[str]]:
    """The TCP sockets (inodes) on local ``port`` in ``state`` (01 established, 0A listening) each
    process holds (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    held = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        links = [os.readlink(fd) for fd in fds.iterdir()] if fds.exists() else []
        held[pid] = {link[8:-1] for link in links if link.startswith("socket:[") and link[8:-1] in inodes}
    return held


def test_keep_alive_clients_that_connect_at_once_are_spread_over_the_workers(sqlite_url, tmp_path):
    """With one shared listening socket the workers race in accept() and one of them can take every
    connection of a burst; each worker has its own (SO_REUSEPORT), and a second server on the port
    is refused instead of sharing it."""
    pytest.importorskip("gunicorn")
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs /proc to see which process holds a connection")
    port = free_port()
    proc = _start(sqlite_url, port, tmp_path, workers=2)
    sessions = [requests.Session() for _ in range(16)]
    try:
        # The server answers as soon as one worker is up; a burst sent before the second worker listens
        # can only reach the first, which says nothing of how connections are spread.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            if len(pids) == 2 and all(_sockets_by_process(pids, port, "0A").values()):
                break
            time.sleep(0.2)
        for s in sessions:  # keep-alive: each connection stays with the worker that accepted it
            assert s.get(f"http://127.0.0.1:{port}/api/runs", timeout=30).status_code == 200
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        held = _sockets_by_process(workers, port, "01")
        assert sum(map(len, held.values())) == 16 and all(held.values()), held
        # each worker accepts on a listening socket of its own, which the kernel balances connections
        # over (one shared socket would be the same inode in both)
        listening = [frozenset(v) for v in _sockets_by_process(workers, port, "0A").values()]
        assert len(listening) == 2 and all(len(v) == 1 for v in listening) and listening[0] != listening[1]
        second = subprocess.run([sys.executable, "-m", "registry.cli", "--db", sqlite_url, "serve", "--port", str(port),
                                 "--workers", "2"], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
        assert second.returncode == 1 and f"cannot serve on 127.0.0.1:{port}" in second.stderr, second.stderr
    finally:
        for s in sessions:
            s.close()
        _stop(proc)


def test_serve_db_option_serves_that_registry(sqlite_url, tmp_path):
    reg = open_registry(sqlite_url)
    reg.register_arrays("served", _curve(0))
    port = free_port()
    proc = _start(sqlite_url, port, tmp_path, db_option=True)
    try:
        runs = requests.get(f"http://127.0.0.1:{port}/api/runs", timeout=30).json()
        assert [r["name"] for r in runs["runs"]] == ["served"]
    finally:
        _stop(proc)
    reg.close()
