"""The diagnosis and similar-runs panels in a real headless Chromium (Selenium), on the real SB3 runs.

Reuses the browser fixture and helpers of ``test_browser`` (skipped, or failing under CI, the same way).
"""
from __future__ import annotations

import pytest
import test_browser  # skips this module too when there is no chromedriver (outside CI)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from test_browser import no_console_errors, serve, wait
from test_web_panels import register_sb3
from test_web_support import fill_registry

from registry import open_registry
from registry.web.app import create_app

browser = test_browser.browser  # the module-scoped headless Chromium fixture


@pytest.fixture(scope="module")
def panel_site(tmp_path_factory):
    from conftest import SB3_RUNS

    if not SB3_RUNS.is_dir():
        pytest.skip("shared SB3 runs not present")
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('browser-panels') / 'registry.db.engine'}")
    ids = fill_registry(reg)
    ids.update(register_sb3(reg, SB3_RUNS))
    with serve(create_app({"REGISTRY": reg, "SECRET_KEY": "browser-panels"})) as url:
        yield url, ids
    reg.close()


def test_lr_too_high_dashboard_shows_the_kl_spike_and_similar_runs_with_an_overlay(panel_site, browser):
    base, ids = panel_site
    browser.get(f"{base}/runs/{ids['cartpole_lr_too_high_5e-2']}")
    panel = wait(browser).until(EC.visibility_of_element_located((By.ID, "diagnosis-panel")))
    assert "problems, worst critical" in panel.find_element(By.CSS_SELECTOR, ".verdict-pill").text
    spike = panel.find_element(By.CSS_SELECTOR, "li.finding[data-detector='kl_spike']")
    assert spike.is_displayed() and "KL spike" in spike.text and "step 4,096" in spike.text and "5.98" in spike.text
    rollback = panel.find_element(By.ID, "diagnosis-rollback")
    assert "step 2,048" in rollback.text
    reading = panel.find_element(By.CSS_SELECTOR, "#joint-readings li[data-kind='trust_region']")
    assert "trust region" in reading.text and "lower learning_rate towards 0.0003" in reading.text

    # The finding links to the KL plot, which is shaded: it loads, and its card is flagged critical.
    spike.find_element(By.CSS_SELECTOR, "a.metric-link").click()
    wait(browser).until(lambda d: d.execute_script("return location.hash") == "#plot-kl_old_mean")
    card = browser.find_element(By.ID, "plot-kl_old_mean")
    assert "flag-critical" in card.get_attribute("class")
    assert "KL spike" in card.find_element(By.CSS_SELECTOR, ".card-flag").text
    assert browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return r.top >= -5 && r.top < window.innerHeight;", card)
    wait(browser).until(lambda d: test_browser.plots_drawn(d, "#plot-kl_old_mean"))
    # The finding's steps are shaded on the interactive plot.
    assert browser.execute_script(
        "return RLPlots.plots.filter(p => p.el.closest('#plot-kl_old_mean'))[0].gd.layout.shapes"
        ".some(s => s.xref === 'x' && s.x1 > s.x0)")

    similar = browser.find_element(By.ID, "similar-panel")
    browser.execute_script("arguments[0].scrollIntoView()", similar)
    rows = similar.find_elements(By.CSS_SELECTOR, "#neighbours tbody tr")
    assert len(rows) >= 5
    names = [r.find_element(By.CSS_SELECTOR, "td.name a").text for r in rows]
    assert "cartpole_tiny_lr_1e-6" in names and "cartpole_lr_too_high_5e-2" not in names
    assert "nearest runs" in similar.find_element(By.ID, "similar-summary").text
    excluded = similar.find_element(By.ID, "similar-excluded").text
    assert "Not compared on kl_old_mean (KL estimator: k3 vs k1)" in excluded and "cleanrl-cartpole" in excluded
    wait(browser).until(lambda d: test_browser.plots_drawn(d, "#similar-overlay"))
    # Interactive: this run and its neighbours, each a legend entry.
    assert browser.execute_script(
        "return RLPlots.byKey('similar-overlay').gd.data.filter(t => t.showlegend !== false).length") >= 5

    # The panel's form: three neighbours of the same task over the first half of training.
    k = similar.find_element(By.NAME, "sim_k")
    k.clear()
    k.send_keys("3")
    similar.find_element(By.NAME, "sim_prefix").send_keys("50%")
    similar.find_element(By.NAME, "sim_same_task").click()
    similar.find_element(By.CSS_SELECTOR, "#similar-form button[type=submit]").click()
    wait(browser).until(lambda d: test_browser.text_present(d, "similar-panel", "first 50% of training"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#neighbours tbody tr")
    assert len(rows) == 3
    assert "pendulum_default_s0" not in browser.find_element(By.ID, "neighbours").text
    browser.execute_script("document.getElementById('similar-overlay').scrollIntoView()")
    wait(browser).until(lambda d: test_browser.plots_drawn(d, "#similar-overlay"))

    # Where else did the middle of this run happen? A window matched anywhere in the others.
    similar = browser.find_element(By.ID, "similar-panel")
    match = similar.find_element(By.NAME, "sim_prefix")
    match.clear()
    match.send_keys("25%-50%")
    similar.find_element(By.NAME, "sim_anywhere").click()
    similar.find_element(By.CSS_SELECTOR, "#similar-form button[type=submit]").click()
    wait(browser).until(lambda d: test_browser.text_present(d, "similar-panel", "anywhere in each run"))
    cells = browser.find_elements(By.CSS_SELECTOR, "#neighbours td.matched")
    assert len(cells) == 3 and all(c.text.startswith("steps ") for c in cells)
    assert browser.find_element(By.NAME, "sim_anywhere").is_selected()
    # the overlay draws each run over its matched window
    browser.execute_script("document.getElementById('similar-overlay').scrollIntoView()")
    wait(browser).until(lambda d: test_browser.plots_drawn(d, "#similar-overlay"))
    overlay = browser.find_element(By.CSS_SELECTOR, "#similar-overlay .iplot")
    assert overlay.get_attribute("data-api").count("win=") == 4
    assert "fraction of the matched window" in browser.find_element(By.ID, "similar-overlay").text
    no_console_errors(browser)


def test_runs_page_findings_column_and_baseline_link(panel_site, browser):
    base, ids = panel_site
    browser.get(base + "/")
    cell = browser.find_element(By.CSS_SELECTOR, f"input.run-select[value='{ids['cartpole_lr_too_high_5e-2']}']") \
        .find_element(By.XPATH, "ancestor::tr").find_element(By.CSS_SELECTOR, "td.findings")
    assert cell.get_attribute("data-severity") == "critical" and cell.text.startswith("critical")
    assert "[CRITICAL] kl_spike kl_old_mean step 4096" in cell.get_attribute("title")
    cell.find_element(By.TAG_NAME, "a").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "diagnosis-panel")))
    browser.find_element(By.ID, "baseline-link").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "build-baseline")))
    assert "No health baseline for CartPole-v1 yet" in browser.find_element(By.ID, "no-baseline").text
    no_console_errors(browser)
