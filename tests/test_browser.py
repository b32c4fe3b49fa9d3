"""The UI in a real headless Chromium (Selenium): filter, open a run, compare, edit a definition.

Skipped only when /usr/bin/chromedriver is missing and CI is not set; under CI a missing
browser is a broken setup and the tests fail.
"""
from __future__ import annotations

import contextlib

import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from registry import open_registry
from registry.web.app import create_app
from test_web_support import fill_registry

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"

if not Path(CHROMEDRIVER).exists() and not os.environ.get("CI"):
    pytest.skip("no /usr/bin/chromedriver (install chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

WAIT = 20


@contextlib.contextmanager
def serve(app):
    """The app on 127.0.0.1 at a random port, in a thread; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The app over a temporary SQLite registry with the fixture runs."""
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('browser') / 'registry.db.engine'}")
    ids = fill_registry(reg)
    from registry.store.auth import create_user

    create_user(reg, "Grace", "flow-matic-1959")
    with serve(create_app({"REGISTRY": reg, "SECRET_KEY": "browser-test"})) as url:
        yield url, ids
    reg.close()


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="rlreg-chrome-")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(arg)
    if Path(CHROMIUM).exists():
        options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait(driver):
    return WebDriverWait(driver, WAIT)


def text_present(driver, element_id: str, text: str) -> bool:
    """The element's text holds ``text``, read in one script: a form that reloads the page can swap the
    document between Selenium's lookup of an element and its read of the text ("Node with given id does
    not belong to the document"), which ``EC.text_to_be_present_in_element`` does not retry."""
    return bool(driver.execute_script(
        "const e = document.getElementById(arguments[0]); return !!e && e.textContent.includes(arguments[1]);",
        element_id, text))


def images_loaded(driver, selector: str) -> bool:
    return driver.execute_script(
        "const imgs = Array.from(document.querySelectorAll(arguments[0]));"
        "return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0);", selector)


def plots_drawn(driver, scope: str) -> bool:
    """Every plot under ``scope`` drawn: interactive plots ready (or their PNGs loaded, on static pages)."""
    return driver.execute_script(
        "const ip = Array.from(document.querySelectorAll(arguments[0] + ' .iplot'));"
        "if (ip.length) return ip.every(e => e.dataset.state === 'ready');"
        "const imgs = Array.from(document.querySelectorAll(arguments[0] + ' img.plot'));"
        "return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0);", scope)


def no_console_errors(driver) -> None:
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # CSP violations and failed loads show up here


def test_filter_open_run_and_see_three_layers(site, browser):
    base, ids = site
    browser.get(base + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")
    assert len(rows) == 5
    box = browser.find_element(By.ID, "filter-q")
    box.send_keys("learning_rate>1e-5 and algorithm=GRPO")
    box.submit()
    wait(browser).until(lambda d: text_present(d, "result-count", "of 1 runs"))
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#runs-table td.name a")]
    assert names == ["grpo-lr5e-5"]

    browser.get(base + "/runs?q=learning_rate%3E%3E")
    error = browser.find_element(By.ID, "filter-error")
    assert error.is_displayed() and "bad filter" in error.text
    browser.get_log("browser")  # the 400 of that page is expected: drain it

    browser.get(base + "/")
    browser.find_element(By.LINK_TEXT, "sb3-cartpole-s0").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "layer-objective")))
    for layer in ("layer-objective", "layer-constraint", "layer-diagnostic"):
        assert browser.find_element(By.ID, layer)
    diagnostic = browser.find_element(By.ID, "layer-diagnostic")
    assert diagnostic.tag_name == "details" and diagnostic.get_attribute("open") is None
    for layer in ("#layer-objective", "#layer-constraint"):
        for plot in browser.find_elements(By.CSS_SELECTOR, f"{layer} .iplot"):
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        wait(browser).until(lambda d, scope=layer: plots_drawn(d, scope))
    constraint_plots = browser.find_elements(By.CSS_SELECTOR, "#layer-constraint .iplot")
    assert len(constraint_plots) >= 4
    # The folded diagnostic layer draws its plots when opened.
    diagnostic.find_element(By.TAG_NAME, "summary").click()
    for plot in browser.find_elements(By.CSS_SELECTOR, "#layer-diagnostic .iplot"):
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    wait(browser).until(lambda d: plots_drawn(d, "#layer-diagnostic"))
    # Without JavaScript's plots (?plots=static) the dashboard is PNG images.
    browser.get(browser.current_url.split("#")[0] + "?plots=static")
    wait(browser).until(lambda d: images_loaded(d, "#layer-objective img.plot, #layer-constraint img.plot"))
    link = browser.find_element(By.CSS_SELECTOR, "#layer-constraint a.plot-title")
    assert link.get_attribute("href").startswith(base + "/dictionary/")
    caption = browser.find_element(By.CSS_SELECTOR, "#layer-constraint figcaption")
    assert "logging point" in caption.get_attribute("title")
    no_console_errors(browser)


