"""Uploads: every supported format, hostile archives and file names, size limits on a real socket."""
from __future__ import annotations

import io
import json
import select
import socket
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.web.app import create_app

DATA = Path(__file__).resolve().parent / "data"
GB2 = 2 * 1024**3


@pytest.fixture
def env(db_url, tmp_path):
    reg = open_registry(db_url)
    create_user(reg, "uploader", "upload-password")
    token = create_token(reg, "uploader", "ci")
    uploads = tmp_path / "uploads"
    app = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "t", "UPLOAD_DIR": str(uploads)})
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}

    def post(content: bytes, filename: str, status: int = 201, **fields):
        data = {"file": (io.BytesIO(content), filename), **fields}
        response = client.post("/api/uploads", data=data, headers=headers, content_type="multipart/form-data")
        assert response.status_code == status, response.get_data(as_text=True)[:1000]
        assert response.mimetype == "application/json"
        return response.get_json()

    yield post, reg, uploads, app, token
    reg.close()


def tb_events(directory: Path, tags: dict[str, list[float]]) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    for tag, values in tags.items():
        for step, value in enumerate(values, 1):
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(event_pb2.Event(step=step * 10, wall_time=1.7e9 + step, summary=summary))
    writer.close()


def tb_dir(tmp_path: Path) -> Path:
    run = tmp_path / "tb" / "PPO_1"
    run.mkdir(parents=True)
    tb_events(run, {"train/approx_kl": [0.01, 0.02, 0.015], "rollout/ep_rew_mean": [10.0, 20.0, 30.0]})
    return run


