"""The write API against registry/web/openapi.yaml: each request and each answer validated with openapi-core."""
from __future__ import annotations

import io

import pytest
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.web.app import create_app
from test_web_support import check_response

@pytest.fixture
def call(db_url, tmp_path, openapi):
    reg = open_registry(db_url)
    create_user(reg, "writer", "writer-password")
    token = create_token(reg, "writer", "api", scope="admin")
    client = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "s",
                         "UPLOAD_DIR": str(tmp_path / "up")}).test_client()
    auth = {"Authorization": f"Bearer {token}"}

    def do(method: str, path: str, status: int, json=None, data=None, check_request: bool = True):
        kwargs = {"json": json} if json is not None else {}
        if data is not None:
            kwargs = {"data": data, "content_type": "multipart/form-data"}
        response = client.open(path, method=method, headers=auth, **kwargs)
        assert response.status_code == status, response.get_data(as_text=True)[:500]
        if check_request and data is None:
            builder = EnvironBuilder(path=path, method=method, headers=auth, base_url="http://localhost/", **kwargs)
            openapi.validate_request(WerkzeugOpenAPIRequest(Request(builder.get_environ())))
        check_response(openapi, response, path, method)
        return response.get_json()

    yield do, reg
    reg.close()


def test_write_endpoints_match_the_spec(call):
    do, reg = call
    run = do("POST", "/api/runs", 201, json={
        "name": "spec-run", "project": "p", "algorithm": "GRPO", "framework": "verl", "params": {"actor": {"lr": 1e-6}},
        "tags": ["t"], "run_id": "ab" * 16})
    assert run["status"] == "running" and run["series"] == []
    assert do("POST", "/api/runs", 200, json={"name": "spec-run", "run_id": "ab" * 16})["id"] == run["id"]
    assert "error" in do("POST", "/api/runs", 409, json={"name": "other", "run_id": "ab" * 16})
    batch = {"batch_id": "0b7c9d2e-1", "points": {
        "actor/kl_loss": {"steps": [1, 2, 3, 4], "values": [0.1, "NaN", "Infinity", None],
                          "wall_times": [1.0, 2.0, 3.0, 4.0]},
        "critic/score/mean": {"steps": [1, 2], "values": [0.5, "-Infinity"]}},
        "semantics": {"actor/kl_loss": {"kl_estimator": "k1"}}}
    ack = do("POST", f"/api/runs/{run['id']}/metrics", 200, json=batch)
    assert ack == {"run_id": run["id"], "batch_id": "0b7c9d2e-1", "applied": True, "points": 6}
    assert do("POST", f"/api/runs/{run['id']}/metrics", 200, json=batch)["applied"] is False
    kl = reg.read_series(run["id"], "actor/kl_loss")
    assert kl.steps.tolist() == [1, 2, 3, 4] and kl.values[0] == 0.1 and kl.values[2] == float("inf")
    series = {s["key"]: s for s in reg.run_detail(run["id"])["series"]}
    assert series["actor/kl_loss"]["nan_count"] == 2 and series["actor/kl_loss"]["semantics"]["kl_estimator"] == "k1"
    assert series["critic/score/mean"]["inf_count"] == 1
    out = do("POST", f"/api/runs/{run['id']}/outcome", 200, json={
        "verdict": "success", "scores": {"gsm8k": 0.7}, "notes": "fine",
        "checkpoints": [{"step": 4, "uri": "s3://ckpt/4", "note": "last"}]})
    assert out["verdict"] == "success" and out["checkpoints"] == [{"step": 4, "uri": "s3://ckpt/4", "note": "last"}]
    assert do("POST", f"/api/runs/{run['id']}/status", 200, json={"status": "finished"})["finished_at"]
    edit = do("PATCH", "/api/definitions/entropy", 200, json={"changes": {"healthy_range": {"low": 0.1, "high": None}},
                                                              "note": "collapse below 0.1"})
    assert edit == {"name": "entropy", "version": 2, "changed": True}
    up = do("POST", "/api/uploads", 201, data={"file": (io.BytesIO(b"step,loss\n1,1\n2,0.5\n"), "run.csv"),
                                               "tags": "a,b", "project": "p"})
    assert up["point_count"] == 2 and up["file"] == "run.csv"
    assert "error" in do("POST", "/api/uploads", 409, data={"file": (io.BytesIO(b"step,loss\n1,1\n2,0.5\n"), "r.csv")})
    assert "error" in do("POST", "/api/uploads", 400, data={"file": (io.BytesIO(b"step,loss\n2,1\n1,0.5\n"), "r.csv")})
    assert do("DELETE", f"/api/runs/{run['id']}", 200) == {"deleted": run["id"]}
    assert "error" in do("DELETE", f"/api/runs/{run['id']}", 404)
    assert "error" in do("POST", "/api/runs/nope/metrics", 404, json=batch)
    assert "error" in do("POST", "/api/runs", 400, json={"name": ""}, check_request=False)
