"""Dashboard panels (diagnosis, similar runs), findings on the plots and in the runs table, health baselines.

Mostly on the real stable-baselines3 runs in ``../shared/data/sb3_ppo`` (registered through the
real importer) next to the synthetic fixture runs of ``test_web_support``; the tests that write
(findings rows, baselines, streaming) run on SQLite and on PostgreSQL.
"""
from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from sqlalchemy import delete, select
from test_web_support import check_response, fill_registry

from registry import Registry, open_registry
from registry.analysis import health
from registry.cli.main import cli
from registry.analysis.health import current_findings, diagnose_run, findings_for_runs
from registry.db.models import RunFindings
from registry.web import panels, plots
from registry.web.app import create_app

SB3_NAMES = ("cartpole_healthy_s0", "cartpole_lr_too_high_5e-2", "cartpole_tiny_lr_1e-6", "pendulum_default_s0")
CRITICAL_STRIP = (0xC5, 0x22, 0x1F)


def register_sb3(reg: Registry, sb3_runs: Path) -> dict[str, str]:
    ids = {}
    for name in SB3_NAMES:
        ids[name] = reg.register(sb3_runs / name, project="sb3", algorithm="PPO").run_id
    reg.set_outcome(ids["cartpole_healthy_s0"], verdict="success", scores={"final_return": 495.0})
    reg.set_outcome(ids["cartpole_lr_too_high_5e-2"], verdict="diverged", scores={"final_return": 9.4},
                    checkpoints=[(2048, "s3://ckpt/lr/2048"), (51200, "s3://ckpt/lr/51200")])
    return ids


def make_app(reg: Registry, **config):
    return create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "panels", "PLOT_REF_TTL": 0, **config})


def text(response) -> str:
    return response.get_data(as_text=True)


def section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start:page.index("</section>", start)]


