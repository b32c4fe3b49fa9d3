"""No hidden ranges: the range the diagnosis judges a metric by is the one the dashboard draws.

Real runs registered into a real SQLite registry: the verl GRPO run on gsm8k of
``tests/data/real/verl_tracking_grpo`` (its KL to the reference has no range in the dictionary,
so the diagnosis judges it by its own default) and the labelled SB3 sweep of
``tests/data/real/sb3_sweep`` (CartPole task ranges from the dictionary, a baseline learned
from four healthy runs).
"""
from __future__ import annotations

import html
import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from registry.analysis.diagnosis.ranges import FALLBACK_SOURCE
from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS
from registry.analysis.health import current_findings, diagnose_run
from registry.analysis.baselines import build_task_baseline
from registry.importers.params import load_params_file
from registry.store.facade import Registry
from registry.web.app import create_app

REAL = Path(__file__).parent / "data" / "real"
SWEEP = REAL / "sb3_sweep"
HEALTHY_CARTPOLE = ["cartpole_default_s1", "cartpole_default_s2", "cartpole_default_s3", "cartpole_default_s4"]
HEALTHY_FILL = (0xDC, 0xF0, 0xD5)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(f"sqlite:///{tmp_path_factory.mktemp('ranges') / 'ranges.db'}")
    reg.register(REAL / "verl_tracking_grpo/verl_grpo_tiny/qwen_tiny_gsm8k_grpo.jsonl", name="verl-gsm8k",
                 task="gsm8k", params=load_params_file(REAL / "verl_tracking_grpo/config.json"))
    for name in HEALTHY_CARTPOLE + ["cartpole_lr_1e-2", "acrobot_lr_3e-2"]:
        reg.register(SWEEP / name, name=name, project="sb3-sweep", algorithm="PPO",
                     tags=["healthy"] if name in HEALTHY_CARTPOLE else [])
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def client(registry):
    app = create_app({"REGISTRY": registry, "TESTING": True, "SECRET_KEY": "ranges", "PLOT_REF_TTL": 0})
    return app.test_client()


def card(page: str, key: str) -> str:
    start = page.index(f'data-key="{key}"')
    return page[start:page.index("</figure>", start)]


def healthy_pixels(png: bytes) -> int:
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int((np.abs(img - np.array(HEALTHY_FILL)).max(axis=2) <= 3).sum())


def test_a_default_range_the_diagnosis_judges_by_is_drawn_with_its_source(registry, client):
    run = registry.run_detail("verl-gsm8k")
    kl_key = next(s["key"] for s in run["series"] if s.get("definition") == "kl_ref_mean")
    d = diagnose_run(registry, "verl-gsm8k")
    low, high = DEFAULT_SETTINGS.fallback_ranges["kl_ref_mean"]
    assert d.ranges["kl_ref_mean"] == {"low": low, "high": high, "source": FALLBACK_SOURCE,
                                       "used": "kl_ref_mean" in d.ranges_used}
    assert d.ranges_used["kl_ref_mean"]["source"] == FALLBACK_SOURCE     # the KL detectors judged by it

    page = client.get(f"/runs/{run['id']}?plots=static").get_data(as_text=True)
    foot = html.unescape(card(page, kl_key))
    assert f"healthy \u2264 {high:g}" in foot and FALLBACK_SOURCE in foot
    assert "healthy none" not in foot

    response = client.get(f"/api/runs/{run['id']}/plot", query_string={"key": kl_key})
    assert response.status_code == 200
    body = response.get_json()
    assert body["healthy"] == [low, high] and body["healthy_source"] == FALLBACK_SOURCE

    png = client.get(f"/plots/run/{run['id']}", query_string={"key": kl_key}).data
    assert healthy_pixels(png) > 0


def test_every_range_of_a_run_is_on_its_cards_exactly_as_the_diagnosis_has_it(registry, client):
    run = registry.run_detail("cartpole_lr_1e-2")
    found = current_findings(registry, run["id"])
    ranges = found.summary["ranges"]
    assert ranges["episode_return_mean"]["low"] == 0 and ranges["episode_return_mean"]["high"] == 500
    assert "max_episode_steps=500" in ranges["episode_return_mean"]["source"]
    page = html.unescape(client.get(f"/runs/{run['id']}?plots=static").get_data(as_text=True))
    by_definition = {s["definition"]: s["key"] for s in run["series"] if s.get("definition")}
    for name, r in ranges.items():
        foot = card(page, by_definition[name])
        assert f"({r['source']})" in foot, name
        m = re.search(r'data-source="[^"]*">healthy ([^<(]*)', foot)
        assert m, name
        shown = m.group(1).replace("\u2013", "-").strip()
        for bound in (r["low"], r["high"]):
            if bound is not None:
                assert f"{bound:g}" in shown.replace(",", ""), (name, shown, r)
    # A metric nobody gives a range says so, rather than borrowing one.
    unranged = [n for n in by_definition if n not in ranges]
    assert unranged
    assert "healthy none" in card(page, by_definition[unranged[0]])


def test_a_baseline_range_is_shown_on_the_plot_and_on_the_definition_page(registry, client):
    build_task_baseline(registry, "CartPole-v1", HEALTHY_CARTPOLE, author="test")
    run = registry.run_detail("cartpole_lr_1e-2")
    d = diagnose_run(registry, run["id"])
    learned = {n: r for n, r in d.ranges.items() if r["source"].startswith("learned from the CartPole-v1 baseline")}
    assert learned, d.ranges
    name, r = sorted(learned.items())[0]
    key = next(s["key"] for s in run["series"] if s.get("definition") == name)
    page = html.unescape(client.get(f"/runs/{run['id']}?plots=static").get_data(as_text=True))
    assert r["source"] in card(page, key)

    defn = html.unescape(client.get(f"/dictionary/{name}").get_data(as_text=True))
    table = defn[defn.index('id="ranges-used"'):defn.index("</table>", defn.index('id="ranges-used"'))]
    assert "CartPole-v1" in table and r["source"] in table


def test_the_definition_page_lists_the_default_and_the_sourced_task_ranges(client):
    kl = html.unescape(client.get("/dictionary/kl_ref_mean").get_data(as_text=True))
    table = kl[kl.index('id="ranges-used"'):kl.index("</table>", kl.index('id="ranges-used"'))]
    assert "diagnosis default" in table and FALLBACK_SOURCE in table
    ret = html.unescape(client.get("/dictionary/episode_return_mean").get_data(as_text=True))
    table = ret[ret.index('id="ranges-used"'):ret.index("</table>", ret.index('id="ranges-used"'))]
    assert "CartPole-v1" in table and "gymnasium" in table and "max_episode_steps=500" in table


def test_a_repeated_episode_return_is_information_unless_it_sits_at_the_runs_worst(registry):
    # SB3's ep_rew_mean is a mean over its last 100 finished episodes: it repeats when the window
    # does not change. cartpole_lr_1e-2 repeats 121.16 four times mid-run (neither its best nor worst).
    d = diagnose_run(registry, "cartpole_lr_1e-2", use_baseline=False)
    repeats = d.by_detector("reward_zero")
    assert repeats and all(f.severity == "info" for f in repeats)
    assert "did not change" in repeats[0].title
    # acrobot_lr_3e-2 collapses back to -500 (every episode times out) and stays: a problem.
    d = diagnose_run(registry, "acrobot_lr_3e-2", use_baseline=False)
    stuck = [f for f in d.by_detector("reward_zero") if f.at_least("warning")]
    assert stuck and stuck[0].evidence["constant_level"] == -500 and "worst" in stuck[0].title
