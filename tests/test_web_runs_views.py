"""The runs table's column picker (any hyperparameter, last/min/max of any metric), curves grouped by a
hyperparameter or tag (mean, standard error, runs per step), pattern panels and parallel coordinates,
on a real SQLite registry."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from registry import Registry, SeriesData
from registry.core.errors import InputError
from registry.web.app import create_app
from registry.web.run_columns import aggregate, compile_pattern, group_label
from test_web_support import fill_registry


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    reg = Registry(f"sqlite:///{tmp_path_factory.mktemp('runsviews') / 'registry.db'}")
    ids = fill_registry(reg)
    rng = np.random.default_rng(3)
    for i, (lr, tag) in enumerate([(1e-6, "low"), (1e-6, "low"), (1e-4, "high")]):
        steps = np.arange(1, 41 - 10 * (i == 1))  # the second low-lr run stops at step 30
        ids[f"rw{i}"] = reg.register_arrays(f"rewards-{i}", {
            "rewards/format/mean": (steps, rng.normal(0.5, 0.1, steps.size)),
            "rewards/accuracy/mean": (steps, np.linspace(0, 1, steps.size) * (1 + i)),
            "rewards/accuracy/std": (steps, np.ones(steps.size)),
        }, project="rw", params={"lr": lr, "group": tag}, tags=[tag], outcome={"scores": {"acc": 0.1 * (i + 1)}}).run_id
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "runs-views"})
    yield app.test_client(), reg, ids
    reg.close()


def data_block(page: str, block: str) -> dict:
    return json.loads(re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', page, re.S).group(1))


def test_aggregate_counts_only_runs_covering_the_step_and_gives_the_standard_error():
    a = SeriesData(np.array([0, 10]), np.array([0.0, 10.0]))
    b = SeriesData(np.array([0, 5]), np.array([2.0, 2.0]))
    c = SeriesData(np.array([0, 10]), np.array([np.nan, 4.0]))  # its first point is NaN: it starts at 10
    mean, se, n = aggregate([a, b, c], np.array([0.0, 5.0, 10.0]))
    assert n.tolist() == [2, 2, 2]
    assert mean.tolist() == pytest.approx([1.0, 3.5, 7.0])
    # Two values: standard deviation (n-1) / sqrt(2) is half their distance.
    assert se.tolist() == pytest.approx([1.0, 1.5, 3.0])
    mean, se, n = aggregate([a], np.array([0.0, 20.0]))
    assert n.tolist() == [1, 0] and np.isnan(se).all() and np.isnan(mean[1])


def test_patterns_group_labels_and_bad_patterns():
    assert compile_pattern("rewards/.*/mean").fullmatch("rewards/format/mean")
    assert compile_pattern("rewards/{source}/mean").fullmatch("rewards/format/mean")
    assert not compile_pattern("rewards/{source}/mean").fullmatch("rewards/a/b/mean")
    assert compile_pattern("rewards/*/mean").fullmatch("rewards/x/mean")
    with pytest.raises(InputError, match=r"position 8"):
        compile_pattern("rewards/(")
    run = {"params": {"lr": 1e-6}, "tags": ["b", "a"]}
    assert group_label(run, "lr") == "lr=1e-06" and group_label(run, "tags") == "b, a"
    assert group_label(run, "seed") == "seed unset" and group_label(run, "tag:a") == "a"


def test_column_picker_shows_min_and_max_of_a_metric_in_canonical_sign(site):
    client, reg, ids = site
    page = client.get("/runs?project=cartpole&metrics=entropy:min,entropy:max,entropy&params=gamma").get_data(as_text=True)
    assert "entropy (min)" in page and "entropy (max)" in page
    # SB3 logs train/entropy_loss = -entropy: the canonical minimum is minus the raw maximum.
    raw = reg.read_series(ids["sb3-s0"], "train/entropy_loss").values
    row = re.search(r'<tr>\s*<td class="select"><input[^>]*value="%s".*?</tr>' % ids["sb3-s0"], page, re.S).group(0)
    cells = re.findall(r'<td class="num health-[a-z]+"[^>]*>([^<]*)</td>', row)
    from registry.web.formatting import format_number

    assert cells[:2] == [format_number(float(-raw.max())), format_number(float(-raw.min()))]
    assert cells[2] == format_number(float(-raw[-1]))
    # The picker offers every hyperparameter and each metric's last, min and max.
    assert 'name="params" value="kl_loss_coef"' in page and 'value="entropy:max" checked' in page
    bad = client.get("/runs?metrics=entropy:median")
    assert bad.status_code == 400 and "last, min, max, mean, first" in bad.get_data(as_text=True)


def test_grouped_curves_by_hyperparameter_have_mean_band_and_runs_per_step(site):
    client, reg, ids = site
    page = client.get("/runs/curves?project=rw&by=lr&panel=rewards/accuracy/mean").get_data(as_text=True)
    spec = data_block(page, "curves-data")
    [panel] = spec["panels"]
    traces = {t["name"]: t for t in panel["traces"]}
    low = traces["lr=1e-06 (2 runs)"]
    assert sorted(low["runs"]) == ["rewards-0", "rewards-1"]
    # Both low-lr runs cover steps 1..30, only one covers 31..40.
    assert low["n"][:30] == [2] * 30 and low["n"][30:] == [1] * 10
    a = reg.read_series(ids["rw0"], "rewards/accuracy/mean").values
    b = reg.read_series(ids["rw1"], "rewards/accuracy/mean").values
    assert low["y"][:30] == pytest.approx(((a[:30] + b) / 2).tolist())
    assert low["se"][:30] == pytest.approx((np.abs(a[:30] - b) / 2).tolist())
    assert low["se"][30:] == [None] * 10 and low["y"][30:] == pytest.approx(a[30:].tolist())
    assert traces["lr=0.0001 (1 run)"]["n"] == [1] * 40
    by_tag = data_block(client.get("/runs/curves?project=rw&by=tags&panel=rewards/accuracy/mean").get_data(as_text=True),
                        "curves-data")
    assert sorted(t["name"] for t in by_tag["panels"][0]["traces"]) == ["high (1 run)", "low (2 runs)"]


def test_pattern_panel_puts_every_matching_key_on_one_plot(site):
    client, _, _ = site
    page = client.get("/runs/curves?project=rw&panel=rewards/.*/mean&panel=rewards/{source}/std").get_data(as_text=True)
    mean_panel, std_panel = data_block(page, "curves-data")["panels"]
    assert mean_panel["keys"] == ["rewards/accuracy/mean", "rewards/format/mean"]
    assert len(mean_panel["traces"]) == 6  # 3 runs x 2 keys
    assert {t["name"] for t in mean_panel["traces"]} >= {"rewards-0 \u00b7 rewards/format/mean"}
    assert std_panel["keys"] == ["rewards/accuracy/std"] and len(std_panel["traces"]) == 3
    bad = client.get("/runs/curves?project=rw&panel=rewards/(")
    assert bad.status_code == 400 and "unterminated subpattern" in bad.get_data(as_text=True)
    assert "<script>" not in page and 'src="/static/runs_views.js"' in page


def test_parallel_coordinates_of_hyperparameters_against_a_score(site):
    client, _, _ = site
    page = client.get("/runs/parallel?project=rw&params=lr,group&outcome=score.acc").get_data(as_text=True)
    data = data_block(page, "parallel-data")
    labels = [d["label"] for d in data["dimensions"]]
    assert labels == ["log10(lr)", "group", "score.acc"]
    assert sorted(data["dimensions"][0]["values"]) == pytest.approx([-6, -6, -4])
    assert data["dimensions"][1]["ticktext"] == ["high", "low"]
    assert sorted(data["dimensions"][2]["values"]) == pytest.approx([0.1, 0.2, 0.3])
    # A metric summary as the outcome; runs without it are left out and counted.
    page = client.get("/runs/parallel?params=learning_rate&outcome=kl_old_mean:max").get_data(as_text=True)
    data = data_block(page, "parallel-data")
    assert data["left_out"] > 0 and len(data["runs"]) == 3
    bad = client.get("/runs/parallel?outcome=nothing_like_this:last")
    assert bad.status_code == 400 and "no run has the metric" in bad.get_data(as_text=True)
