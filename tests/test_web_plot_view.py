"""The interactive plots' API: a step range reduced to the plot's width, x-axes, ETags, the run stamp,
the series API's step range, and plotly.js served locally. Responses checked against openapi.yaml."""
from __future__ import annotations

import numpy as np
import pytest

from registry import SeriesData, open_registry
from registry.web.app import create_app
from registry.web import smoothing
from test_web_support import check_response

N = 200_000
SPIKE_AT = 123_457  # a step inside the zoomed range below


@pytest.fixture(scope="module")
def site(tmp_path_factory, openapi):
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('plotview') / 'registry.db.engine'}")
    rng = np.random.default_rng(3)
    steps = np.arange(1, N + 1, dtype=np.int64)
    kl = np.abs(rng.normal(0.01, 0.002, N))
    kl[SPIKE_AT - 1] = 5.0
    walls = 1_700_000_000.0 + steps * 0.5  # two steps a second
    tokens = np.cumsum(rng.integers(900, 1100, N)).astype(np.float64)
    # CleanRL-like: several episode returns at some steps.
    ep_steps = np.repeat(np.arange(1, 401, dtype=np.int64) * 10, 3)
    ep_vals = rng.normal(100, 10, ep_steps.size)
    bumpy = np.sin(np.arange(1, 101) / 5.0)  # goes down and up: not a counter
    res = reg.register_arrays("long-run", {
        "actor/kl_loss": SeriesData(steps, kl, walls),
        "perf/total_num_tokens": SeriesData(steps, tokens),
        "charts/episodic_return": SeriesData(ep_steps, ep_vals),
        "custom/bumpy_num_steps": SeriesData(np.arange(1, 101, dtype=np.int64), bumpy),
    }, framework="verl", algorithm="GRPO", project="p", task="gsm8k")
    other = reg.register_arrays("other-run", {"actor/kl_loss": SeriesData(steps[:50_000], kl[:50_000] * 2)},
                                framework="verl", algorithm="GRPO", project="p", task="gsm8k")
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()

    def get(url: str, status: int = 200, headers=None, **query):
        response = client.get(url, query_string=query or None, headers=headers or {})
        assert response.status_code == status, response.get_data(as_text=True)[:500]
        if url.startswith("/api/") and status in (200, 400, 404):
            check_response(openapi, response, url.split("?")[0], query_string=query or None)
        return response

    yield get, res.run_id, reg, dict(other=other.run_id, kl=kl, steps=steps, tokens=tokens, ep_steps=ep_steps, ep_vals=ep_vals)
    reg.close()


def test_whole_series_is_reduced_to_the_plot_width_with_the_spike(site):
    get, run_id, _, d = site
    body = get(f"/api/runs/{run_id}/plot", key="actor/kl_loss", points=700).get_json()
    assert body["total"] == N and body["downsampled"] and body["returned"] <= 700
    line = body["line"]
    assert SPIKE_AT in line["steps"]
    assert line["values"][line["steps"].index(SPIKE_AT)] == 5.0
    assert body["line"]["steps"] == sorted(body["line"]["steps"])


def test_zoomed_range_is_reduced_over_that_range_only_and_keeps_the_spike(site):
    get, run_id, _, d = site
    lo, hi = 120_000, 130_000
    body = get(f"/api/runs/{run_id}/plot", key="actor/kl_loss", points=500, from_step=lo, to_step=hi).get_json()
    steps = body["line"]["steps"]
    assert body["in_range"] == hi - lo + 1 and len(steps) <= 500
    assert min(steps) >= lo and max(steps) <= hi
    assert SPIKE_AT in steps
    # Denser than the whole view: ~500 points over 10k steps, not the ~25 a 100k-wide view has there.
    assert len(steps) > 400
    # A narrow range returns every point in it.
    narrow = get(f"/api/runs/{run_id}/plot", key="actor/kl_loss", points=500, from_step=SPIKE_AT - 10,
                 to_step=SPIKE_AT + 10).get_json()
    assert narrow["line"]["steps"] == list(range(SPIKE_AT - 10, SPIKE_AT + 11)) and not narrow["downsampled"]
    assert narrow["line"]["values"] == pytest.approx(d["kl"][SPIKE_AT - 11:SPIKE_AT + 10].tolist())


