"""Bounded work per request: every limit answers 413/422 with a message naming its setting, and
changes nothing; the runs page stays small whatever one run holds."""
from __future__ import annotations

import bz2
import io
import json
import tarfile
import time

import pytest
from click.testing import CliRunner

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.cli.main import cli
from registry.core.errors import LimitExceededError
from registry.store.filters import compile_filter
from registry.core.limits import Limits
from registry.web.app import create_app
from test_security import _snapshot

SMALL = Limits(max_metric_keys=50, max_line_bytes=4096, max_tags=20, max_checkpoints=100, max_json_depth=8,
               max_page=1000, max_decompress_seconds=0.2)


@pytest.fixture
def bounded(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'bounded.db'}", limits=SMALL)
    run_id = reg.register_arrays("existing", {"loss": ([1, 2], [1.0, 0.5])}).run_id
    create_user(reg, "alice", "alice-password")
    token = create_token(reg, "alice", "ci", scope="admin")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "limits", "UPLOAD_DIR": str(tmp_path / "up"), "LIMITS": SMALL,
                      "MAX_UNPACKED_BYTES": 8 * 1024 * 1024})
    yield app, reg, run_id, {"Authorization": f"Bearer {token}"}
    reg.close()


def _refused(response, status: int, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:300])
    message = response.get_json()["error"]
    for word in words:
        assert word in message, message
    return message


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_json_bodies_bounded_in_depth_and_number_size(bounded):
    app, reg, run_id, auth = bounded
    client = app.test_client()
    before = _snapshot(reg)
    _refused(client.post("/api/runs", json={"name": "deep", "params": _nested(9)}, headers=auth), 422,
             "nested more than 8 levels", "RLREG_MAX_JSON_DEPTH")
    # Deeper than the JSON parser's own recursion: still a clean 422, never a 500.
    deep = '{"name": "x", "params": ' + "[" * 100000 + "]" * 100000 + "}"
    _refused(client.post("/api/runs", data=deep, headers={**auth, "Content-Type": "application/json"}), 422,
             "nested")
    big = '{"name": "big", "params": {"n": 1' + "0" * 400 + "}}"
    _refused(client.post("/api/runs", data=big, headers={**auth, "Content-Type": "application/json"}), 422,
             "401 digits", "int64 range")
    huge_float = '{"name": "big", "params": {"x": 1e400}}'
    _refused(client.post("/api/runs", data=huge_float, headers={**auth, "Content-Type": "application/json"}), 422,
             "too large for a float")
    _refused(client.post("/api/runs", json={"name": "tags", "tags": [f"t{i}" for i in range(21)]}, headers=auth),
             422, "21 tags", "RLREG_MAX_TAGS")
    points = {f"k{i}": {"steps": [1], "values": [1.0]} for i in range(51)}
    _refused(client.post(f"/api/runs/{run_id}/metrics", json={"batch_id": "b", "points": points}, headers=auth), 422,
             "more than 50 distinct metric keys", "RLREG_MAX_METRIC_KEYS")
    checkpoints = [{"step": i, "uri": f"s3://c/{i}"} for i in range(101)]
    _refused(client.post(f"/api/runs/{run_id}/outcome", json={"checkpoints": checkpoints}, headers=auth), 422,
             "101 checkpoints", "RLREG_MAX_CHECKPOINTS")
    assert _snapshot(reg) == before
    # Within the limits: accepted, and checkpoints add up per run.
    ok = client.post(f"/api/runs/{run_id}/outcome", json={"checkpoints": checkpoints[:60]}, headers=auth)
    assert ok.status_code == 200
    _refused(client.post(f"/api/runs/{run_id}/outcome", json={"checkpoints": checkpoints[40:]}, headers=auth),
             422, "101 checkpoints")
    assert len(reg.run_detail(run_id)["checkpoints"]) == 60


def test_pages_and_filters_bounded(bounded):
    app, reg, run_id, auth = bounded
    client = app.test_client()
    for url in ("/runs?page=1001", f"/runs?page={10**20}"):
        response = client.get(url)
        assert response.status_code == 422 and "RLREG_MAX_PAGE" in response.get_data(as_text=True), url
    assert client.get("/runs?page=1e20").status_code == 400
    assert client.get("/runs?page=1000").status_code == 200
    nots = "not " * 40 + "name=x"
    assert client.get("/runs", query_string={"q": nots}).status_code == 400
    _refused(client.get("/api/runs", query_string={"q": nots}), 400, "nested more than 20 levels")
    assert compile_filter("not " * 10 + "name=x") is not None