def strip_pixels(png: bytes, rgb: tuple[int, int, int] = CRITICAL_STRIP, tol: int = 12) -> int:
    """Pixels of the findings strip colour in a rendered plot."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int((np.abs(img - np.array(rgb)).max(axis=2) <= tol).sum())


@pytest.fixture(scope="module")
def shared(tmp_path_factory, sb3_runs_dir):
    """One SQLite registry with the SB3 runs and the fixture runs, for the read-only tests."""
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('panels') / 'registry.db.engine'}")
    ids = fill_registry(reg, n=40)
    ids.update(register_sb3(reg, sb3_runs_dir))
    yield reg, ids
    reg.close()


@pytest.fixture(scope="module")
def sb3_runs_dir():
    from conftest import SB3_RUNS

    if not SB3_RUNS.is_dir():
        pytest.skip("shared SB3 runs not present")
    return SB3_RUNS


@pytest.fixture
def client(shared):
    reg, _ = shared
    return make_app(reg, WTF_CSRF_ENABLED=False).test_client()


@pytest.fixture
def ids(shared):
    return shared[1]


@pytest.fixture
def fresh(db_url, sb3_runs):
    """A registry of its own on SQLite and on PostgreSQL: SB3 runs plus the fixture runs."""
    reg = open_registry(db_url)
    ids = fill_registry(reg, n=40)
    ids.update(register_sb3(reg, sb3_runs))
    yield reg, ids
    reg.close()


# --- diagnosis panel and shaded plots --------------------------------------------------------


def test_lr_too_high_dashboard_shows_the_kl_spike_in_triage_order_with_rollback(client, ids):
    page = text(client.get(f"/runs/{ids['cartpole_lr_too_high_5e-2']}"))
    panel = section(page, "diagnosis-panel")
    assert 'data-worst="critical"' in panel
    spike = re.search(r'<li class="finding sev-line-critical" data-detector="kl_spike" data-metric="kl_old_mean"'
                      r'[^>]*>(.*?)</li>',
                      panel, re.DOTALL)
    assert spike, panel[:3000]
    assert "KL spike" in spike.group(1) and "step 4,096" in spike.group(1) and "5.98" in spike.group(1)
    assert 'href="#plot-kl_old_mean"' in spike.group(1)
    # Triage order: constraint findings before the objective one, the rollback last, naming the checkpoint.
    detectors = re.findall(r'data-detector="([a-z_]+)"', panel)
    assert detectors.index("kl_spike") < detectors.index("reward_drop")
    layers = re.findall(r'<span class="layer-tag layer-([a-z]+)">', panel)
    order = {"diagnostic": 0, "constraint": 1, "objective": 2, "comparison": 3}
    assert [order[x] for x in layers] == sorted(order[x] for x in layers)
    rollback = panel[panel.index('id="diagnosis-rollback"'):]
    assert "Roll back to the checkpoint at step 2,048" in rollback and "s3://ckpt/lr/2048" in rollback
    assert panel.index('data-detector="reward_drop"') < panel.index('id="diagnosis-rollback"')
    # Joint readings with interpretation and action.
    joint = panel[panel.index('id="joint-readings"'):]
    assert 'data-kind="trust_region"' in joint and "update leaving the trust region" in joint
    assert "lower learning_rate towards 0.0003" in joint  # the run logs learning_rate = 0.05
    # The affected plot card carries the anchor and the severity mark.
    card = re.search(r'<div id="plot-kl_old_mean" class="anchor flag-critical"', page)
    assert card, "the KL card is the anchor of the finding"
    assert "No health baseline for CartPole-v1 yet" in panel


def test_kl_plot_of_lr_too_high_is_shaded_and_healthy_is_not(client, ids):
    bad = client.get(f"/plots/run/{ids['cartpole_lr_too_high_5e-2']}?key=train/approx_kl")
    good = client.get(f"/plots/run/{ids['cartpole_healthy_s0']}?key=train/approx_kl")
    assert bad.status_code == good.status_code == 200
    assert strip_pixels(bad.data) > 10          # the critical strip above the spike at step 4,096
    assert strip_pixels(good.data) == 0
    found = current_findings(client.application.extensions["rlregistry"], ids["cartpole_lr_too_high_5e-2"])
    assert (4096, 4096, "critical", "kl_spike") in found.spans("kl_old_mean")
    assert found.spans("learning_rate") == []


def test_healthy_dashboard_has_no_problem_and_no_flagged_card(client, ids):
    page = text(client.get(f"/runs/{ids['cartpole_healthy_s0']}"))
    panel = section(page, "diagnosis-panel")
    assert 'data-problems="0"' in panel and "no problems found" in panel
    assert 'id="diagnosis-clear"' in panel and 'data-detector=' not in panel
    assert "informational note" in panel  # reward std at 0 once every episode hits the cap: harmless, said so
    assert "flag-critical" not in page and "flag-warning" not in page
    assert '<details class="layer layer-diagnostic" id="layer-diagnostic">' in page  # nothing to open it for


def test_plot_key_changes_when_the_diagnosis_changes(fresh):
    reg, ids = fresh
    c = make_app(reg).test_client()
    url = f"/plots/run/{ids['cartpole_lr_too_high_5e-2']}?key=train/entropy_loss"
    first = c.get(url)
    assert first.status_code == 200
    etag = first.headers["ETag"]
    assert c.get(url, headers={"If-None-Match": etag}).status_code == 304
    # A baseline for the task changes the diagnosis (entropy now also deviates from the healthy band)
    # without touching the run's points or the dictionary: the picture, and its key, change. (The
    # healthy run's curves stand in for three healthy runs: a weak baseline would only add info.)
    from registry.analysis.diagnosis import build_baseline
    from registry.analysis.baselines import save_baseline
    from registry.analysis.inputs import run_curves as _curves

    healthy = _curves(reg, ids["cartpole_healthy_s0"])
    save_baseline(reg, build_baseline("CartPole-v1", [healthy] * 3), [ids["cartpole_healthy_s0"]], "tester")
    second = c.get(url, headers={"If-None-Match": etag})
    assert second.status_code == 200 and second.headers["ETag"] != etag
    assert second.headers["X-Plot-Cache"] == "miss"
    spans = current_findings(reg, ids["cartpole_lr_too_high_5e-2"]).spans("entropy")
    assert any(det == "baseline_deviation" for *_, det in spans)


def test_diagnosis_of_a_run_still_training_covers_what_has_arrived(fresh):
    reg, ids = fresh
    src = ids["cartpole_lr_too_high_5e-2"]
    detail = reg.run_detail(src)
    handle = reg.create_run("lr-high-live", project="sb3", algorithm="PPO", framework="stable-baselines3",
                            task="CartPole-v1", params={"learning_rate": 0.05, "total_timesteps": 100000})
    for s in detail["series"]:
        data = reg.read_series(src, s["key"])
        keep = data.steps <= 40960
        handle.log_series(s["key"], data.steps[keep], data.values[keep])
    c = make_app(reg).test_client()
    runs_before = text(c.get("/runs", query_string={"q": 'name="lr-high-live"'}))
    assert 'data-state="fresh"' in runs_before  # the page diagnosed it within its budget
    page = text(c.get(f"/runs/{handle.id}"))
    panel = section(page, "diagnosis-panel")
    assert 'id="diagnosis-running"' in panel and "up to step 40,960" in panel
    assert 'data-detector="kl_spike"' in panel
    with reg.read() as session:
        row = session.get(RunFindings, handle.id)
        assert row.last_step == 40960 and row.data_version == reg.run_detail(handle.id)["data_version"]
    # New points make the stored row stale; the next read diagnoses again.
    data = reg.read_series(src, "train/approx_kl")
    later = data.steps > 40960
    handle.log_series("train/approx_kl", data.steps[later][:5], data.values[later][:5])
    assert current_findings(reg, handle.id).last_step > 40960
    # Similar runs of a running run: matched on the prefix it has, outcomes are how the others ended.
    similar = section(page, "similar-panel")
    assert "Still training" in similar and "(running run)" in similar
    handle.finish()
    with reg.read() as session:
        assert session.get(RunFindings, handle.id).data_version == reg.run_detail(handle.id)["data_version"]


# --- findings column -----------------------------------------------------------------------


def findings_cells(page: str) -> dict[str, dict[str, str]]:
    out = {}
    for row in re.findall(r'<tr>\s*<td class="select">(.*?)</tr>', page, re.DOTALL):
        name = re.search(r'<td class="name"><a [^>]*>([^<]+)</a>', row).group(1)
        cell = re.search(r'<td class="nowrap findings findings-(\w+)" title="([^"]*)" data-state="(\w+)"'
                         r'(?: data-severity="(\w+)")?>(.*?)</td>', row, re.DOTALL)
        label = re.sub(r"<[^>]+>", "", cell.group(5)).strip()
        out[name] = {"state": cell.group(3), "severity": cell.group(4), "title": html.unescape(cell.group(2)),
                     "label": html.unescape(label)}
    return out


def test_findings_column_agrees_with_rlreg_diagnose(fresh, db_url):
    reg, ids = fresh
    page = text(make_app(reg, FINDINGS_REFRESH_BUDGET_MS=60000).test_client().get("/runs?size=50"))
    cells = findings_cells(page)
    runner = CliRunner()
    for run_id in ids.values():
        run_name = reg.run_detail(run_id)["name"]
        out = runner.invoke(cli, ["--db", db_url, "diagnose", run_id, "--json"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        cli_diag = json.loads(out.output)
        problems = [f for f in cli_diag["findings"] if f["severity"] in ("warning", "critical")]
        cell = cells[run_name]
        assert cell["state"] == "fresh", (run_name, cell)
        if problems:
            assert cell["severity"] == cli_diag["worst_severity"]
            assert cell["label"].startswith(cli_diag["worst_severity"]) and cell["label"].endswith(f"{len(problems)}")
        else:
            assert cell["severity"] == "ok" and cell["label"] == "ok"
        for f in cli_diag["findings"]:  # the title lists every finding's one-liner
            assert f["summary"] in cell["title"]
    assert cells["cartpole_lr_too_high_5e-2"]["label"] == "critical \u00b7 5"
    assert cells["cartpole_healthy_s0"]["label"] == "ok"


def test_findings_column_recomputes_a_few_stale_rows_per_request_and_says_so(fresh):
    reg, ids = fresh
    app = make_app(reg, FINDINGS_REFRESH_PER_REQUEST=1, FINDINGS_REFRESH_BUDGET_MS=60000)
    c = app.test_client()
    current_findings(reg, ids["cartpole_lr_too_high_5e-2"])  # fresh again after its outcome was set
    never = [ids["cartpole_tiny_lr_1e-6"], ids["pendulum_default_s0"]]
    with reg.transaction() as session:
        session.execute(delete(RunFindings).where(RunFindings.run_id.in_(never)))
    health._RECENT.clear()  # forget what this process computed: as if another process had registered them
    reg.set_outcome(ids["cartpole_healthy_s0"], notes="new data version: the stored row is now stale")
    first = findings_cells(text(c.get("/runs?project=sb3")))
    states = sorted(cell["state"] for cell in first.values())
    # One row recomputed (a missing one first), the other missing one and the stale one reported as they are.
    assert states == ["fresh", "fresh", "missing", "stale"], first
    assert first["cartpole_healthy_s0"]["state"] == "stale"
    assert "as diagnosed earlier" in first["cartpole_healthy_s0"]["title"]
    missing = next(n for n, cell in first.items() if cell["state"] == "missing")
    assert first[missing]["label"] == "not yet diagnosed"
    second = findings_cells(text(c.get("/runs?project=sb3")))
    assert sorted(cell["state"] for cell in second.values()) == ["fresh", "fresh", "fresh", "stale"]
    third = findings_cells(text(c.get("/runs?project=sb3")))
    assert all(cell["state"] == "fresh" for cell in third.values())
    with reg.read() as session:
        stored = {r.run_id for r in session.scalars(select(RunFindings))}
    assert set(never) <= stored


def test_store_diagnoses_on_registration_and_finish_and_never_fails_a_registration(sqlite_url, sb3_runs, monkeypatch):
    reg = open_registry(sqlite_url)
    run_id = reg.register(sb3_runs / "cartpole_lr_too_high_5e-2", algorithm="PPO").run_id
    with reg.read() as session:
        row = session.get(RunFindings, run_id)
        assert row is not None and row.worst_severity == "critical" and row.n_critical >= 3
        assert row.diagnosis["findings"] == diagnose_run(reg, run_id).to_dict()["findings"]
    assert findings_for_runs(reg, reg.list_runs()[0])[run_id].state == "fresh"
    def broken(*args, **kwargs):
        raise RuntimeError("detector bug")

    monkeypatch.setattr(reg.hooks, "run_committed", [broken])  # the diagnosis subscriber fails
    other = reg.register(sb3_runs / "cartpole_healthy_s0", algorithm="PPO").run_id  # still registered
    with reg.read() as session:
        assert session.get(RunFindings, other) is None
    monkeypatch.undo()
    health._RECENT.clear()
    assert findings_for_runs(reg, reg.list_runs()[0])[other].state == "fresh"  # diagnosed on the next read
    reg.close()


# --- similar runs panel ---------------------------------------------------------------------


def test_similar_panel_lists_neighbours_overlay_and_excluded_semantics(client, ids):
    page = text(client.get(f"/runs/{ids['cartpole_lr_too_high_5e-2']}"))
    panel = section(page, "similar-panel")
    rows = re.findall(r'<tr data-run="([0-9a-f]+)">', panel)
    assert len(rows) >= 5 and ids["cartpole_lr_too_high_5e-2"] not in rows
    assert ids["cartpole_tiny_lr_1e-6"] in rows and ids["cleanrl"] in rows
    summary = re.search(r'id="similar-summary"><strong>([^<]+)</strong>', panel).group(1)
    assert re.match(r"\d+ of the \d+ nearest runs", html.unescape(summary))
    assert "<code>learning_rate</code> 0.05" in panel  # the key hyperparameter difference
    excluded = panel[panel.index('id="similar-excluded"'):]
    assert "Not compared on <code>kl_old_mean</code> (KL estimator: k3 vs k1)" in excluded
    assert ">cleanrl-cartpole</a>" in excluded
    img = html.unescape(re.search(r'<img class="plot overlay" src="([^"]+)"', panel).group(1))
    assert "metric=episode_return_mean" in img and img.count("run=") == 6
    r = client.get(img)
    assert r.status_code == 200 and r.data[:4] == b"\x89PNG"
    link = html.unescape(re.search(r'id="overlay-link" href="([^"]+)"', panel).group(1))
    assert link.startswith("/compare?") and link.count("run=") == len(rows) + 1
    assert client.get(link).status_code == 200


def test_similar_panel_form_options(client, ids):
    base = f"/runs/{ids['cartpole_lr_too_high_5e-2']}?sim=1"
    two = section(text(client.get(base + "&sim_k=2")), "similar-panel")
    assert len(re.findall(r"<tr data-run=", two)) == 2
    prefix = section(text(client.get(base + "&sim_prefix=25%25")), "similar-panel")
    assert "matching the first 25% of training" in prefix and 'value="25%"' in prefix
    same = section(text(client.get(base + "&sim_same_task=1")), "similar-panel")
    assert ids["pendulum_default_s0"] not in same and ids["cartpole_healthy_s0"] in same
    entropy_only = section(text(client.get(base + "&sim_metrics=entropy")), "similar-panel")
    assert "on entropy" in entropy_only
    bad = client.get(base + "&sim_metrics=nonsense")
    assert bad.status_code == 200  # a bad panel option never breaks the dashboard
    assert "run has no metric &#39;nonsense&#39;" in section(text(bad), "similar-panel")
    assert "k must be between" in section(text(client.get(base + "&sim_k=0")), "similar-panel")


def test_similar_panel_window_matched_anywhere(client, ids):
    base = f"/runs/{ids['cartpole_lr_too_high_5e-2']}?sim=1&sim_prefix=20%25-60%25"
    same = section(text(client.get(base)), "similar-panel")
    assert "matching training 20%-60%" in same and "Matched at" not in same
    anywhere = section(text(client.get(base + "&sim_anywhere=1")), "similar-panel")
    assert "training 20%-60%, anywhere in each run" in anywhere and "Matched at" in anywhere
    assert 'name="sim_anywhere" value="1" checked' in anywhere
    cells = re.findall(r'<td class="matched">([^<]+)</td>', anywhere)
    assert cells and all(re.match(r"steps [\d,]+\u2013[\d,]+ \(\d+%\)", html.unescape(c)) for c in cells)
    api = html.unescape(re.search(r'<a href="(/api/runs/[^"]+/similar[^"]*)">JSON</a>', anywhere).group(1))
    assert "window=0.2%2C0.6" in api and "anywhere=1" in api
    data = client.get(api).get_json()
    assert data["query"]["anywhere"] is True
    rows = re.findall(r'<tr data-run="([0-9a-f]+)">', anywhere)
    assert [n["run_id"] for n in data["neighbours"]] == rows
    # the overlay lays each neighbour's matched window over the query's window
    assert "fraction of the matched window" in anywhere
    img = html.unescape(re.search(r'<img class="plot overlay" src="([^"]+)"', anywhere).group(1))
    metric = parse_qs(urlsplit(img).query)["metric"][0]
    wins = {w.split(":")[0]: [int(b) for b in w.split(":")[1:]] for w in parse_qs(urlsplit(img).query)["win"]}
    query_span = data["query"]["compared_steps"][metric]
    assert wins[data["query"]["run_id"]] == query_span and 0 < query_span[0] < query_span[1]
    shown = parse_qs(urlsplit(img).query)["run"][1:]
    assert shown and all(wins[r] == next(n["compared_steps"][metric] for n in data["neighbours"] if n["run_id"] == r)
                         for r in shown)
    assert client.get(img).status_code == 200
    points = client.get(img.replace("/plots/compare?", "/plots/compare/data.json?")).get_json()
    for r, (lo, hi) in wins.items():
        steps = [st for rid, st in zip(points["run_id"], points["step"]) if rid == r]
        assert steps and lo <= min(steps) and max(steps) <= hi
    assert all(-1e-9 <= x <= 1 + 1e-9 for x in points["x"])
    broken = client.get(img + "&win=" + quote(f"{shown[0]}:900:100"))
    assert broken.status_code == 400 and "win must be RUN:FIRST_STEP:LAST_STEP" in text(broken)
    bad = section(text(client.get(base.replace("20%25-60%25", "20%25-") + "&sim_anywhere=1")), "similar-panel")
    assert "must be a prefix (25%, 2000) or a window START-END" in html.unescape(bad)
    whole = section(text(client.get(f"/runs/{ids['cartpole_lr_too_high_5e-2']}?sim=1&sim_anywhere=1")),
                    "similar-panel")
    assert "anywhere needs a window or a prefix" in html.unescape(whole)


# --- health baselines -----------------------------------------------------------------------


def csrf_token(page: str) -> str:
    return re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)


def _login(client, username: str, password: str) -> None:
    token = csrf_token(text(client.get("/login")))
    assert client.post("/login",
                       data={"username": username, "password": password, "csrf_token": token}).status_code == 302


def _logout(client) -> None:
    token = re.search(r'id="logout-form">\s*<input type="hidden" name="csrf_token" value="([^"]+)"',
                      text(client.get("/runs"))).group(1)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302


def test_baseline_writes_need_a_login(fresh):
    reg, _ = fresh
    c = make_app(reg).test_client()
    assert c.post("/baselines/CartPole-v1/build", data={}).status_code == 302  # to the login page
    assert c.get("/baselines/CartPole-v1/metrics/kl_old_mean/edit").status_code == 302


def test_baseline_page_builds_from_a_healthy_run_and_records_a_band_edit(fresh):
    from registry.store.auth import create_user

    reg, ids = fresh
    c = make_app(reg).test_client()  # CSRF on
    create_user(reg, "Ada", "analytical-engine")
    create_user(reg, "Grace", "compiler-first")
    _login(c, "Ada", "analytical-engine")
    healthy, bad = ids["cartpole_healthy_s0"], ids["cartpole_lr_too_high_5e-2"]
    dash = text(c.get(f"/runs/{bad}"))
    assert 'id="baseline-link" href="/baselines/CartPole-v1"' in dash and "no baseline for CartPole-v1 yet" in dash
    page = text(c.get("/baselines/CartPole-v1"))
    assert 'id="no-baseline"' in page
    # The healthy runs of the task are ticked by default.
    assert re.search(rf'<input checked id="runs-\d+" name="runs" type="checkbox" value="{healthy}">', page)
    assert not re.search(rf'<input checked[^>]*value="{bad}">', page)
    token = csrf_token(page)
    form = {"runs": [healthy], "author": "Ada", "note": "from the healthy seed"}
    # One healthy run is refused unless a weak baseline is accepted explicitly.
    refused = c.post("/baselines/CartPole-v1/build", data={**form, "csrf_token": token})
    assert refused.status_code == 400 and "at least 3" in text(refused)
    form["allow_weak"] = "y"
    assert c.post("/baselines/CartPole-v1/build", data=form).status_code == 400  # no CSRF token
    assert c.post("/baselines/CartPole-v1/build", data={"author": "Ada", "csrf_token": token}).status_code == 400
    response = c.post("/baselines/CartPole-v1/build", data={**form, "csrf_token": token})
    assert response.status_code == 302, text(response)[:2000]
    page = text(c.get(response.headers["Location"]))
    assert "Built the CartPole-v1 baseline" in page
    table = section(page, "baseline")
    row = re.search(r'<tr id="metric-kl_old_mean".*?</tr>', table, re.DOTALL).group(0)
    assert re.search(r'class="nowrap early"><span class="band-range">[0-9.e-]+ &ndash; [0-9.e-]+</span>', row)
    assert re.search(r'class="nowrap late"><span class="band-range">[0-9.e-]+ &ndash; [0-9.e-]+</span>', row)
    assert "kl_old_mean outside the band of 1 healthy CartPole-v1 run(s)" in row
    assert f'href="/runs/{healthy}">cartpole_healthy_s0</a>' in table  # source runs
    assert "last change by <strong>Ada</strong>" in page
    # Edit one band: recorded with author, note and the values before and after.
    _logout(c)
    _login(c, "Grace", "compiler-first")
    edit = text(c.get("/baselines/CartPole-v1/metrics/kl_old_mean/edit"))
    fields = dict(re.findall(r'<input[^>]*name="([a-z_]+)"[^>]*value="([^"]*)"', edit))
    fields["warning"] = html.unescape(re.search(r'<textarea[^>]*name="warning"[^>]*>\s*(.*?)</textarea>',
                                                edit, re.DOTALL).group(1))
    bad_form = dict(fields, mid_low="0.5", mid_high="0.1", author="Grace")
    assert c.post("/baselines/CartPole-v1/metrics/kl_old_mean/edit", data=bad_form).status_code == 400
    one_side = dict(fields, mid_low="", author="Grace")
    assert "give both bounds" in text(c.post("/baselines/CartPole-v1/metrics/kl_old_mean/edit", data=one_side))
    good = dict(fields, mid_high="0.03", author="Grace", note="SB3 KL above 0.03 mid-run is too big a step")
    response = c.post("/baselines/CartPole-v1/metrics/kl_old_mean/edit", data=good)
    assert response.status_code == 302, text(response)[:2000]
    page = text(c.get(response.headers["Location"]))
    assert "Saved kl_old_mean: mid changed by Grace." in page
    row = re.search(r'<tr id="metric-kl_old_mean" data-metric="kl_old_mean" class="edited">.*?</tr>',
                    page, re.DOTALL).group(0)
    assert "0.03</span>" in row and "edited by Grace" in row
    history = section(page, "baseline-history")
    assert "Grace" in history and "too big a step" in history and "&rarr;" in history
    api = c.get("/api/baselines/CartPole-v1").get_json()
    assert api["metrics"]["kl_old_mean"]["mid"]["high"] == 0.03 and api["updated_by"] == "Grace"
    assert [h["action"] for h in api["history"]] == ["build", "edit"]
    assert api["history"][1]["changes"]["mid"][1][1] == 0.03
    # The late band (where the healthy runs ended) is edited the same way.
    edit = text(c.get("/baselines/CartPole-v1/metrics/kl_old_mean/edit"))
    assert re.search(r"<legend>Late <span[^>]*>from step [0-9,]+ to the end", edit)
    late = dict(good, late_low="0.001", late_high="0.02", note="late steps stay small")
    assert c.post("/baselines/CartPole-v1/metrics/kl_old_mean/edit", data=late).status_code == 302
    api = c.get("/api/baselines/CartPole-v1").get_json()
    assert api["metrics"]["kl_old_mean"]["late"]["high"] == 0.02 and api["history"][-1]["changes"]["late"][1] == \
        [0.001, 0.02]
    # The diagnosis of the task's runs now compares with it: the dashboard says so, the column follows.
    dash = text(c.get(f"/runs/{bad}"))
    assert "compared with baseline of CartPole-v1" in dash
    # Built from one run, it is a weak baseline: said so, and its deviations are notes, not problems.
    panel = section(dash, "diagnosis-panel")
    assert 'id="diagnosis-baseline-note">weak baseline (n=1)' in panel
    assert 'id="baseline-findings"' not in panel and "weak baseline (n=1))" in panel
    # Rebuilding keeps the hand edit unless told otherwise.
    _logout(c)
    _login(c, "Ada", "analytical-engine")
    token = csrf_token(text(c.get("/baselines/CartPole-v1")))
    c.post("/baselines/CartPole-v1/build",
           data={"runs": [healthy], "author": "Ada", "keep_edits": "y", "allow_weak": "y", "csrf_token": token})
    assert c.get("/api/baselines/CartPole-v1").get_json()["metrics"]["kl_old_mean"]["mid"]["high"] == 0.03
    c.post("/baselines/CartPole-v1/build", data={"runs": [healthy], "author": "Ada", "allow_weak": "y",
                                                 "csrf_token": token})
    assert c.get("/api/baselines/CartPole-v1").get_json()["metrics"]["kl_old_mean"]["mid"]["high"] != 0.03
    assert c.get("/baselines/CartPole-v1/metrics/nope/edit").status_code == 404
    index = text(c.get("/baselines"))
    assert 'href="/baselines/CartPole-v1"' in index and 'href="/baselines/Pendulum-v1"' in index


# --- JSON API -------------------------------------------------------------------------------


def validated(client, openapi, url: str, status: int = 200, **query):
    response = client.get(url, query_string=query or None)
    assert response.status_code == status, text(response)[:1000]
    check_response(openapi, response, url, query_string=query or None)
    return response.get_json()


def test_api_diagnosis_similar_and_baselines_match_the_spec(client, ids, openapi):
    run = ids["cartpole_lr_too_high_5e-2"]
    diag = validated(client, openapi, f"/api/runs/{run}/diagnosis")
    assert diag["worst_severity"] == "critical" and diag["run_id"] == run
    assert any(f["detector"] == "kl_spike" and f["start"] == 4096 for f in diag["findings"])
    assert diag["triage"][-1]["layer"] == "rollback" and diag["rollback_step"] == 2048
    by_name = validated(client, openapi, "/api/runs/cartpole_healthy_s0/diagnosis")
    assert by_name["healthy"] is True
    similar = validated(client, openapi, f"/api/runs/{run}/similar", metrics="reward,kl", prefix="0.5", k="3",
                        align="step", same_task="true")
    assert len(similar["neighbours"]) == 3 and similar["metrics"] == ["episode_return_mean", "kl_old_mean"]
    assert all(n["task"] == "CartPole-v1" for n in similar["neighbours"])
    assert similar["query"]["align"] == "step"
    whole = validated(client, openapi, f"/api/runs/{run}/similar")
    assert any(g["reason"] == "semantics" and g["metric"] == "kl_old_mean" for g in whole["excluded"])
    assert "k must be" in validated(client, openapi, f"/api/runs/{run}/similar", 400, k="0")["error"]
    assert "prefix" in validated(client, openapi, f"/api/runs/{run}/similar", 400, prefix="soon")["error"]
    assert "no run" in validated(client, openapi, "/api/runs/nope/diagnosis", 404)["error"]
    assert "no baseline" in validated(client, openapi, "/api/baselines/Acrobot-v1", 404)["error"]
    listing = validated(client, openapi, "/api/baselines")
    assert {"CartPole-v1", "Pendulum-v1", "gsm8k"} <= {b["task"] for b in listing["baselines"]}


def test_api_baseline_matches_the_spec(fresh, openapi):
    reg, ids = fresh
    from registry.analysis.baselines import build_task_baseline

    build_task_baseline(reg, "CartPole-v1", [ids["cartpole_healthy_s0"]], author="Ada", allow_weak=True)
    c = make_app(reg).test_client()
    body = validated(c, openapi, "/api/baselines/CartPole-v1")
    assert body["task"] == "CartPole-v1" and body["source_runs"] == [ids["cartpole_healthy_s0"]]
    assert body["metrics"]["kl_old_mean"]["early"]["low"] <= body["metrics"]["kl_old_mean"]["early"]["high"]
    assert body["history"][0]["author"] == "Ada"


def test_runs_page_never_starts_a_diagnosis_its_budget_cannot_afford(fresh):
    reg, _ = fresh
    with reg.transaction() as session:
        session.execute(delete(RunFindings))
    health._RECENT.clear()
    rows, _ = reg.list_runs(project="sb3")
    tight = findings_for_runs(reg, rows, refresh=3, budget_s=0.001)  # under the fixed cost of one diagnosis
    assert {f.state for f in tight.values()} == {"missing"}
    roomy = findings_for_runs(reg, rows, refresh=3, budget_s=60)
    assert sorted(f.state for f in roomy.values()) == ["fresh", "fresh", "fresh", "missing"]


def test_similar_runs_of_a_run_still_training_with_a_planned_length(fresh, openapi):
    """SB3 logs rollout/* from step 2,048 and train/* from 4,096: the prefix is still cut as one fraction
    of the planned 100,000 steps for every metric, and the panel says the run is still training."""
    reg, ids = fresh
    src = ids["cartpole_lr_too_high_5e-2"]
    handle = reg.create_run("lr-high-early", project="sb3", algorithm="PPO", framework="stable-baselines3",
                            task="CartPole-v1", params={"learning_rate": 0.05, "total_timesteps": 100000})
    for s in reg.run_detail(src)["series"]:
        data = reg.read_series(src, s["key"])
        keep = data.steps <= 30720
        handle.log_series(s["key"], data.steps[keep], data.values[keep])
    c = make_app(reg).test_client()
    panel = section(text(c.get(f"/runs/{handle.id}")), "similar-panel")
    assert 'id="similar-error"' not in panel
    assert "Matching the first 29% of training (running run)" in panel and "went on to" in panel
    assert "matched on what it has logged so far (up to step 30,720)" in panel
    assert re.findall(r'<tr data-run="([0-9a-f]+)">', panel)[0] == src  # its own finished twin, nearest
    body = validated(c, openapi, f"/api/runs/{handle.id}/similar")
    assert body["neighbours"][0]["run_id"] == src and body["neighbours"][0]["verdict"] == "diverged"
    q = body["query"]
    assert q["portion_kind"] == "prefix" and q["status"] == "running" and q["planned_total_steps"] == 100000
    assert q["align"] == "fraction" and abs(q["end"] - 0.2949) < 0.01


def test_a_failing_diagnosis_never_takes_the_dashboard_or_its_plots_down(fresh, monkeypatch):
    reg, ids = fresh
    run = ids["cartpole_lr_too_high_5e-2"]
    reg.set_outcome(run, notes="new data version: nothing stored matches")

    def broken(*args, **kwargs):
        raise RuntimeError("detector bug")

    for module in (panels, plots):  # the dashboard's two readers of the diagnosis
        monkeypatch.setattr(module, "current_findings", broken)
    c = make_app(reg).test_client()
    page = c.get(f"/runs/{run}")
    assert page.status_code == 200
    assert "the diagnosis of this run failed: detector bug" in section(text(page), "diagnosis-panel")
    plot = c.get(f"/plots/run/{run}?key=train/approx_kl")
    assert plot.status_code == 200 and strip_pixels(plot.data) == 0


def test_a_cleanrl_dashboard_says_its_return_was_judged_through_a_windowed_mean(tmp_path):
    """A real CleanRL run logs one return per episode: the panel says the windowed mean was derived, and its
    reward finding (its windowed return fell 408 -> 218 at the end) links to (and shades) the per-episode plot
    the run has."""
    (real,) = (Path(__file__).parent / "data" / "real" / "cleanrl_sweep" / "cartpole_default_s1" / "runs").iterdir()
    reg = open_registry(f"sqlite:///{tmp_path / 'cleanrl.db'}")
    try:
        run_id = reg.register(real).run_id
        app = make_app(reg)
        page = text(app.test_client().get(f"/runs/{run_id}"))
        panel = section(page, "diagnosis-panel")
        derived = html.unescape(panel[panel.index('id="diagnosis-derived"'):])
        assert "episode_return_mean derived from episode_return (one value per finished episode)" in derived
        with app.test_request_context():
            item = panels.diagnosis_panel(reg, reg.run_detail(run_id))
        reward = [i for i in item["triage_items"] if i["metric"] == "episode_return_mean"]
        assert reward and all(i["has_plot"] and i["anchor"] == panels.metric_anchor("episode_return") for i in reward)
        assert "episode_return" in item["spans"] and "episode_return_mean" not in item["spans"]
    finally:
        reg.close()


def test_a_joint_reading_on_a_derived_return_links_to_the_per_episode_plot(tmp_path):
    """A CleanRL-style run (one return per episode) whose return stays flat while its entropy falls: the joint
    reading names the derived windowed return, and its link goes to the per-episode plot the run has."""
    rng = np.random.default_rng(0)
    csv = tmp_path / "flat_cleanrl.csv"
    csv.write_text("step,charts/episodic_return,losses/entropy,losses/clipfrac,losses/approx_kl\n" + "".join(
        f"{512 * i},{20 + rng.normal(0, 2):.3f},{0.69 * (1 - i / 130):.4f},0.02,0.004\n" for i in range(1, 121)))
    reg = open_registry(f"sqlite:///{tmp_path / 'flat.db'}")
    try:
        run_id = reg.register(csv, framework="cleanrl", task="CartPole-v1").run_id
        app = make_app(reg)
        with app.test_request_context():
            item = panels.diagnosis_panel(reg, reg.run_detail(run_id))
        links = [m for j in item["joint"] for m in j["metrics"] if m["name"] == "episode_return_mean"]
        assert links and all(m["has_plot"] and m["anchor"] == panels.metric_anchor("episode_return") for m in links)
    finally:
        reg.close()
