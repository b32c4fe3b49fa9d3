"""Write actions and the runs-table views in a real headless Chromium: upload with its progress bar and
registration report, the edit form and the run history, delete with confirmation, the column picker,
grouped curves with their hover, pattern panels and parallel coordinates. No console errors (CSP).

Reuses the browser fixture of ``test_browser``. Screenshots go to ``$RLREG_SCREENSHOTS`` when set.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import numpy as np
import pytest

import test_browser
from registry import Registry
from registry.store.auth import create_user
from registry.store.run_history import history
from registry.web.app import create_app
from test_browser import no_console_errors, serve, wait
from test_browser_iplots import shot
from test_web_support import fill_registry

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

browser = test_browser.browser


@pytest.fixture(scope="module")
def write_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-write")
    reg = Registry(f"sqlite:///{root / 'registry.db'}")
    ids = fill_registry(reg)
    rng = np.random.default_rng(2)
    for i, lr in enumerate((1e-6, 1e-6, 1e-5, 1e-5)):
        steps = np.arange(1, 101)
        reg.register_arrays(f"grpo-{i}", {
            "critic/score/mean": (steps, np.linspace(0.1, 0.5 + 20000 * lr, 100) + rng.normal(0, 0.03, 100)),
            "rewards/format/mean": (steps, rng.normal(0.8, 0.05, 100)),
            "rewards/accuracy/mean": (steps, np.linspace(0.1, 0.6, 100) + rng.normal(0, 0.05, 100)),
        }, framework="verl", algorithm="GRPO", project="grpo", task="gsm8k",
            params={"learning_rate": lr, "rollout_n": 8 if i % 2 else 16, "seed": i},
            outcome={"scores": {"gsm8k_acc": 0.4 + 10000 * lr + 0.01 * i}})
    create_user(reg, "ada", "analytical-engine")
    # A log of ~4 MB, so the upload reports progress more than once.
    lines = ["step,actor/kl_loss,critic/score/mean,my/unknown_probe"]
    lines += [f"{s},{0.001 + 1e-7 * s:.9f},{0.2 + 1e-6 * s:.9f},{s % 7}" for s in range(1, 90_001)]
    log = root / "grpo_big_run.csv"
    log.write_text("\n".join(lines) + "\n")
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "browser-write", "UPLOAD_DIR": str(root / "uploads")})
    with serve(app) as url:
        yield url, reg, ids, log
    reg.close()


def log_in(driver, base: str, next_path: str) -> None:
    driver.get(f"{base}/login?next={next_path}")
    driver.find_element(By.NAME, "username").send_keys("ada")
    driver.find_element(By.NAME, "password").send_keys("analytical-engine")
    driver.find_element(By.ID, "login-button").click()
    # The login page's own address holds next_path in its query: wait for the path itself, and for
    # that page to have loaded, or a lookup races the navigation.
    wait(driver).until(lambda d: urlsplit(d.current_url).path == next_path.split("?")[0]
                       and d.execute_script("return document.readyState") == "complete")


def test_upload_shows_progress_and_the_registration_report(write_site, browser):
    base, reg, _, log = write_site
    log_in(browser, base, "/upload")
    browser.find_element(By.ID, "upload-file").send_keys(str(log))
    browser.find_element(By.ID, "upload-project").send_keys("uploads")
    browser.find_element(By.ID, "upload-framework").send_keys("verl")
    browser.find_element(By.ID, "upload-button").click()
    wait(browser).until(lambda d: d.find_element(By.ID, "upload-report").get_attribute("data-status"))
    assert browser.find_element(By.ID, "upload-report").get_attribute("data-status") == "201"
    bar = browser.find_element(By.ID, "upload-progress")
    assert bar.get_attribute("value") == "100" and int(bar.get_attribute("data-events") or 0) >= 1
    report = browser.find_element(By.ID, "registration-report")
    assert "grpo_big_run.csv" in report.text and "270,000 points" in report.text
    mapped = browser.find_element(By.CSS_SELECTOR, ".report-mapped").text
    assert "actor/kl_loss" in mapped and "critic/score/mean" in mapped
    assert "my/unknown_probe" in browser.find_element(By.CSS_SELECTOR, ".report-unmapped").text
    assert browser.find_element(By.ID, "upload-status").text == "registered"
    browser.execute_script("document.getElementById('registration-report').scrollIntoView({block: 'center'})")
    shot(browser, "write-upload-report")
    [run], _ = reg.list_runs(where="name=grpo_big_run")
    assert run["project"] == "uploads" and history(reg, run["id"])[0]["author"] == "ada"
    # The report links to the new run's dashboard.
    browser.find_element(By.CSS_SELECTOR, ".report-run-link").click()
    wait(browser).until(lambda d: run["id"] in d.current_url)
    no_console_errors(browser)


def test_edit_form_and_history(write_site, browser):
    base, reg, ids, _ = write_site
    run_id = ids["sb3-s1"]
    log_in(browser, base, f"/runs/{run_id}")
    browser.find_element(By.ID, "edit-link").click()
    wait(browser).until(lambda d: d.find_elements(By.ID, "run-edit-form"))
    Select(browser.find_element(By.NAME, "verdict")).select_by_value("inconclusive")
    tags = browser.find_element(By.NAME, "tags")
    tags.clear()
    tags.send_keys("baseline, re-run needed")
    scores = browser.find_element(By.NAME, "scores")
    scores.send_keys("\neval_return = 455.5")
    browser.find_element(By.NAME, "notes").send_keys("Evaluation was on 10 episodes only.")
    browser.find_element(By.NAME, "note").send_keys("fewer eval episodes than thought")
    shot(browser, "write-edit-form")
    browser.find_element(By.ID, "save-run").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".flash-success"))
    assert "verdict" in browser.find_element(By.CSS_SELECTOR, ".flash-success").text
    outcome = browser.find_element(By.ID, "outcome").text
    assert "inconclusive" in outcome and "eval_return" in outcome and "10 episodes" in outcome
    run = reg.run_detail(run_id)
    assert run["tags"] == ["baseline", "re-run needed"] and run["scores"]["eval_return"] == 455.5
    browser.find_element(By.ID, "history-link").click()
    wait(browser).until(lambda d: d.find_elements(By.ID, "history-table"))
    table = browser.find_element(By.ID, "history-table").text
    assert "ada" in table and "fewer eval episodes than thought" in table and "re-run needed" in table
    assert "success" in table and "inconclusive" in table
    shot(browser, "write-history")
    no_console_errors(browser)


def test_delete_asks_for_the_name(write_site, browser):
    base, reg, ids, _ = write_site
    run_id = ids["grpo-lr5e-5"]
    log_in(browser, base, f"/runs/{run_id}")
    wait(browser).until(lambda d: d.find_elements(By.ID, "delete-link"))
    browser.find_element(By.ID, "delete-link").click()
    wait(browser).until(lambda d: d.find_elements(By.ID, "delete-form"))
    name = reg.run_detail(run_id)["name"]
    browser.find_element(By.NAME, "confirm_name").send_keys(name[:-1])
    browser.find_element(By.ID, "confirm-delete").click()
    wait(browser).until(lambda d: d.find_elements(By.ID, "delete-error"))
    assert reg.run_detail(run_id)["name"] == name
    browser.get_log("browser")  # the refused post's 400, expected
    typed = browser.find_element(By.NAME, "confirm_name")
    typed.clear()
    typed.send_keys(name)
    shot(browser, "write-delete-confirm")
    browser.find_element(By.ID, "confirm-delete").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".flash-success"))
    assert f"Deleted run {name}" in browser.find_element(By.CSS_SELECTOR, ".flash-success").text
    assert not reg.list_runs(where=f"name={name}")[0]
    no_console_errors(browser)


def test_column_picker_adds_a_metric_summary_column(write_site, browser):
    base, _, _, _ = write_site
    browser.get(f"{base}/runs?project=grpo")
    browser.find_element(By.CSS_SELECTOR, "#column-picker > summary").click()
    box = browser.find_element(By.CSS_SELECTOR, "input[name=metrics][value='reward_sequence_mean:max']")
    box.click()
    browser.find_element(By.CSS_SELECTOR, "input[name=params][value='seed']").click()  # on by default: off
    shot(browser, "runs-column-picker")
    browser.find_element(By.ID, "apply-columns").click()
    wait(browser).until(lambda d: "reward_sequence_mean%3Amax" in d.current_url)
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#runs-table thead th")]
    assert any("(max)" in h for h in headers) and not any(h == "seed" for h in headers) and "rollout_n" in headers
    no_console_errors(browser)


def test_grouped_curves_hover_shows_the_runs_at_the_step_and_panels_and_parallel_draw(write_site, browser):
    base, _, _, _ = write_site
    browser.get(f"{base}/runs/curves?project=grpo&by=learning_rate&panel=reward_sequence_mean&panel=rewards/.*/mean")
    wait(browser).until(lambda d: all(e.get_attribute("data-state") == "ready"
                                      for e in d.find_elements(By.CSS_SELECTOR, ".rv-plot")))
    plot = browser.find_element(By.ID, "panel-0")
    # Two groups of two runs: two mean lines and two bands.
    assert browser.execute_script("return document.getElementById('panel-0').data.length") == 4
    ActionChains(browser).move_to_element_with_offset(plot, 0, 0).perform()
    wait(browser).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#panel-0 .hoverlayer text').length > 0"))
    hover = browser.execute_script(
        "return Array.from(document.querySelectorAll('#panel-0 .hoverlayer text')).map(t => t.textContent).join(' ')")
    assert "n = 2 runs" in hover and "s.e." in hover
    keys = browser.find_element(By.CSS_SELECTOR, "[data-panel='1'] .panel-keys").text
    assert keys == "rewards/accuracy/mean, rewards/format/mean"
    shot(browser, "runs-grouped-curves")
    no_console_errors(browser)
    browser.get(f"{base}/runs/parallel?project=grpo")
    wait(browser).until(lambda d: d.find_element(By.ID, "parallel-plot").get_attribute("data-state") == "ready")
    # Plotly's parcoords needs WebGL; headless Chromium without a GPU has none, so the page draws the
    # same axes from SVG lines (one per run) and labels each axis with an annotation.
    renderer = browser.find_element(By.ID, "parallel-plot").get_attribute("data-renderer")
    if renderer == "webgl":
        labels = browser.execute_script(
            "return document.getElementById('parallel-plot').data[0].dimensions.map(d => d.label)")
    else:
        assert browser.execute_script("return document.getElementById('parallel-plot').data.length") == 4
        labels = browser.execute_script(
            "return document.getElementById('parallel-plot').layout.annotations.map(a => a.text)")
    assert "log10(learning_rate)" not in labels  # one decade apart: drawn as it is
    assert "learning_rate" in labels and "score.gsm8k_acc" in labels
    shot(browser, "runs-parallel")
    no_console_errors(browser)