def zip_of(root: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(root.rglob("*")):
            zf.write(f, f.relative_to(root.parent).as_posix())
    return buf.getvalue()


def tar_of(root: Path, mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        tf.add(root, arcname=root.name)
    return buf.getvalue()


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def test_every_supported_format(env, tmp_path):
    post, reg, uploads, _, _ = env
    csv = post(b"step,loss,reward\n1,0.5,1\n2,0.4,NaN\n3,0.3,inf\n", "run.csv", project="up", tags="a,b",
               params=json.dumps({"lr": 1e-4}), algorithm="PPO")
    assert csv["source_format"] == "csv" and csv["point_count"] == 6 and csv["name"] == "run"
    detail = reg.run_detail(csv["run_id"])
    assert detail["tags"] == ["a", "b"] and detail["params"]["lr"] == 1e-4 and detail["algorithm"] == "PPO"
    assert Path(detail["source"]["path"]).resolve().is_relative_to(uploads.resolve())
    reward = next(s for s in detail["series"] if s["key"] == "reward")
    assert reward["nan_count"] == 1 and reward["inf_count"] == 1

    assert post((DATA / "wandb_history.jsonl").read_bytes(), "history.jsonl")["source_format"] == "jsonl"
    assert post((DATA / "verl_grpo.log").read_bytes(), "train.log")["source_format"] == "verl_log"
    state = post((DATA / "trl_grpo" / "trainer_state.json").read_bytes(), "trainer_state.json",
                 on_disorder="keep-last")  # its eval entries repeat the train step
    assert state["source_format"] == "trainer_state"

    run = tb_dir(tmp_path)
    from_zip = post(zip_of(run), "ppo.zip")
    assert from_zip["source_format"] == "tensorboard" and from_zip["point_count"] == 6
    assert from_zip["name"] == "PPO_1" and from_zip["framework"] == "stable-baselines3"
    # The same directory as .tar.gz is the same content: refused as already registered.
    assert "already registered" in post(tar_of(run), "ppo.tar.gz", status=409)["error"]
    plain_tar = post(tar_of(run, "w"), "ppo.tar", replace="true", name="ppo-again")
    assert plain_tar["replaced"] == from_zip["run_id"] and plain_tar["name"] == "ppo-again"
    # Every byte went under the upload directory, in generated directories.
    for f in files_under(uploads):
        rel = f.relative_to(uploads).parts
        assert len(rel[0]) == 32 and all(c in "0123456789abcdef" for c in rel[0])


def test_bad_content_is_400_naming_the_file_and_position_and_leaves_nothing(env):
    post, reg, uploads, _, _ = env
    bad = post(b"step,loss\n1,0.5\n2,0.4\n1,0.3\n", "my run.csv", status=400)
    assert bad["error"].startswith("my run.csv, line 4: decreasing step 1")
    strict = post(b"step,loss\n1,0.5\n2,0.4\n2,0.3\n", "strict.csv", status=400, on_disorder="error")
    assert strict["error"].startswith("strict.csv, line 4: duplicate step 2")
    kept = post(b"step,loss\n1,0.5\n2,0.4\n1,0.3\n", "my run.csv", on_disorder="keep-last")
    assert kept["point_count"] == 1 and kept["warnings"]
    unknown = post(b"hello, this is not a training log\n", "notes.txt", status=400)
    assert unknown["error"].startswith("notes.txt: cannot tell what kind of file this is")
    assert "empty" in post(b"", "empty.csv", status=400)["error"]
    assert "JSON object" in post(b"step,loss\n1,2\n", "x.csv", status=400, params="[1]")["error"]
    broken_zip = post(b"PK\x03\x04 not really a zip", "x.zip", status=400)
    assert broken_zip["error"].startswith("x.zip: not a readable zip archive")
    assert reg.list_runs()[1] == 1  # only the keep-last one
    assert len(list(uploads.iterdir())) == 1  # failed uploads left no directory behind


def test_user_file_names_never_reach_the_filesystem(env, tmp_path):
    post, reg, uploads, _, _ = env
    passwd = Path("/etc/passwd")
    before = (passwd.stat().st_mtime_ns, passwd.stat().st_size) if passwd.exists() else None
    for name in ("../../etc/passwd", "/etc/passwd", "..\\..\\etc\\passwd.csv", "../../../../tmp/evil.csv"):
        result = post(b"step,loss\n1,0.5\n2,0.25\n", name, name="n-" + str(len(name)), replace="true")
        assert "/" not in result["file"] and "\\" not in result["file"] and result["file"] not in ("..", ".")
    after = (passwd.stat().st_mtime_ns, passwd.stat().st_size) if passwd.exists() else None
    assert before == after
    stored = files_under(uploads)
    assert stored and all(f.name in ("upload", "upload.csv") for f in stored)
    assert not any("passwd" in str(p) or "evil" in str(p) for p in tmp_path.rglob("*"))
    assert not Path("/tmp/evil.csv").exists()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, content in members.items():
            zf.writestr(zipfile.ZipInfo(name), content, compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def _tar_with(member: tarfile.TarInfo, content: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        member.size = len(content) if member.isreg() else 0
        tf.addfile(member, io.BytesIO(content) if member.isreg() else None)
    return buf.getvalue()


@pytest.mark.parametrize("member", ["../evil.csv", "run/../../evil.csv", "/tmp/evil.csv", "C:/evil.csv",
                                    "run\\..\\..\\evil.csv"])
def test_zip_slip_members_are_refused(env, tmp_path, member):
    post, reg, uploads, _, _ = env
    events = tb_dir(tmp_path)
    members = {f"PPO_1/{f.name}": f.read_bytes() for f in events.iterdir()}
    members[member] = b"step,loss\n1,2\n"
    result = post(_zip(members), "slip.zip", status=400)
    assert result["error"].startswith("slip.zip: member") and "refusing the archive" in result["error"]
    assert reg.list_runs()[1] == 0
    assert files_under(uploads) == []
    assert not any(p.name == "evil.csv" for p in tmp_path.parent.rglob("evil.csv"))
    assert not Path("/tmp/evil.csv").exists()


def test_tar_links_devices_and_traversal_are_refused(env):
    post, reg, uploads, _, _ = env
    link = tarfile.TarInfo("run/events.out.tfevents.1")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("run/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("run/dev")
    dev.type = tarfile.CHRTYPE
    for member in (link, hard, dev):
        assert "link or a special file" in post(_tar_with(member), "t.tar", status=400)["error"]
    up = tarfile.TarInfo("../../up.csv")
    assert "'..'" in post(_tar_with(up, b"step,x\n1,1\n"), "t.tar", status=400)["error"]
    absolute = tarfile.TarInfo("/abs.csv")
    assert "absolute" in post(_tar_with(absolute, b"step,x\n1,1\n"), "t.tar", status=400)["error"]
    assert files_under(uploads) == [] and reg.list_runs()[1] == 0


def test_archive_bombs_are_refused(env, db_url, tmp_path):
    post, reg, uploads, app, token = env
    app.config["MAX_UNPACKED_BYTES"] = 1000
    big = _zip({"run/big.csv": b"step,x\n" + b"1,1\n" * 10000})  # compresses well, unpacks past the limit
    assert len(big) < 20000
    assert "unpacks to more than 1000 bytes" in post(big, "bomb.zip", status=400)["error"]
    app.config["MAX_UNPACKED_BYTES"] = 10**9
    app.config["MAX_ARCHIVE_MEMBERS"] = 5
    many = _zip({f"run/f{i}.txt": b"x" for i in range(10)})
    assert "members" in post(many, "many.zip", status=400)["error"]
    assert files_under(uploads) == []


def test_uploads_need_credentials(env):
    post, reg, uploads, app, _ = env
    client = app.test_client()
    response = client.post("/api/uploads", data={"file": (io.BytesIO(b"step,x\n1,1\n"), "a.csv")})
    assert response.status_code == 401 and response.get_json()["error"]
    response = client.post("/api/uploads", data={"file": (io.BytesIO(b"step,x\n1,1\n"), "a.csv")},
                           headers={"Authorization": "Bearer rlr_wrong"})
    assert response.status_code == 401
    assert files_under(uploads) == []


def test_too_large_with_the_test_client(env):
    post, reg, uploads, app, token = env
    app.config["MAX_CONTENT_LENGTH"] = 1000
    result = post(b"step,x\n" + b"1,1\n" * 1000, "big.csv", status=413)
    assert "limit is 1000 bytes" in result["error"]
    assert files_under(uploads) == []


# --- a real socket: the limit is enforced before the body is read ---------------------------------


@pytest.fixture
def live(tmp_path, sqlite_url):
    reg = open_registry(sqlite_url)
    create_user(reg, "uploader", "upload-password")
    token = create_token(reg, "uploader", "ci")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "t", "UPLOAD_DIR": str(tmp_path / "uploads"),
                      "MAX_CONTENT_LENGTH": 8 * 1024 * 1024})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port, token, tmp_path / "uploads"
    server.shutdown()
    thread.join(5)
    reg.close()


def body_chunks(total: int, chunk: int = 1 << 20):
    """A multipart body of ``total`` bytes, made on the fly (never held whole)."""
    boundary = b"rlregboundary"
    head = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="huge.csv"\r\n'
            b"Content-Type: text/csv\r\n\r\nstep,x\r\n")
    yield head
    sent = len(head)
    block = b"1,1\r\n" * (chunk // 5)
    while sent < total:
        piece = block[: total - sent]
        sent += len(piece)
        yield piece


def send_streaming(port: int, token: str, total: int | None, limit_seconds: float = 20):
    """POST a body from a generator; stop sending as soon as the server answers. Returns (status, json, sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    length = f"Content-Length: {total}\r\n" if total is not None else "Transfer-Encoding: chunked\r\n"
    sock.sendall((f"POST /api/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: multipart/form-data; boundary=rlregboundary\r\n{length}\r\n").encode())
    sent = 0
    answer = b""
    started = time.monotonic()
    try:
        for chunk in body_chunks(total or GB2):
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            if total is None:
                chunk = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            sock.sendall(chunk)
            sent += len(chunk)
            assert time.monotonic() - started < limit_seconds, f"still sending after {sent} bytes"
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(10)
    try:
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except (ConnectionResetError, socket.timeout):
        pass
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body[:_length(answer)] or b"null"), sent, time.monotonic() - started


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_2gb_upload_is_refused_quickly_without_being_read(live):
    port, token, uploads = live
    status, body, sent, seconds = send_streaming(port, token, GB2)
    assert status == 413 and "limit is 8388608 bytes" in body["error"]
    assert seconds < 10 and sent < 64 * 1024 * 1024  # answered long before 2 GB went over the wire
    assert files_under(uploads) == []


def test_chunked_upload_without_length_is_cut_at_the_limit(live):
    port, token, uploads = live
    status, body, sent, seconds = send_streaming(port, token, None)
    assert status == 413 and body["error"]
    assert sent < 256 * 1024 * 1024 and seconds < 20
    assert files_under(uploads) == []


def test_unauthenticated_2gb_upload_is_refused_before_the_body(live):
    port, _, uploads = live
    status, body, sent, seconds = send_streaming(port, "rlr_bogus", GB2)
    assert status in (401, 413) and seconds < 10 and sent < 64 * 1024 * 1024


def test_2gb_upload_to_the_production_server_is_refused_quickly(tmp_path, sqlite_url):
    """Under waitress (max_request_body_size = MAX_CONTENT_LENGTH) the server refuses a declared 2 GB
    body from its headers, before reading or buffering it."""
    from test_client import Server

    reg = open_registry(sqlite_url)
    create_user(reg, "uploader", "upload-password")
    token = create_token(reg, "uploader", "ci")
    server = Server(sqlite_url, tmp_path)
    server.start()
    try:
        status, _, sent, seconds = send_streaming_raw(server.port, token, GB2)
        assert status == 413 and seconds < 10 and sent < 64 * 1024 * 1024
        assert files_under(tmp_path / "uploads") == []
    finally:
        server.stop()
        reg.close()


def send_streaming_raw(port: int, token: str, total: int):
    """Like send_streaming, for servers whose 413 body is not JSON."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall((f"POST /api/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: multipart/form-data; boundary=rlregboundary\r\nContent-Length: {total}\r\n\r\n"
                  ).encode())
    sent, started = 0, time.monotonic()
    try:
        for chunk in body_chunks(total):
            if select.select([sock], [], [], 0)[0]:
                break
            sock.sendall(chunk)
            sent += len(chunk)
            assert time.monotonic() - started < 20, f"still sending after {sent} bytes"
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(10)
    answer = sock.recv(65536)
    sock.close()
    return int(answer.split(b" ", 2)[1]), answer, sent, time.monotonic() - started


def test_nul_characters_in_upload_fields_are_400(env):
    post, reg, uploads, _, _ = env
    assert "NUL" in post(b"step,x\n1,1\n", "a.csv", status=400, name="bad\x00name")["error"]
    assert "NUL" in post(b"step,x\n1,1\n", "a.csv", status=400, params='{"k": "v\\u0000"}')["error"]
    assert reg.list_runs()[1] == 0 and files_under(uploads) == []
