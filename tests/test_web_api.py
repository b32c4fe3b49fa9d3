"""The JSON API, every response checked against registry/web/openapi.yaml with openapi-core."""
from __future__ import annotations

import pytest
import yaml

from registry import open_registry
from registry.web.app import create_app
from test_web_support import check_response, fill_registry


@pytest.fixture
def api(db_url, openapi):
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=30)
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()

    def get(url: str, status: int = 200, validate_spec: bool = True, **query):
        response = client.get(url, query_string=query or None)
        assert response.status_code == status, response.get_data(as_text=True)[:500]
        if not validate_spec:
            return response.get_json()
        check_response(openapi, response, url.split("?")[0],
                       query_string=query or (url.split("?", 1)[1] if "?" in url else None))
        return response.get_json()

    yield get, ids
    reg.close()


def test_spec_is_served(db_url):
    reg = open_registry(db_url)
    response = create_app({"REGISTRY": reg, "TESTING": True}).test_client().get("/api/openapi.yaml")
    assert response.status_code == 200 and yaml.safe_load(response.data)["openapi"].startswith("3.")
    reg.close()


def test_runs_list_filter_pagination_and_errors(api):
    get, ids = api
    everything = get("/api/runs")
    assert everything["total"] == 5 and len(everything["runs"]) == 5
    grpo = get("/api/runs", filter="learning_rate>1e-5 and algorithm=GRPO")
    assert [r["name"] for r in grpo["runs"]] == ["grpo-lr5e-5"]
    assert grpo["runs"][0]["params"]["learning_rate"] == 5e-5
    page = get("/api/runs", order="name", limit="2", offset="2")
    assert [r["name"] for r in page["runs"]] == ["grpo-lr5e-5", "sb3-cartpole-s0"] and page["total"] == 5
    assert get("/api/runs", project="cartpole", verdict="success")["total"] == 2
    bad = get("/api/runs", 400, filter="learning_rate>>")
    assert bad["error"].startswith("bad filter")
    assert "limit" in get("/api/runs", 400, limit="0")["error"]
    assert "cannot sort" in get("/api/runs", 400, order="bogus")["error"]


def test_run_detail_and_404(api):
    get, ids = api
    detail = get(f"/api/runs/{ids['sb3-s0']}")
    assert detail["framework"] == "stable-baselines3" and detail["verdict"] == "success"
    kl = next(s for s in detail["series"] if s["key"] == "train/approx_kl")
    assert kl["definition"] == "kl_old_mean" and kl["semantics"]["kl_estimator"] == "k3"
    assert get("/api/runs/sb3-cartpole-s1")["id"] == ids["sb3-s1"]  # by name
    missing = get("/api/runs/does-not-exist", 404)
    assert "no run" in missing["error"]


def test_series_full_canonical_and_downsampled(api):
    get, ids = api
    raw = get(f"/api/runs/{ids['sb3-s0']}/series", key="train/entropy_loss")
    assert raw["count"] == 30 and raw["returned"] == 30 and not raw["downsampled"]
    assert all(v < 0 for v in raw["values"])
    canonical = get(f"/api/runs/{ids['sb3-s0']}/series", key="train/entropy_loss", canonical="true")
    assert canonical["definition"] == "entropy" and all(v > 0 for v in canonical["values"])
    by_name = get(f"/api/runs/{ids['sb3-s0']}/series", key="entropy")
    assert by_name["key"] == "train/entropy_loss"
    small = get(f"/api/runs/{ids['sb3-s0']}/series", key="rollout/ep_rew_mean", points="10")
    assert small["downsampled"] and small["returned"] == 10 and small["steps"] == sorted(small["steps"])
    with_nan = get(f"/api/runs/{ids['grpo-lr5e-5']}/series", key="actor/kl_loss")
    assert with_nan["nonfinite"] == 1 and with_nan["values"].count(None) == 1
    assert "no metric" in get(f"/api/runs/{ids['sb3-s0']}/series", 404, key="nope")["error"]
    assert "required" in get(f"/api/runs/{ids['sb3-s0']}/series", 400)["error"]
    assert "points" in get(f"/api/runs/{ids['sb3-s0']}/series", 400, key="train/entropy_loss", points="5")["error"]


def test_definitions_list_one_and_404(api):
    get, _ = api
    everything = get("/api/definitions")["definitions"]
    assert len(everything) > 20 and {d["layer"] for d in everything} == {"objective", "constraint", "diagnostic"}
    constraint = get("/api/definitions", layer="constraint")["definitions"]
    assert constraint and all(d["layer"] == "constraint" for d in constraint)
    one = get("/api/definitions/kl_old_mean")
    assert one["version"] == 1 and one["versions"][0]["author"] == "system"
    assert {a["key"] for a in one["aliases"]} >= {"train/approx_kl", "losses/old_approx_kl"}
    assert "no metric definition" in get("/api/definitions/nope", 404)["error"]


def test_unknown_api_path_is_json_404(api):
    get, _ = api
    assert get("/api/nothing-here", 404, validate_spec=False)["error"] == "no API endpoint /api/nothing-here"