def test_smoothed_values_are_the_full_series_smoothing_at_the_returned_steps(site):
    get, run_id, _, d = site
    for method, window in (("ema", 50), ("trailing", 7), ("centred", 9)):
        body = get(f"/api/runs/{run_id}/plot", key="actor/kl_loss", points=300, from_step=5000, to_step=9000,
                   smooth=method, window=window).get_json()
        full = smoothing.smooth(d["kl"], method, window)
        idx = np.asarray(body["line"]["steps"]) - 1
        assert body["line"]["smoothed"] == pytest.approx(full[idx].tolist(), rel=1e-12)
        assert body["smoothing"]["method"] == method and body["smoothing"]["window"] == window
    none = get(f"/api/runs/{run_id}/plot", key="actor/kl_loss", points=100, smooth="none").get_json()
    assert "smoothed" not in none["line"]


def test_repeated_steps_give_per_step_means_counts_and_raw_points(site):
    get, run_id, _, d = site
    body = get(f"/api/runs/{run_id}/plot", key="charts/episodic_return", points=2000, from_step=100,
               to_step=200).get_json()
    line = body["line"]
    assert body["repeated_steps"] and line["steps"] == list(range(100, 201, 10))
    assert line["counts"] == [3] * 11
    means = d["ep_vals"].reshape(-1, 3).mean(axis=1)[9:20]
    assert line["values"] == pytest.approx(means.tolist())
    assert len(body["raw"]["steps"]) == 33 and body["raw"]["values"] == pytest.approx(d["ep_vals"][27:60].tolist())


def test_x_axes_fraction_wall_and_a_monotone_counter(site):
    get, run_id, _, d = site
    q = dict(key="actor/kl_loss", points=100, from_step=1000, to_step=2000)
    frac = get(f"/api/runs/{run_id}/plot", x="fraction", **q).get_json()
    assert frac["x_title"] == "fraction of training"
    assert frac["line"]["x"] == pytest.approx([s / N for s in frac["line"]["steps"]])
    wall = get(f"/api/runs/{run_id}/plot", x="wall", **q).get_json()
    assert wall["line"]["x"] == pytest.approx([(s - 1) * 0.5 / 3600 for s in wall["line"]["steps"]])
    tok = get(f"/api/runs/{run_id}/plot", x="counter:perf/total_num_tokens", **q).get_json()
    assert tok["x_title"] == "perf/total_num_tokens"
    assert tok["line"]["x"] == pytest.approx([d["tokens"][s - 1] for s in tok["line"]["steps"]])
    bad = get(f"/api/runs/{run_id}/plot", 400, x="counter:custom/bumpy_num_steps", **q).get_json()
    assert "decreases at step" in bad["error"] and "custom/bumpy_num_steps" in bad["error"]
    no_wall = get(f"/api/runs/{run_id}/plot", 400, key="charts/episodic_return", x="wall").get_json()
    assert "no wall times" in no_wall["error"]


def test_bad_parameters_are_named(site):
    get, run_id, _, _ = site
    assert "to_step" in get(f"/api/runs/{run_id}/plot", 400, key="actor/kl_loss", from_step=10,
                            to_step=5).get_json()["error"]
    assert "x must be" in get(f"/api/runs/{run_id}/plot", 400, key="actor/kl_loss", x="bogus").get_json()["error"]
    assert "from_step" in get(f"/api/runs/{run_id}/plot", 400, key="actor/kl_loss",
                              from_step="abc").get_json()["error"]
    get(f"/api/runs/{run_id}/plot", 404, key="no/such/key")


