"""registry.client against a real server process (waitress on 127.0.0.1) that is killed and
restarted while a run streams into it: every point arrives exactly once."""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from registry import Registry, open_registry
from registry.store.auth import create_token, create_user
from registry.client import RemoteAuthError, RemoteError, RemoteRegistry

REPO = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = """
import sys
from waitress import serve
from registry.web.app import create_app
url, port, uploads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = create_app({"DATABASE_URL": url, "UPLOAD_DIR": uploads})
serve(app, host="127.0.0.1", port=port, threads=4, ident="rlregistry",
      max_request_body_size=app.config["MAX_CONTENT_LENGTH"])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app under waitress in a child process (production mode), restartable on the same port."""

    def __init__(self, db_url: str, workdir: Path, port: int | None = None):
        self.db_url = db_url
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, wait: bool = True) -> None:
        env = dict(os.environ, RLREG_ENV="production", RLREG_SECRET_KEY="client-test-secret-key-of-32-chars",
                   PYTHONPATH=str(REPO))
        log = open(self.workdir / f"server-{self.starts}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, self.db_url, str(self.port),
                                      str(self.workdir / "uploads")], cwd=self.workdir, env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.workdir / f'server-{self.starts - 1}.log').read_text()}")
            try:
                if requests.get(self.url + "/api/openapi.yaml", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not come up")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def server(db_url, tmp_path):
    reg = open_registry(db_url)
    create_user(reg, "trainer", "streaming-pass")
    token = create_token(reg, "trainer", "cluster", scope="admin")
    srv = Server(db_url, tmp_path)
    srv.start()
    yield srv, token, reg
    srv.stop()
    reg.close()


KEYS = ("actor/ppo_kl", "critic/score/mean", "actor/entropy", "response_length/mean", "custom/probe")


def value(key: str, step: int) -> float:
    if key == "custom/probe" and step % 97 == 0:
        return math.nan
    if key == "custom/probe" and step % 101 == 0:
        return math.inf if step % 2 else -math.inf
    return KEYS.index(key) + step / 1000.0


def check_exact(reg: Registry, run_id: str, steps: int) -> None:
    detail = reg.run_detail(run_id)
    assert detail["status"] == "finished"
    by_key = {s["key"]: s for s in detail["series"]}
    assert set(by_key) == set(KEYS)
    expected_steps = np.arange(1, steps + 1)
    for key in KEYS:
        assert by_key[key]["count"] == steps, (key, by_key[key]["count"])
        data = reg.read_series(run_id, key)
        assert np.array_equal(data.steps, expected_steps)
        want = np.array([value(key, int(s)) for s in expected_steps])
        assert np.array_equal(data.values, want, equal_nan=True)
        assert data.wall_times is not None and np.isfinite(data.wall_times).all()
    probe = by_key["custom/probe"]
    assert probe["nan_count"] == sum(1 for s in expected_steps if s % 97 == 0)
    assert probe["inf_count"] == sum(1 for s in expected_steps if s % 101 == 0 and s % 97)


def test_server_killed_and_restarted_mid_stream_loses_and_duplicates_nothing(server):
    srv, token, reg = server
    client = RemoteRegistry(srv.url, token, retry_seconds=90, backoff_initial=0.05, backoff_max=0.5,
                            timeout=(2, 20))
    steps = 3000
    kills: list[int] = []  # the step the stream was at when the server died
    progress = [0]

    def chaos() -> None:
        # Kill while batches are in flight: SIGKILL (no goodbye), then SIGTERM, each restarted after a pause.
        for delay, sig in ((0.8, signal.SIGKILL), (0.8, signal.SIGTERM), (0.5, signal.SIGKILL)):
            time.sleep(delay)
            srv.kill(sig)
            kills.append(progress[0])
            time.sleep(0.7)
            srv.start(wait=False)

    run = client.create_run("streamed-through-restarts", project="chaos", algorithm="GRPO", framework="verl",
                            params={"actor": {"lr": 1e-6}}, tags=["restart"], flush_points=100)
    chaos_thread = threading.Thread(target=chaos)
    chaos_thread.start()
    for step in range(1, steps + 1):
        run.log(step, {k: value(k, step) for k in KEYS})
        progress[0] = step
        if step % 50 == 0:
            time.sleep(0.1)  # a training step's worth of time: the stream spans the restarts
    chaos_thread.join()
    run.set_outcome(verdict="success", scores={"gsm8k": 0.5}, checkpoints=[(steps, "s3://ckpt/final")])
    run.finish()
    assert len(kills) == 3 and srv.starts == 4
    assert all(0 < k < steps for k in kills), kills  # each restart fell in the middle of the stream
    assert client.retries > 0, "the stream never saw a restart"
    assert not run.pending and not run.rejected
    assert run.sent_points == steps * len(KEYS)
    check_exact(reg, run.id, steps)
    assert reg.run_detail(run.id)["verdict"] == "success"


class DropFirstAnswer(requests.adapters.HTTPAdapter):
    """Delivers each metrics batch to the server, then pretends the answer was lost (once per batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[bytes] = set()
        self.dropped = 0

    def send(self, request, **kwargs):  # noqa: ANN001, ANN201
        response = super().send(request, **kwargs)
        if request.url.endswith("/metrics") and request.body not in self.seen:
            self.seen.add(request.body)
            self.dropped += 1
            raise requests.ConnectionError("connection reset after the server committed")
        return response


def test_lost_answers_are_resent_under_the_same_batch_id_and_not_applied_twice(server):
    srv, token, reg = server
    session = requests.Session()
    adapter = DropFirstAnswer()
    session.mount("http://", adapter)
    client = RemoteRegistry(srv.url, token, session=session, backoff_initial=0.01, backoff_max=0.05)
    run = client.create_run("lost-answers", flush_points=250, framework="verl",
                            semantics={"actor/ppo_kl": {"kl_estimator": "k3"}})
    steps = 500
    for step in range(1, steps + 1):
        run.log(step, {k: value(k, step) for k in KEYS})
    run.finish()
    assert adapter.dropped == run.duplicates == steps * len(KEYS) // 250
    check_exact(reg, run.id, steps)
    kl = next(s for s in reg.run_detail(run.id)["series"] if s["key"] == "actor/ppo_kl")
    assert kl["semantics"]["kl_estimator"] == "k3" and kl["overrides"] == {"kl_estimator": "k3"}


def test_create_run_is_idempotent_and_errors_are_not_retried(server):
    srv, token, reg = server
    client = RemoteRegistry(srv.url, token, retry_seconds=5)
    run_id = "0123456789abcdef0123456789abcdef"
    first = client.create_run("twice", run_id=run_id)
    again = client.create_run("twice", run_id=run_id)  # a retried create: the same run
    assert first.id == again.id == run_id
    assert reg.list_runs(where=None)[1] == 1
    with pytest.raises(RemoteError) as taken:
        client.create_run("another-name", run_id=run_id)
    assert taken.value.status == 409

    started = time.monotonic()
    with pytest.raises(RemoteAuthError):
        RemoteRegistry(srv.url, "rlr_not-a-real-token", retry_seconds=30).create_run("nope")
    assert time.monotonic() - started < 5  # 401 is final: no retries

    # A batch the server refuses on its merits (400) is not retried; the message comes through.
    client.request("POST", f"/api/runs/{run_id}/metrics", json_body={
        "batch_id": "b-1", "points": {"loss": {"steps": [5], "values": [1.0]}}})
    with pytest.raises(RemoteError, match="append-only") as bad:
        client.request("POST", f"/api/runs/{run_id}/metrics", json_body={
            "batch_id": "b-2", "points": {"loss": {"steps": [4], "values": [2.0]}}})
    assert bad.value.status == 400
    with pytest.raises(ValueError, match="append-only"):
        run = client.resume_run(run_id)
        run.log(4, {"loss": 3.0})  # checked in the client, before anything is sent


def test_retry_budget_is_bounded_and_queued_batches_survive_it(server):
    srv, token, reg = server
    client = RemoteRegistry(srv.url, token, retry_seconds=1.5, backoff_initial=0.05, backoff_max=0.2)
    run = client.create_run("outage", flush_points=10**9)
    for step in range(1, 101):
        run.log(step, {k: value(k, step) for k in KEYS})
    srv.kill()
    started = time.monotonic()
    with pytest.raises(RemoteError, match="giving up"):
        run.flush()
    assert 1.4 < time.monotonic() - started < 5
    assert len(run.pending) == 1  # kept, with its batch id, for the next flush
    for step in range(101, 201):
        run.log(step, {k: value(k, step) for k in KEYS})
    srv.start()
    run.finish()
    check_exact(reg, run.id, 200)


def test_upload_through_the_client(server, tmp_path):
    srv, token, reg = server
    client = RemoteRegistry(srv.url, token)
    csv = tmp_path / "ppo.csv"
    csv.write_text("step,loss,reward\n1,0.5,1\n2,0.4,NaN\n3,0.3,3\n")
    result = client.upload(csv, project="uploads", algorithm="PPO", tags=["a", "b"], params={"lr": 3e-4})
    assert result["point_count"] == 6 and result["source_format"] == "csv"
    detail = reg.run_detail(result["run_id"])
    assert detail["name"] == "ppo" and detail["tags"] == ["a", "b"] and detail["params"]["lr"] == 3e-4
    with pytest.raises(RemoteError) as again:
        client.upload(csv)
    assert again.value.status == 409 and "already registered" in str(again.value)
    assert client.delete_run(result["run_id"]) == result["run_id"]
    assert reg.list_runs()[1] == 0
