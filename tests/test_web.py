"""The web UI through Flask's test client: runs table, dashboard, plots and their cache, comparison, dictionary."""
from __future__ import annotations

import html
import re

import numpy as np
import pytest
from markupsafe import Markup

from registry import SeriesData, open_registry
from registry.web.app import create_app
from registry.web import panels
from registry.web.curves import SmoothOptions, run_plot_spec
from registry.web.compare_curves import CompareOptions, build_units, compare_metrics, overlay_spec
from test_web_support import fill_registry


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One SQLite registry for the read-only tests of this module."""
    url = f"sqlite:///{tmp_path_factory.mktemp('web') / 'registry.db.engine'}"
    reg = open_registry(url)
    ids = fill_registry(reg)
    app = create_app({"REGISTRY": reg, "TESTING": True, "WTF_CSRF_ENABLED": False, "SECRET_KEY": "test"})
    yield app, ids
    reg.close()


@pytest.fixture
def client(shared):
    return shared[0].test_client()


@pytest.fixture
def ids(shared):
    return shared[1]


@pytest.fixture
def db_app(db_url):
    """A fresh registry on SQLite and on PostgreSQL, with the fixture runs and CSRF on."""
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=40)
    app = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "test"})
    yield app, ids
    reg.close()


def text(response) -> str:
    return response.get_data(as_text=True)


def image_urls(page: str) -> list[str]:
    return [html.unescape(u) for u in re.findall(r'<img class="plot" src="([^"]+)"', page)]


# --- app factory ---------------------------------------------------------------------


def test_factory_reads_database_url_and_sets_security_headers(sqlite_url):
    app = create_app({"DATABASE_URL": sqlite_url, "TESTING": True})
    assert app.extensions["rlregistry"].url == sqlite_url
    assert app.template_folder.endswith("templates") and "registry" not in app.template_folder.rsplit("/", 2)[-2]
    assert app.config["SECRET_KEY"]
    response = app.test_client().get("/")
    assert response.status_code == 200
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in text(response)  # no inline scripts: the page works under the CSP
    assert 'style="' not in text(response)


# --- runs page -----------------------------------------------------------------------


def test_runs_page_filters_sorts_and_paginates(db_app):
    app, ids = db_app
    c = app.test_client()
    page = text(c.get("/"))
    for name in ("sb3-cartpole-s0", "sb3-cartpole-s1", "cleanrl-cartpole", "grpo-lr1e-6", "grpo-lr5e-5"):
        assert name in page
    filtered = c.get("/runs", query_string={"q": "learning_rate>1e-5 and algorithm=GRPO"})
    assert filtered.status_code == 200
    body = text(filtered)
    assert "grpo-lr5e-5" in body and "grpo-lr1e-6" not in body and "sb3-cartpole" not in body
    assert "1&ndash;1 of 1 runs" in body or "1–1 of 1 runs" in body

    bad = c.get("/runs", query_string={"q": "learning_rate>>1"})
    assert bad.status_code == 400
    assert 'id="filter-error"' in text(bad) and "bad filter" in text(bad)

    by_name = text(c.get("/runs?order=name"))
    positions = [by_name.index(f">{n}</a>") for n in ("cleanrl-cartpole", "grpo-lr1e-6", "sb3-cartpole-s0")]
    assert positions == sorted(positions)
    desc = text(c.get("/runs?order=-name"))
    assert desc.index(">sb3-cartpole-s1</a>") < desc.index(">cleanrl-cartpole</a>")

    second = text(c.get("/runs?order=name&size=2&page=2"))
    assert "3&ndash;4 of 5 runs" in second
    assert ">grpo-lr5e-5</a>" in second and ">sb3-cartpole-s0</a>" in second and ">cleanrl-cartpole</a>" not in second
    assert 'rel="prev"' in second and 'rel="next"' in second


def test_runs_page_columns_checkboxes_and_health(client, ids):
    page = text(client.get("/runs?project=cartpole"))
    assert page.count('class="run-select"') == 3
    assert f'value="{ids["sb3-s0"]}"' in page
    assert 'action="/compare"' in page
    assert ">learning_<wbr>rate</th>" in page and ">n_<wbr>steps</th>" in page  # hyperparameters that vary
    assert ">episode return mean</a>" in page  # a reward column, chosen automatically
    chosen = text(client.get("/runs", query_string={"metrics": "entropy", "params": "gamma"}))
    assert ">gamma</th>" in chosen and ">learning_<wbr>rate</th>" not in chosen
    assert 'title="last value of entropy: Policy entropy"' in chosen
    assert "0.99" in chosen


def test_runs_page_tag_quick_filter_and_unknown_sort(client):
    assert "cleanrl-cartpole" not in text(client.get("/runs?tag=baseline"))
    bad = client.get("/runs?order=bogus")
    assert bad.status_code == 400 and "cannot sort by" in text(bad)


# --- run dashboard ---------------------------------------------------------------------


def test_dashboard_has_three_layers_hparams_outcome_and_unmapped(db_app):
    app, ids = db_app
    c = app.test_client()
    response = c.get(f"/runs/{ids['sb3-s0']}")
    assert response.status_code == 200
    page = text(response)
    objective, constraint = page.index('id="layer-objective"'), page.index('id="layer-constraint"')
    diagnostic = page.index('<details class="layer layer-diagnostic"')
    assert objective < constraint < diagnostic
    assert page.index("Episode return") < constraint
    assert constraint < page.index("train/approx_kl") < diagnostic
    assert page.index("train/explained_variance") > diagnostic
    assert 'id="unmapped"' in page and "custom/my_probe" in page
    assert 'id="diagnosis-panel"' in page and 'id="similar-panel"' in page
    # semantics caption and title, links to definitions
    assert "KL estimator k3" in page
    assert 'href="/dictionary/kl_old_mean"' in page
    assert "train/entropy_loss</code> &times;&nbsp;-1" in page
    # hyperparameters, outcome; notes are escaped, never rendered as HTML
    assert "<code>learning_rate</code>" in page and "s3://ckpt/sb3-0" in page
    assert "healthy baseline &lt;b&gt;not bold&lt;/b&gt;" in page
    urls = image_urls(page)
    assert len(urls) == 11
    for url in urls[:3]:
        r = c.get(url)
        assert r.status_code == 200 and r.mimetype == "image/png" and r.data[:4] == b"\x89PNG"


def test_dashboard_flags_metrics_outside_the_healthy_range(client, ids):
    page = text(client.get(f"/runs/{ids['grpo-lr5e-5']}"))
    assert 'id="run-state"' in page
    assert "NaN / Inf" in page  # the KL series has a NaN
    assert "1 NaN/Inf" in page


def test_dashboard_smoothing_options_reach_the_plots(client, ids):
    page = text(client.get(f"/runs/{ids['sb3-s0']}?smooth=centred&window=5"))
    urls = image_urls(page)
    assert urls and all("smooth=centred" in u and "window=5" in u for u in urls)
    assert 'value="5"' in page
    assert client.get(f"/runs/{ids['sb3-s0']}?smooth=gaussian").status_code == 400
    assert client.get(urls[0].replace("window=5", "window=0")).status_code == 400


def test_panel_hooks_are_called(client, ids, monkeypatch):
    seen = []

    def fake(registry, run):
        seen.append(run["id"])
        return Markup('<p class="fake-diagnosis">entropy collapse</p>')

    monkeypatch.setattr(panels, "diagnosis_panel", fake)
    page = text(client.get(f"/runs/{ids['sb3-s0']}"))
    assert seen == [ids["sb3-s0"]] and "fake-diagnosis" in page
    assert 'id="similar-panel"' in page  # the real similar-runs panel: tests/test_web_panels.py


def test_unknown_run_is_404(client):
    response = client.get("/runs/no-such-run")
    assert response.status_code == 404 and "no run with id or name" in text(response)


def test_user_text_is_escaped(sqlite_url):
    reg = open_registry(sqlite_url)
    reg.register_arrays("<script>alert(1)</script>", {"train/approx_kl": ([1, 2], [0.1, 0.2])},
                        framework="stable-baselines3", tags=["<img src=x>"], params={"<b>": "<i>"})
    app = create_app({"REGISTRY": reg, "TESTING": True})
    c = app.test_client()
    for url in ("/", f"/runs/{reg.list_runs()[0][0]['id']}"):
        page = text(c.get(url))
        assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<img src=x>" not in page
    reg.close()


# --- plots and their cache ---------------------------------------------------------------


def test_plot_cache_etag_304_and_invalidation(db_app):
    app, ids = db_app
    c = app.test_client()
    reg = app.extensions["rlregistry"]
    url = f"/plots/run/{ids['sb3-s0']}?key=train/approx_kl"
    first = c.get(url)
    assert first.status_code == 200 and first.headers["X-Plot-Cache"] == "miss"
    etag = first.headers["ETag"]
    second = c.get(url)
    assert second.headers["X-Plot-Cache"] == "hit" and second.data == first.data
    assert c.get(url, headers={"If-None-Match": etag}).status_code == 304
    svg = c.get(url + "&format=svg")
    assert svg.mimetype == "image/svg+xml" and b"<svg" in svg.data[:500]
    assert svg.headers["ETag"] != etag
    # New points: a new data_version, so a new key and ETag.
    reg.set_outcome(ids["sb3-s0"], notes="appended")
    third = c.get(url, headers={"If-None-Match": etag})
    assert third.status_code == 200 and third.headers["X-Plot-Cache"] == "miss"
    # A dictionary edit (healthy range): a new definition version, so a new picture.
    etag3 = third.headers["ETag"]
    from registry.dictionary.definitions import update_definition

    with reg.transaction() as session:
        update_definition(session, "kl_old_mean", {"healthy_range": {"low": None, "high": 0.02}}, "tester", "tighter")
    fourth = c.get(url, headers={"If-None-Match": etag3})
    assert fourth.status_code == 200 and fourth.headers["ETag"] != etag3


def test_plot_cache_on_disk_survives_a_restart(shared, tmp_path, ids):
    app, _ = shared
    reg = app.extensions["rlregistry"]
    config = {"REGISTRY": reg, "TESTING": True, "PLOT_CACHE_DIR": str(tmp_path / "plots")}
    url = f"/plots/run/{ids['cleanrl']}?key=losses/entropy"
    assert create_app(config).test_client().get(url).headers["X-Plot-Cache"] == "miss"
    assert create_app(config).test_client().get(url).headers["X-Plot-Cache"] == "hit"


def test_plot_errors(client, ids):
    assert client.get(f"/plots/run/{ids['sb3-s0']}").status_code == 400  # no key
    assert client.get(f"/plots/run/{ids['sb3-s0']}?key=nope").status_code == 404
    assert client.get(f"/plots/run/{ids['sb3-s0']}?key=train/approx_kl&format=gif").status_code == 400


def test_plot_data_downloads(client, ids):
    csv_response = client.get(f"/plots/run/{ids['grpo-lr5e-5']}/data.csv?key=actor/kl_loss")
    assert csv_response.status_code == 200 and csv_response.mimetype == "text/csv"
    lines = text(csv_response).strip().splitlines()
    assert lines[0] == "step,value,smoothed" and len(lines) == 61
    assert "attachment" in csv_response.headers["Content-Disposition"]
    data = client.get(f"/plots/run/{ids['grpo-lr5e-5']}/data.json"
                      f"?key=actor/kl_loss&smooth=trailing&window=3").get_json()
    assert data["count"] == 60 and data["smoothing"]["method"] == "trailing" and data["smoothing"]["window"] == 3
    assert data["value"].count(None) == 1 and data["smoothed"].count(None) == 1
    # canonical sign in exports: SB3 logs -entropy
    sb3 = client.get(f"/plots/run/{ids['sb3-s0']}/data.json?key=train/entropy_loss").get_json()
    assert sb3["sign"] == -1.0 and all(v > 0 for v in sb3["value"])


def test_million_point_curve_is_downsampled_and_renders_like_a_small_one(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'big.db'}")
    rng = np.random.default_rng(0)
    big_n = 1_000_000
    values = np.sin(np.arange(big_n) / 20000.0) + rng.normal(0, 0.05, big_n)
    values[777_777] = 25.0
    big = reg.register_arrays("big", {"train/approx_kl": SeriesData(np.arange(big_n, dtype=np.int64), values)},
                              framework="stable-baselines3")
    small = reg.register_arrays("small", {"train/approx_kl": (np.arange(1000), values[:1000])},
                                framework="stable-baselines3")
    spec, prepared = run_plot_spec(reg.read_series(big.run_id, "train/approx_kl"), sign=1.0, definition=None, task=None,
                                   opts=SmoothOptions())
    assert "downsampled 1,000,000 -> 2,000 points" in spec.notes
    trace = spec.traces[0]
    assert len(trace.raw_x) == 2000 and len(trace.smooth_x) == 2000
    assert trace.raw_y.max() == 25.0  # the spike survives
    assert spec.ylim[1] == 25.0
    # Both render; how fast is bench/render.py's business (a timed unit test flakes on a loaded machine).
    c = create_app({"REGISTRY": reg, "TESTING": True}).test_client()
    for run_id in (small.run_id, big.run_id):
        r = c.get(f"/plots/run/{run_id}?key=train/approx_kl")
        assert r.status_code == 200 and r.data[:4] == b"\x89PNG"
    reg.close()


# --- compare -----------------------------------------------------------------------------


def test_compare_warns_when_kl_estimators_differ(db_app):
    app, ids = db_app
    c = app.test_client()
    response = c.get(f"/compare?run={ids['sb3-s0']}&run={ids['cleanrl']}")
    assert response.status_code == 200
    page = text(response)
    assert 'id="semantic-summary"' in page
    card = page[page.index('data-metric="kl_old_mean"'):]
    card = card[:card.index("</figure>")]
    assert "Not comparable as is." in card and "KL estimator: k3 vs k1" in card
    assert "sb3-cartpole-s0 vs cleanrl-cartpole" in card
    img = [u for u in image_urls(card)][0]
    r = c.get(img)
    assert r.status_code == 200 and r.data[:4] == b"\x89PNG"
    data = c.get(img.replace("/plots/compare?", "/plots/compare/data.json?")).get_json()
    assert data["warnings"] == ["not comparable: KL estimator: k3 vs k1 (sb3-cartpole-s0 vs cleanrl-cartpole)"]
    assert set(data["run"]) == {"sb3-cartpole-s0", "cleanrl-cartpole"}
    # Entropy means the same thing in both: no warning on that card.
    entropy = page[page.index('data-metric="entropy"'):]
    assert "Not comparable" not in entropy[:entropy.index("</figure>")]


def test_compare_groups_seeds_and_diffs_hyperparameters(client, ids):
    runs = f"run={ids['sb3-s0']}&run={ids['sb3-s1']}&run={ids['cleanrl']}"
    page = text(client.get(f"/compare?{runs}"))
    assert "sb3-cartpole-s* (2 seeds)" in page
    diff = page[page.index('id="hparam-diff"'):page.index("</section>", page.index('id="hparam-diff"'))]
    for key in ("learning_rate", "n_steps", "batch_size", "framework", "seed"):
        assert f"<code>{key}</code>" in diff
    assert "<code>gamma</code>" not in diff  # identical everywhere: hidden
    assert 'class="differs"' in diff
    ungrouped = text(client.get(f"/compare?{runs}&group=0"))
    assert "(2 seeds)" not in ungrouped
    # The reward is shown as logged and normalised.
    assert "normalized=1" in page and "normalized (z-score per run)" in page
    assert "normalized (min-max per run)" in text(client.get(f"/compare?{runs}&norm=minmax"))
    for extra in ("&band=std", "&align=fraction", "&norm=minmax&normalized=1"):
        r = client.get(f"/plots/compare?{runs}&metric=episode_return_mean{extra}")
        assert r.status_code == 200 and r.data[:4] == b"\x89PNG"


def test_overlay_spec_groups_normalizes_and_aligns(shared, ids):
    app, _ = shared
    reg = app.extensions["rlregistry"]
    details = [reg.run_detail(ids[k]) for k in ("sb3-s0", "sb3-s1", "cleanrl")]
    defs = reg.definitions_by_name()
    comp = next(c for c in compare_metrics(details, defs) if c.name == "episode_return_mean")
    assert not comp.warnings
    data = {m.run["id"]: reg.read_series(m.run["id"], m.series["key"]) for m in comp.members}
    units = build_units(details, group_seeds=True)
    assert [len(u.runs) for u in units] == [2, 1]
    spec, _ = overlay_spec(comp, data, units, CompareOptions(band="std"), SmoothOptions())
    group, single = spec.traces
    assert group.band_x is not None and np.all(group.band_low <= group.band_high + 1e-12)
    assert single.raw_x is not None and group.raw_x is None
    norm_spec, export = overlay_spec(comp, data, units, CompareOptions(norm="zscore"), SmoothOptions(), normalized=True)
    values = np.array([v for v, r in zip(export["value"], export["run"]) if r == "cleanrl-cartpole"])
    assert abs(values.mean()) < 1e-9 and abs(values.std() - 1) < 1e-9
    frac_spec, export = overlay_spec(comp, data, units, CompareOptions(align="fraction"), SmoothOptions())
    assert frac_spec.xlabel == "fraction of training" and max(export["x"]) == 1.0
    kl = next(c for c in compare_metrics(details, defs) if c.name == "kl_old_mean")
    assert len(kl.semantic_groups) == 2 and kl.warnings
    kl_data = {m.run["id"]: reg.read_series(m.run["id"], m.series["key"]) for m in kl.members}
    kl_spec, _ = overlay_spec(kl, kl_data, units, CompareOptions(), SmoothOptions())
    assert kl_spec.warnings and kl_spec.warnings[0].startswith("not comparable: KL estimator: k3 vs k1")
    assert {t.linestyle for t in kl_spec.traces} != {"-"}  # the k1 run is drawn in its own style
    assert any(t.label.endswith("[k1]") for t in kl_spec.traces)


def test_compare_without_runs_and_with_unknown_run(client):
    assert "No runs selected" in text(client.get("/compare"))
    assert client.get("/compare?run=nope").status_code == 404
    assert client.get("/plots/compare?metric=entropy").status_code == 400


# --- dictionary ----------------------------------------------------------------------


def test_dictionary_index_by_layer_and_search(client):
    page = text(client.get("/dictionary/"))
    for layer in ("Objective", "Constraint", "Diagnostic"):
        assert f"<h2>{layer}" in page
    constraint = text(client.get("/dictionary/?layer=constraint"))
    assert "kl_old_mean" in constraint and 'id="layer-objective"' not in constraint
    found = text(client.get("/dictionary/?q=old_approx_kl"))
    assert "kl_old_mean" in found and "episode_return_mean" not in found


def test_definition_page_shows_semantics_aliases_runs_and_history(client, ids):
    page = text(client.get("/dictionary/kl_old_mean"))
    assert 'id="semantics"' in page and 'id="healthy-range"' in page
    aliases = page[page.index('id="aliases"'):page.index('id="runs-using"')]
    assert "train/approx_kl" in aliases and "losses/old_approx_kl" in aliases and "stable-baselines3" in aliases
    using = page[page.index('id="runs-using"'):page.index('id="history"')]
    assert "sb3-cartpole-s0" in using and "cleanrl-cartpole" in using and "KL estimator k1" in using
    assert "Version 1" in page[page.index('id="history"'):]
    assert client.get("/dictionary/no_such_metric").status_code == 404


def test_edit_definition_needs_csrf_and_records_a_version(db_app):
    app, _ = db_app
    c = app.test_client()
    assert c.get("/dictionary/entropy/edit").status_code == 302  # to the login page
    from registry.store.auth import create_user

    create_user(app.extensions["rlregistry"], "Ada", "analytical-engine")
    login_page = c.get("/login")
    login_token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', text(login_page)).group(1)
    assert c.post("/login", data={"username": "Ada", "password": "analytical-engine",
                                  "csrf_token": login_token}).status_code == 302
    form_page = c.get("/dictionary/entropy/edit")
    assert form_page.status_code == 200
    assert 'name="author"' not in text(form_page)  # the logged-in user is the author
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', text(form_page)).group(1)
    fields = dict(re.findall(r'<input[^>]*name="([a-z_]+)"[^>]*value="([^"]*)"', text(form_page)))
    fields.update({k: html.unescape(v) for k, v in re.findall(
        r'<textarea[^>]*name="([a-z_]+)"[^>]*>\s*(.*?)</textarea>', text(form_page), re.S)})
    for name in ("layer", "quantity", "higher_is_better", "averaging", "kl_estimator", "normalization_axis",
                 "logging_point"):
        select = re.search(rf'<select[^>]*name="{name}"[^>]*>(.*?)</select>', text(form_page), re.S).group(1)
        chosen = (re.search(r'<option selected value="([^"]*)"', select)
                  or re.search(r'<option value="([^"]*)" selected', select))
        fields[name] = chosen.group(1) if chosen else ""
    fields.update({"healthy_low": "0.05", "note": "entropy below 0.05 is a collapse"})

    without_token = dict(fields)
    without_token.pop("csrf_token", None)
    assert c.post("/dictionary/entropy/edit", data=without_token).status_code == 400

    bad = dict(fields, csrf_token=token, task_ranges="CartPole-v1 0.1")
    response = c.post("/dictionary/entropy/edit", data=bad)
    assert response.status_code == 400 and "task: low .. high" in text(response)

    response = c.post("/dictionary/entropy/edit", data=dict(fields, csrf_token=token))
    assert response.status_code == 302, text(response)[:2000]
    page = text(c.get(response.headers["Location"]))
    assert "Saved entropy as version 2." in page
    history = page[page.index('id="history"'):]
    assert "Version 2" in history and "Ada" in history and "entropy below 0.05 is a collapse" in history
    assert "healthy_range" in history
    api = c.get("/api/definitions/entropy").get_json()
    assert api["version"] == 2 and api["healthy_range"]["low"] == 0.05
    assert api["versions"][0]["author"] == "Ada" and api["versions"][0]["changed_fields"] == ["healthy_range"]
    # Saving the same values again records nothing.
    again = c.post("/dictionary/entropy/edit", data=dict(fields, csrf_token=token))
    assert again.status_code == 302
    assert "Nothing changed" in text(c.get(again.headers["Location"]))
    assert c.get("/api/definitions/entropy").get_json()["version"] == 2


def test_metric_columns_cover_every_framework_on_the_page():
    from registry.store.table_columns import pick_metric_columns

    defs = {
        "episode_return_mean": {"quantity": "return", "layer": "objective"},
        "reward_format_mean": {"quantity": "reward", "layer": "objective"},
        "reward_sequence_mean": {"quantity": "reward", "layer": "objective"},
        "kl_old_mean": {"quantity": "kl", "layer": "constraint"},
        "entropy": {"quantity": "entropy", "layer": "constraint"},
    }
    last = {
        "sb3": {"episode_return_mean": {}, "kl_old_mean": {}, "entropy": {}},
        "verl": {"reward_format_mean": {}, "reward_sequence_mean": {}, "kl_old_mean": {}, "entropy": {}},
    }
    assert set(pick_metric_columns(last, defs)) == {"episode_return_mean", "reward_sequence_mean", "kl_old_mean",
                                                    "entropy"}
