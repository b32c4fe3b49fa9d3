"""Script injection, end to end: hostile text registered through the write API, every page that
shows it opened in a real headless Chromium, and no script of the attacker's ever runs.

The site runs twice: once with the Content-Security-Policy switched off, so that only the
templates' escaping stands between the payloads and the page, and once as deployed (CSP on),
where a payload that reached the DOM would also show up as a CSP violation in the console.
"""
from __future__ import annotations

import time
from urllib.parse import quote, urlencode, urlsplit

import pytest

from registry import open_registry
from registry.store.auth import create_token, create_user
from registry.web.app import create_app

import test_browser  # noqa: E402 - skips this module too when there is no chromedriver (outside CI)
from selenium.common.exceptions import NoAlertPresentException, UnexpectedAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from test_browser import serve, wait  # noqa: E402

SCRIPT = "<script>window.__xss=1</script>"
IMG = '"><img src=x onerror="window.__xss=1">'
ALERT = "'><img src=x onerror=alert(1)>"
SVG = "<svg onload=window.__xss=1>"
JS_URL = "javascript:window.__xss=1"
TEXTAREA = "</textarea><script>window.__xss=1</script>"
STYLE = "</style><script>window.__xss=1</script>"


def register_hostile_runs(client, token: str) -> dict[str, str]:
    """Everything through the HTTP write API, as an attacker with a token would."""
    auth = {"Authorization": f"Bearer {token}"}
    ids = {}
    for i, name in enumerate((f"run {SCRIPT}", f"run {IMG}")):
        run = client.post("/api/runs", headers=auth, json={
            "name": name, "project": IMG, "algorithm": "PPO", "framework": "stable-baselines3", "task": SVG,
            "code_version": SCRIPT, "tags": [SCRIPT, IMG, ALERT, JS_URL],
            "params": {"optim": {"name": IMG}, "sched": SCRIPT, "url": JS_URL, SVG: 1e-4 * (i + 1), "seed": i}})
        assert run.status_code == 201, run.get_json()
        run_id = run.get_json()["id"]
        steps = list(range(1, 41))
        points = {
            "train/approx_kl": {"steps": steps, "values": [0.01 + 0.001 * s for s in steps]},
            "train/entropy_loss": {"steps": steps, "values": [-0.7 + 0.005 * s for s in steps]},
            "rollout/ep_rew_mean": {"steps": steps, "values": [10.0 * s for s in steps]},
            SCRIPT: {"steps": steps, "values": [float(s) for s in steps]},
            IMG: {"steps": steps, "values": [1.0 / s for s in steps]},
            f"custom/{ALERT}": {"steps": steps, "values": [2.0] * 40},
        }
        ack = client.post(f"/api/runs/{run_id}/metrics", headers=auth, json={"batch_id": f"b{i}", "points": points})
        assert ack.status_code == 200, ack.get_json()
        outcome = client.post(f"/api/runs/{run_id}/outcome", headers=auth, json={
            "verdict": "success", "notes": f"{SCRIPT} {IMG} {ALERT} {JS_URL} {STYLE}",
            "scores": {IMG: 1.0, SCRIPT: 2.0}, "checkpoints": [{"step": 40, "uri": JS_URL, "note": IMG}]})
        assert outcome.status_code == 200, outcome.get_json()
        assert client.post(f"/api/runs/{run_id}/status", headers=auth, json={"status": "finished"}).status_code == 200
        ids[f"r{i}"] = run_id
    edit = client.patch("/api/definitions/entropy", headers=auth, json={"note": f"{SCRIPT}{IMG}", "changes": {
        "display_name": f"Entropy {IMG}", "description": f"{SCRIPT} {IMG} {ALERT} {SVG}", "formula": TEXTAREA,
        "unit": SVG, "task_ranges": {SCRIPT: {"low": 0.1, "high": None}}}})
    assert edit.status_code == 200, edit.get_json()
    return ids