def test_etag_gives_304_until_the_run_gets_new_points(site):
    get, run_id, reg, _ = site
    live = reg.create_run("live-run", project="p", framework="verl")
    reg.append(live.id, {"actor/kl_loss": SeriesData(np.arange(1, 11), np.linspace(0, 1, 10))})
    first = get(f"/api/runs/{live.id}/plot", key="actor/kl_loss", points=100)
    tag = first.headers["ETag"]
    get(f"/api/runs/{live.id}/plot", 304, headers={"If-None-Match": tag}, key="actor/kl_loss", points=100)
    stamp = get(f"/api/runs/{live.id}/stamp")
    assert stamp.get_json()["status"] == "running"
    get(f"/api/runs/{live.id}/stamp", 304, headers={"If-None-Match": stamp.headers["ETag"]})
    reg.append(live.id, {"actor/kl_loss": SeriesData(np.arange(11, 16), np.ones(5))})
    newer = get(f"/api/runs/{live.id}/stamp", headers={"If-None-Match": stamp.headers["ETag"]}).get_json()
    assert newer["data_version"] > stamp.get_json()["data_version"]
    again = get(f"/api/runs/{live.id}/plot", headers={"If-None-Match": tag}, key="actor/kl_loss", points=100)
    assert again.get_json()["line"]["steps"][-1] == 15


def test_series_api_step_range(site):
    get, run_id, _, _ = site
    body = get(f"/api/runs/{run_id}/series", key="actor/kl_loss", from_step=120_000, to_step=130_000,
               points=200).get_json()
    assert min(body["steps"]) >= 120_000 and max(body["steps"]) <= 130_000 and SPIKE_AT in body["steps"]
    assert len(body["steps"]) <= 200
    whole = get(f"/api/runs/{run_id}/series", key="charts/episodic_return", from_step=10, to_step=20,
                per_step=1).get_json()
    assert whole["steps"] == [10, 20] and whole["counts"] == [3, 3]
    assert "to_step" in get(f"/api/runs/{run_id}/series", 400, key="actor/kl_loss", from_step=3,
                            to_step=2).get_json()["error"]


def test_plotly_is_served_locally_with_its_stylesheet(site):
    get, _, _, _ = site
    js = get("/static/vendor/plotly.min.js")
    assert js.mimetype == "text/javascript" and b"plotly.js" in js.data[:200]
    get("/static/vendor/plotly.min.js", 304, headers={"If-None-Match": js.headers["ETag"]})
    css = get("/static/vendor/plotly.css").get_data(as_text=True)
    assert ".js-plotly-plot .plotly .main-svg{position:absolute;" in css
    assert "X" not in css.replace("translateX", "").replace("overflow-x", "")


def test_compare_overlay_traces_and_a_zoomed_range(site):
    get, run_id, reg, d = site
    q = {"run": [run_id, d["other"]], "metric": "kl_ref_mean", "group": "0", "points": 800}
    whole = get("/api/compare/plot", **q).get_json()
    assert sorted(t["label"] for t in whole["traces"]) == ["long-run", "other-run"] and whole["x_range"] is None
    zoomed = get("/api/compare/plot", x_from=120_000, x_to=130_000, **q).get_json()
    long_run = next(t for t in zoomed["traces"] if t["label"] == "long-run")
    assert min(long_run["raw_x"]) >= 120_000 and max(long_run["raw_x"]) <= 130_000
    assert SPIKE_AT in long_run["raw_x"]
    other = next(t for t in zoomed["traces"] if t["label"] == "other-run")
    assert other["raw_x"] == []  # that run ended at step 50,000
    # The smoothed line is the whole series' smoothing, cut to the range (not restarted at its edge).
    window = int(reg.definitions_by_name()["kl_ref_mean"]["smoothing_window"])
    full = smoothing.smooth(d["kl"], "ema", window)
    xs = np.asarray(long_run["smooth_x"], dtype=np.int64)
    assert long_run["smooth_y"] == pytest.approx(full[xs - 1].tolist(), rel=1e-9)
    assert "x_from" in get("/api/compare/plot", 400, x_from=5, **q).get_json()["error"]