def test_select_two_runs_with_different_kl_estimators_and_see_the_warning(site, browser):
    base, ids = site
    browser.get(base + "/")
    for run_id in (ids["sb3-s0"], ids["cleanrl"]):
        browser.find_element(By.CSS_SELECTOR, f"input.run-select[value='{run_id}']").click()
    assert "2 selected" in browser.find_element(By.ID, "selected-count").text
    browser.find_element(By.ID, "compare-button").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "hparam-diff")))
    summary = browser.find_element(By.ID, "semantic-summary")
    # The checkbox order decides which side is named first.
    assert summary.is_displayed() and re.search(r"KL estimator: (k3 vs k1|k1 vs k3)", summary.text)
    card = browser.find_element(By.CSS_SELECTOR, "figure[data-metric='kl_old_mean']")
    warning = card.find_element(By.CSS_SELECTOR, ".semantic-warning")
    assert warning.is_displayed() and re.search(r"k3 vs k1|k1 vs k3", warning.text)
    browser.execute_script("arguments[0].scrollIntoView()", card)
    wait(browser).until(lambda d: plots_drawn(d, "figure[data-metric='kl_old_mean']"))
    # The overlay draws both estimators' runs, each a legend entry with its semantic group named.
    labels = browser.execute_script(
        "return RLPlots.byKey('kl_old_mean').gd.data.filter(t => t.showlegend !== false).map(t => t.name)")
    assert len(labels) == 2 and any("k1" in x for x in labels) and any("k3" in x for x in labels), labels
    diff = browser.find_element(By.ID, "hparam-diff").text
    assert "learning_rate" in diff and "gamma" not in diff.split("identical")[0]
    no_console_errors(browser)


def test_edit_a_definition_and_see_the_new_version(site, browser):
    base, _ = site
    browser.get(base + "/dictionary/clip_fraction")
    browser.find_element(By.ID, "edit-definition").click()
    # Editing needs a login: the login page, then back to the form.
    wait(browser).until(EC.presence_of_element_located((By.ID, "login-form")))
    browser.find_element(By.NAME, "username").send_keys("Grace")
    browser.find_element(By.NAME, "password").send_keys("flow-matic-1959")
    browser.find_element(By.ID, "login-button").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "definition-form")))
    assert "Grace" in browser.find_element(By.ID, "edit-author").text
    high = browser.find_element(By.NAME, "healthy_high")
    high.clear()
    high.send_keys("0.25")
    browser.find_element(By.NAME, "note").send_keys("PPO clip fraction above 0.25 means too big a step")
    browser.find_element(By.ID, "save-definition").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "history")))
    assert "Saved clip_fraction as version 2." in browser.find_element(By.CSS_SELECTOR, ".flash").text
    newest = browser.find_element(By.CSS_SELECTOR, "#history li.version")
    assert newest.get_attribute("data-version") == "2"
    assert "Grace" in newest.text and "too big a step" in newest.text and "healthy_range" in newest.text
    assert "0.25" in browser.find_element(By.ID, "healthy-range").text
    no_console_errors(browser)