@pytest.fixture(scope="module", params=["escaping-only", "with-csp"])
def site(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xss")
    reg = open_registry(f"sqlite:///{tmp / 'registry.db.engine'}")
    create_user(reg, "mallory", "mallory-password")
    token = create_token(reg, "mallory", "attacker", scope="admin")
    config = {"REGISTRY": reg, "SECRET_KEY": "xss-test", "UPLOAD_DIR": str(tmp / "uploads")}
    if request.param == "escaping-only":
        config["CONTENT_SECURITY_POLICY"] = None
    app = create_app(config)
    ids = register_hostile_runs(app.test_client(), token)
    with serve(app) as url:
        yield url, ids, request.param
    reg.close()


browser = test_browser.browser  # the module-scoped headless Chromium fixture


def assert_no_script_ran(driver, url: str, expect_error_status: bool = False) -> str:
    driver.get(url)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            done = driver.execute_script(
                "return document.readyState === 'complete' && "
                "Array.from(document.images).every(i => i.complete);")
            if done:
                break
            time.sleep(0.1)
        time.sleep(0.3)  # an onerror handler of a broken <img> would have fired by now
        assert driver.execute_script("return typeof window.__xss") == "undefined", url
    except UnexpectedAlertPresentException:
        pytest.fail(f"an alert opened on {url}")
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    assert not driver.find_elements(By.CSS_SELECTOR, "a[href^='javascript:' i], [onerror], [onload], iframe"), url
    logs = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if expect_error_status:
        logs = [m for m in logs if "status of 400" not in m]
    assert not logs, (url, logs)  # CSP violations (an injected inline script) show up here
    return driver.page_source


def test_runs_page_and_filters(site, browser):
    base, ids, mode = site
    page = assert_no_script_ran(browser, base + "/runs")
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#runs-table td.name a")]
    assert f"run {SCRIPT}" in names and f"run {IMG}" in names  # shown as text, not markup
    tags = {t.text for t in browser.find_elements(By.CSS_SELECTOR, "#runs-table td.tags a")}
    assert {SCRIPT, IMG, ALERT, JS_URL} <= tags
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
    # Filter text echoed in the error message, and quick filters carrying the payload.
    assert_no_script_ran(browser, base + "/runs?" + urlencode({"q": f"name={SCRIPT} and {IMG}"}),
                         expect_error_status=True)
    assert_no_script_ran(browser, base + "/runs?" + urlencode({"project": IMG, "tag": SCRIPT}))
    assert_no_script_ran(browser, base + "/runs?" + urlencode({"params": f"{SVG},optim.name", "metrics": SCRIPT}))


def test_run_dashboard(site, browser):
    base, ids, mode = site
    page = assert_no_script_ran(browser, f"{base}/runs/{ids['r0']}")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert SCRIPT in text and IMG in text and JS_URL in text  # notes, params, keys, checkpoint uri as text
    assert "<img src=x" not in page.replace("&lt;img src=x", "")
    # Open the folded layers so that every plot card (with the hostile keys) is rendered and loaded.
    for summary in browser.find_elements(By.CSS_SELECTOR, "details > summary"):
        browser.execute_script("arguments[0].click()", summary)
    time.sleep(1)
    assert browser.execute_script("return typeof window.__xss") == "undefined"
    assert_no_script_ran(browser, f"{base}/runs/{quote(ids['r1'])}?" + urlencode({"smooth": SCRIPT}),
                         expect_error_status=True)


def test_compare_page(site, browser):
    base, ids, mode = site
    assert_no_script_ran(browser, f"{base}/compare?run={ids['r0']}&run={ids['r1']}")
    diff = browser.find_element(By.ID, "hparam-diff").text
    assert SVG in diff or "seed" in diff


def test_definition_pages_and_the_edit_form(site, browser):
    base, ids, mode = site
    assert_no_script_ran(browser, base + "/dictionary/entropy")
    assert SCRIPT in browser.find_element(By.CSS_SELECTOR, "p.description").text
    assert TEXTAREA in browser.find_element(By.CSS_SELECTOR, "pre.formula").text
    assert_no_script_ran(browser, base + "/dictionary/?" + urlencode({"q": SCRIPT}))
    assert_no_script_ran(browser, base + "/dictionary/")
    # The edit form puts the payloads inside <textarea> and value="": log in and open it.
    browser.get(base + "/login?next=/dictionary/entropy/edit")
    browser.find_element(By.NAME, "username").send_keys("mallory")
    browser.find_element(By.NAME, "password").send_keys("mallory-password")
    browser.find_element(By.ID, "login-button").click()
    # the login must have landed (its session cookie set) before the next page is opened
    wait(browser).until(lambda d: urlsplit(d.current_url).path == "/dictionary/entropy/edit")
    assert_no_script_ran(browser, base + "/dictionary/entropy/edit")
    assert browser.find_element(By.NAME, "formula").get_attribute("value") == TEXTAREA
    assert browser.find_element(By.NAME, "display_name").get_attribute("value") == f"Entropy {IMG}"


def test_plot_svg_opened_directly(site, browser):
    base, ids, mode = site
    for key in (SCRIPT, IMG, "train/entropy_loss"):
        url = f"{base}/plots/run/{ids['r0']}?" + urlencode({"key": key, "format": "svg"})
        browser.get(url)
        time.sleep(0.3)
        assert browser.execute_script("return typeof window.__xss") == "undefined", key
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018
    browser.get_log("browser")
