"""The client survives every way a reply can be cut: a real HTTP server and a real proxy on 127.0.0.1
that breaks the first attempt of every request at one stage, and passes its retry through.

Stages: the connection reset before the request reaches the server; the request applied and the
connection closed before any reply; only the status line and headers; half of a Content-Length
body; a chunked body cut after its first chunk (``ChunkedEncodingError``); no reply within the read
timeout; a TCP reset (RST) after the request was applied. Every point must arrive exactly once.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from werkzeug.serving import make_server

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.client import RemoteRegistry
from registry.web.app import create_app

FAULTS = ("reset_before_request", "close_after_request", "headers_only", "half_body", "chunked_cut",
          "read_timeout", "rst_after_request")
READ_TIMEOUT = 0.6


def _read_message(sock: socket.socket) -> bytes | None:
    """One HTTP request (headers and a Content-Length body) from ``sock``; None if it closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head + b"\r\n\r\n" + body


def _with_header(head: bytes, name: bytes, value: bytes) -> bytes:
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(name.lower() + b":")]
    return b"\r\n".join([*lines, name + b": " + value])


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    sock.close()


class FaultProxy:
    """Forwards each request on its own upstream connection; odd-numbered requests get ``fault``."""

    def __init__(self, upstream_port: int, fault: str):
        self.upstream_port = upstream_port
        self.fault = fault
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[tuple[str, str]] = []  # (request line, what was done)
        self._lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _forward(self, request: bytes) -> bytes:
        head, _, body = request.partition(b"\r\n\r\n")
        head = _with_header(head, b"Connection", b"close")
        with socket.create_connection(("127.0.0.1", self.upstream_port)) as up:
            up.sendall(head + b"\r\n\r\n" + body)
            reply = b""
            while chunk := up.recv(65536):
                reply += chunk
        return reply

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:  # the client may send several requests on one kept-alive connection
                request = _read_message(conn)
                if request is None:
                    conn.close()
                    return
                with self._lock:
                    index = len(self.requests)
                    action = self.fault if index % 2 == 0 else "pass"
                    self.requests.append((request.split(b"\r\n", 1)[0].decode(), action))
                if action == "reset_before_request":
                    _reset(conn)
                    return
                reply = self._forward(request)
                head, _, body = reply.partition(b"\r\n\r\n")
                head = _with_header(head, b"Connection", b"close")
                if action == "pass":
                    conn.sendall(head + b"\r\n\r\n" + body)
                elif action == "close_after_request":
                    pass
                elif action == "headers_only":
                    conn.sendall(head + b"\r\n\r\n")
                elif action == "half_body":
                    conn.sendall(head + b"\r\n\r\n" + body[: max(1, len(body) // 2)])
                elif action == "chunked_cut":
                    head = _with_header(head.replace(b"Content-Length", b"X-Was-Length"), b"Transfer-Encoding",
                                        b"chunked")
                    half = body[: max(1, len(body) // 2)]
                    conn.sendall(head + b"\r\n\r\n" + f"{len(half):x}\r\n".encode() + half + b"\r\n")
                elif action == "read_timeout":
                    time.sleep(READ_TIMEOUT * 2)
                elif action == "rst_after_request":
                    _reset(conn)
                    return
                conn.close()
                return
        except OSError:
            conn.close()


@pytest.fixture
def live_server(tmp_path):
    url = f"sqlite:///{tmp_path / 'faults.db'}"
    reg = open_registry(url)
    create_user(reg, "trainer", "streaming-pass")
    token = create_token(reg, "trainer", "cluster")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "fault-test", "UPLOAD_DIR": str(tmp_path / "up")})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port, token, reg
    server.shutdown()
    reg.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_every_request_is_retried_under_its_idempotent_id_whatever_cuts_the_reply(live_server, fault):
    port, token, reg = live_server
    proxy = FaultProxy(port, fault)
    client = RemoteRegistry(f"http://127.0.0.1:{proxy.port}", token, timeout=(2.0, READ_TIMEOUT),
                            retry_seconds=30, backoff_initial=0.01, backoff_max=0.05)
    try:
        run = client.create_run(f"cut-{fault}", project="faults", framework="verl", flush_points=40,
                                flush_seconds=1e9)
        for step in range(1, 31):  # 2 metrics x 30 steps, a batch every 40 points: 2 batches
            run.log(step, {"actor/ppo_kl": step / 100, "critic/score/mean": float(step)})
        run.set_outcome(verdict="success", scores={"gsm8k": 0.5})
        run.finish()
    finally:
        proxy.close()
    lines = [line for line, _ in proxy.requests]
    actions = [action for _, action in proxy.requests]
    # Every logical request failed once and went through on its retry: create, 2 batches, outcome, status.
    assert len(lines) == 10 and actions == [fault, "pass"] * 5, proxy.requests
    assert lines[0::2] == lines[1::2]  # the retry is the same request
    assert client.retries == 5
    detail = reg.run_detail(run.id)
    assert detail["status"] == "finished" and detail["verdict"] == "success"
    for key, scale in (("actor/ppo_kl", 100), ("critic/score/mean", 1)):
        series = reg.read_series(run.id, key)
        assert list(series.steps) == list(range(1, 31)), (key, list(series.steps))
        assert list(series.values) == [s / scale for s in range(1, 31)]
    assert run.sent_points == 60 and not run.pending and not run.rejected
    applied_first = fault not in ("reset_before_request",)
    # Where the first attempt reached the server, its batches were applied then and acknowledged as repeats.
    assert run.duplicates == (2 if applied_first else 0)
    assert len(reg.list_runs(where="project=faults")[0]) == 1