def _bomb(size: int) -> bytes:
    """A tar.bz2 whose one member is ``size`` zero bytes: a few KB on the wire."""
    compressor = bz2.BZ2Compressor(9)
    header = io.BytesIO()
    with tarfile.open(fileobj=header, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("run/zeros.csv")
        info.size = size
        tf.addfile(info)  # header only; the zeros follow
    out = [compressor.compress(header.getvalue()[:512])]
    zeros = b"\0" * (1 << 20)
    for _ in range(size >> 20):
        out.append(compressor.compress(zeros))
    out.append(compressor.flush())
    return b"".join(out)


def test_archive_bombs_stop_at_the_byte_and_cpu_budgets(bounded, tmp_path):
    app, reg, run_id, auth = bounded
    client = app.test_client()
    before = _snapshot(reg)
    bomb = _bomb(64 << 20)
    assert len(bomb) < 10_000
    started = time.monotonic()
    response = client.post("/api/uploads", data={"file": (io.BytesIO(bomb), "run.tar.bz2")}, headers=auth,
                           content_type="multipart/form-data")
    elapsed = time.monotonic() - started
    _refused(response, 413, "unpacks to more than 8388608 bytes", "RLREG_MAX_UNPACKED_BYTES")
    assert elapsed < 5, elapsed
    app.config["MAX_UNPACKED_BYTES"] = 1 << 40
    app.config["LIMITS"] = Limits(max_decompress_seconds=0.05)
    response = client.post("/api/uploads", data={"file": (io.BytesIO(bomb), "run.tar.bz2")}, headers=auth,
                           content_type="multipart/form-data")
    _refused(response, 422, "more than 0.05 s of CPU time", "RLREG_MAX_DECOMPRESS_SECONDS")
    assert _snapshot(reg) == before
    assert not [p for p in (tmp_path / "up").rglob("*") if p.is_file()]  # nothing left behind


def test_wide_files_and_long_lines_refused_over_http_and_in_the_cli(bounded, tmp_path):
    app, reg, run_id, auth = bounded
    client = app.test_client()
    before = _snapshot(reg)
    wide = "step," + ",".join(f"m{i}" for i in range(60)) + "\n" + "1," + ",".join("0.5" for _ in range(60)) + "\n"
    _refused(client.post("/api/uploads", data={"file": (io.BytesIO(wide.encode()), "wide.csv")}, headers=auth,
                         content_type="multipart/form-data"), 422, "wide.csv", "more than 50 distinct metric keys")
    long_line = json.dumps({"step": 1, "loss": 0.5, "note": "x" * 5000}) + "\n"
    _refused(client.post("/api/uploads", data={"file": (io.BytesIO(long_line.encode()), "long.jsonl")}, headers=auth,
                         content_type="multipart/form-data"), 413, "long.jsonl", "line 1 is longer than 4096 bytes")
    assert _snapshot(reg) == before
    path = tmp_path / "wide.csv"
    path.write_text(wide)
    with pytest.raises(LimitExceededError, match="RLREG_MAX_METRIC_KEYS"):
        reg.register(path)
    # The CLI reads the limits from the environment (config.py) and exits 1 with the message.
    db = str(reg.engine.url)
    out = CliRunner().invoke(cli, ["--db", db, "register", str(path)], env={"RLREG_MAX_METRIC_KEYS": "10"})
    assert out.exit_code == 1 and "more than 10 distinct metric keys" in out.output and "Traceback" not in out.output
    assert _snapshot(reg) == before


def test_the_runs_page_shows_a_dozen_tags_and_counts_the_rest(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'tags.db'}")
    reg.register_arrays("tagged", {"loss": ([1, 2], [1.0, 0.5])}, tags=[f"tag{i:04d}" for i in range(1000)])
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "tags"})
    page = app.test_client().get("/runs").get_data(as_text=True)
    assert "+988 more" in page and page.count('class="tag"') == 12
    with pytest.raises(LimitExceededError, match="1001 tags"):
        reg.register_arrays("too-many", {"loss": ([1], [1.0])}, tags=[f"t{i}" for i in range(1001)])
    reg.close()
