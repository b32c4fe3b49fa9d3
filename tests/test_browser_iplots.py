"""The interactive plots in a real headless Chromium: hover values and the synced crosshair, a drag-zoom
that fetches the range again (the spike inside it comes back), the smoothing slider without reload
(and the browser's smoothing equal to the server's), a running run's plots extending by themselves.

Reuses the browser fixture of ``test_browser`` (skipped, or failing under CI, the same way).
Screenshots go to ``$RLREG_SCREENSHOTS`` when set.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import test_browser
from registry import SeriesData, open_registry
from registry.web.app import create_app
from registry.web import smoothing
from test_browser import no_console_errors, serve, wait

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

browser = test_browser.browser  # the module-scoped headless Chromium fixture

N = 200_000
SPIKE_AT = 123_457


@pytest.fixture(scope="module")
def iplot_site(tmp_path_factory):
    reg = open_registry(f"sqlite:///{tmp_path_factory.mktemp('iplots') / 'registry.db.engine'}")
    rng = np.random.default_rng(5)
    steps = np.arange(1, N + 1, dtype=np.int64)
    kl = np.abs(rng.normal(0.01, 0.002, N))
    kl[SPIKE_AT - 1] = 0.5
    score = np.linspace(0.1, 0.7, 500) + rng.normal(0, 0.05, 500)
    ep_steps = np.repeat(np.arange(1, 201, dtype=np.int64) * 10, 3)
    long_run = reg.register_arrays("long-run", {
        "actor/kl_loss": SeriesData(steps, kl, 1_700_000_000.0 + steps * 0.5),
        "critic/score/mean": (np.arange(1, 501), score),
        "charts/episodic_return": (ep_steps, rng.normal(100, 10, ep_steps.size)),
    }, framework="verl", algorithm="GRPO", project="p", task="gsm8k")
    other = reg.register_arrays("other-run", {
        "critic/score/mean": (np.arange(1, 401), np.linspace(0.2, 0.5, 400) + rng.normal(0, 0.05, 400)),
    }, framework="verl", algorithm="GRPO", project="p", task="gsm8k", params={"learning_rate": 1e-6})
    live = reg.create_run("live-run", project="p", framework="verl", algorithm="GRPO")
    reg.append(live.id, {"critic/score/mean": SeriesData(np.arange(1, 51), np.linspace(0, 0.5, 50))})
    app = create_app({"REGISTRY": reg, "SECRET_KEY": "browser-test", "LIVE_POLL_MS": 300})
    with serve(app) as url:
        yield url, reg, {"long": long_run.run_id, "live": live.id, "score": score, "other": other.run_id}
    reg.close()


def shot(driver, name: str) -> None:
    folder = os.environ.get("RLREG_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def plot_ready(driver, key: str) -> bool:
    return driver.execute_script(
        "const p = RLPlots.byKey(arguments[0]); return !!p && p.el.dataset.state === 'ready';", key)


def open_dashboard(driver, base: str, run_id: str, keys: list[str]) -> None:
    driver.get(f"{base}/runs/{run_id}")
    for key in keys:
        driver.execute_script("RLPlots.byKey(arguments[0]).el.scrollIntoView({block: 'center'})", key)
        wait(driver).until(lambda d, k=key: plot_ready(d, k))


def pixel_of(driver, key: str, x: float, y_frac: float = 0.5) -> tuple[int, int]:
    """Offset from the plot element's centre of data x (and a height fraction) inside the plot area."""
    return tuple(driver.execute_script("""
        const p = RLPlots.byKey(arguments[0]), gd = p.gd, fl = gd._fullLayout, r = gd.getBoundingClientRect();
        const px = fl.xaxis._offset + fl.xaxis.l2p(arguments[1]);
        const py = fl.yaxis._offset + fl.yaxis._length * arguments[2];
        return [Math.round(px - r.width / 2), Math.round(py - r.height / 2)];""", key, x, y_frac))


def test_browser_smoothing_matches_the_server(iplot_site, browser):
    base, _, ids = iplot_site
    browser.get(f"{base}/runs/{ids['long']}")
    wait(browser).until(lambda d: d.execute_script("return typeof RLSmoothing !== 'undefined'"))
    rng = np.random.default_rng(11)
    cases = [rng.normal(0, 1, 5000).cumsum(), rng.normal(5, 2, 37), np.array([3.0]), np.array([1.0, 1e6, -1e6, 2.0])]
    for values in cases:
        for method in ("ema", "trailing", "centred"):
            for window in (1, 2, 5, 10, 19, 100, 1000, 100000):
                got = browser.execute_script(
                    "return Array.from(RLSmoothing.smooth(arguments[0], arguments[1], arguments[2]));",
                    values.tolist(), method, window)
                want = smoothing.smooth(values, method, window)
                assert np.allclose(got, want, rtol=1e-9, atol=1e-9 * float(np.abs(values).max())), \
                    (method, window, len(values))
    assert browser.execute_script("return RLSmoothing.smooth([1, 2], 'none', 5)") is None


def test_hover_shows_step_raw_and_smoothed_and_the_crosshair_follows_on_other_plots(iplot_site, browser):
    base, _, ids = iplot_site
    open_dashboard(browser, base, ids["long"], ["critic/score/mean", "actor/kl_loss"])
    score = ids["score"]
    key = "critic/score/mean"
    browser.execute_script("RLPlots.byKey(arguments[0]).el.scrollIntoView({block: 'center'})", key)
    el = browser.execute_script("return RLPlots.byKey(arguments[0]).gd", key)
    dx, dy = pixel_of(browser, key, 250)
    ActionChains(browser).move_to_element_with_offset(el, dx, dy).perform()
    wait(browser).until(lambda d: d.execute_script(
        "return RLPlots.byKey(arguments[0]).gd.querySelectorAll('.hoverlayer .hovertext').length > 0", key))
    text = browser.execute_script(
        "return Array.from(RLPlots.byKey(arguments[0]).gd.querySelectorAll('.hoverlayer text'))"
        ".map(t => t.textContent).join(' | ')", key)
    # The step under the mouse (x-axis: step) and its raw and smoothed values.
    step = int(browser.execute_script(
        "return RLPlots.byKey(arguments[0]).gd._hoverdata[0].x", key))
    assert abs(step - 250) <= 3
    window = browser.execute_script("return RLPlots.byKey(arguments[0]).window", key)
    smooth = smoothing.smooth(score, "ema", window)
    assert f"raw {float(f'{score[step - 1]:.6g}'):g}" in text.replace("−", "-") or \
        f"raw {score[step - 1]:.6g}" in text.replace("−", "-"), text
    assert f"smoothed {float(f'{smooth[step - 1]:.6g}'):g}" in text, text
    # The other plot shows its hover at the same step.
    other = browser.execute_script(
        "const gd = RLPlots.byKey('actor/kl_loss').gd; return gd._hoverdata ? gd._hoverdata.map(h => h.x) : null;")
    assert other and abs(other[0] - step) <= 400  # nearest of the kl plot's reduced points
    shot(browser, "iplot-hover")
    no_console_errors(browser)


def test_drag_zoom_fetches_the_range_again_with_the_spike(iplot_site, browser):
    base, _, ids = iplot_site
    key = "actor/kl_loss"
    open_dashboard(browser, base, ids["long"], [key])
    first = browser.execute_script("const p = RLPlots.byKey(arguments[0]); return [p.fetches, p.full.returned];", key)
    el = browser.execute_script("return RLPlots.byKey(arguments[0]).gd", key)
    x0, y0 = pixel_of(browser, key, 120_000, 0.1)
    x1, y1 = pixel_of(browser, key, 127_000, 0.1)
    ActionChains(browser).move_to_element_with_offset(el, x0, y0).click_and_hold() \
        .move_by_offset((x1 - x0) // 2, 0).move_by_offset((x1 - x0) - (x1 - x0) // 2, 0).release().perform()
    wait(browser).until(lambda d: d.execute_script(
        "const p = RLPlots.byKey(arguments[0]); return p.zoomed && p.shown === p.zoomed;", key))
    zoomed = browser.execute_script(
        "const p = RLPlots.byKey(arguments[0]); return {range: p.range, steps: p.zoomed.line.steps,"
        " values: p.zoomed.line.values, fetches: p.fetches, width: p.gd._fullLayout._size.w};", key)
    lo, hi = zoomed["range"]
    assert 118_000 < lo < 122_000 and 125_000 < hi < 129_000
    assert zoomed["fetches"] > first[0]
    assert min(zoomed["steps"]) >= lo and max(zoomed["steps"]) <= hi
    assert SPIKE_AT in zoomed["steps"] and zoomed["values"][zoomed["steps"].index(SPIKE_AT)] == 0.5
    assert len(zoomed["steps"]) <= zoomed["width"] + 1  # reduced to the plot's width in pixels
    shot(browser, "iplot-zoomed")
    # Double-click resets to the whole series.
    dx, dy = pixel_of(browser, key, (lo + hi) / 2, 0.5)
    ActionChains(browser).move_to_element_with_offset(el, dx, dy).double_click().perform()
    wait(browser).until(lambda d: d.execute_script(
        "const p = RLPlots.byKey(arguments[0]); return p.range === null && p.shown === p.full;", key))
    no_console_errors(browser)


def test_smoothing_slider_redraws_in_the_browser_without_reload(iplot_site, browser):
    base, _, ids = iplot_site
    key = "critic/score/mean"
    open_dashboard(browser, base, ids["long"], [key])
    browser.execute_script("window.__same_page = 1")
    method = browser.find_element(By.ID, "smooth-method")
    browser.execute_script("arguments[0].value = 'trailing'; arguments[0].dispatchEvent(new Event('change'))", method)
    slider = browser.find_element(By.ID, "smooth-slider")
    browser.execute_script("arguments[0].value = 25; arguments[0].dispatchEvent(new Event('input'))", slider)
    got = browser.execute_script(
        "const gd = RLPlots.byKey(arguments[0]).gd; return gd.data.filter(t => t.name === 'smoothed')[0].y;", key)
    want = smoothing.smooth(ids["score"], "trailing", 25)
    assert np.allclose(got, want, rtol=1e-9)
    assert browser.find_element(By.ID, "smooth-slider-value").text == "25"
    # The downsampled kl plot gets the exact line from the server (smoothed on all 200,000 points).
    kl_want = smoothing.smooth(np.asarray(browser.execute_script(
        "return RLPlots.byKey('actor/kl_loss').full.line.values")), "trailing", 25)  # noqa: F841 - preview basis
    wait(browser).until(lambda d: d.execute_script(
        "const p = RLPlots.byKey('actor/kl_loss'); return p.full && p.full.smoothing.method === 'trailing'"
        " && p.full.smoothing.window === 25;"))
    assert browser.execute_script("return window.__same_page") == 1
    shot(browser, "iplot-smoothing")
    no_console_errors(browser)


def test_running_run_extends_by_itself(iplot_site, browser):
    base, reg, ids = iplot_site
    key = "critic/score/mean"
    open_dashboard(browser, base, ids["live"], [key])
    assert browser.execute_script("return RLPlots.byKey(arguments[0]).el.dataset.lastStep", key) == "50"
    wait(browser).until(lambda d: d.find_element(By.ID, "live-updated").text.strip() != "")
    reg.append(ids["live"], {"critic/score/mean": SeriesData(np.arange(51, 81), np.linspace(0.5, 0.8, 30))})
    wait(browser).until(lambda d: d.execute_script(
        "return RLPlots.byKey(arguments[0]).el.dataset.lastStep", key) == "80")
    assert "ago" in browser.find_element(By.ID, "live-updated").text
    value = browser.execute_script(
        "return RLPlots.byKey(arguments[0]).figure.querySelector('.plot-value .value').textContent", key)
    assert value == "0.8"  # the card's last value follows
    shot(browser, "iplot-live")
    no_console_errors(browser)


def test_compare_overlay_hover_names_every_run_and_zoom_refetches(iplot_site, browser):
    base, _, ids = iplot_site
    browser.get(f"{base}/compare?run={ids['long']}&run={ids['other']}")
    key = "reward_sequence_mean"
    browser.execute_script("RLPlots.byKey(arguments[0]).el.scrollIntoView({block: 'center'})", key)
    wait(browser).until(lambda d: plot_ready(d, key))
    names = browser.execute_script(
        "return RLPlots.byKey(arguments[0]).gd.data.filter(t => t.showlegend !== false).map(t => t.name)", key)
    assert sorted(names) == ["long-run", "other-run"]
    el = browser.execute_script("return RLPlots.byKey(arguments[0]).gd", key)
    dx, dy = pixel_of(browser, key, 200)
    ActionChains(browser).move_to_element_with_offset(el, dx, dy).perform()
    wait(browser).until(lambda d: d.execute_script(
        "return RLPlots.byKey(arguments[0]).gd.querySelectorAll('.hoverlayer .legend text, .hoverlayer text')"
        ".length > 0", key))
    text = browser.execute_script(
        "return Array.from(RLPlots.byKey(arguments[0]).gd.querySelectorAll('.hoverlayer text'))"
        ".map(t => t.textContent).join(' | ')", key)
    assert "long-run" in text and "other-run" in text, text
    before = browser.execute_script("return RLPlots.byKey(arguments[0]).fetches", key)
    x0, y0 = pixel_of(browser, key, 100, 0.1)
    x1, _ = pixel_of(browser, key, 150, 0.1)
    ActionChains(browser).move_to_element_with_offset(el, x0, y0).click_and_hold() \
        .move_by_offset((x1 - x0) // 2, 0).move_by_offset((x1 - x0) - (x1 - x0) // 2, 0).release().perform()
    wait(browser).until(lambda d: d.execute_script(
        "const p = RLPlots.byKey(arguments[0]); return p.zoomed && p.shown === p.zoomed;", key))
    zoomed = browser.execute_script("return RLPlots.byKey(arguments[0]).zoomed", key)
    lo, hi = zoomed["x_range"]
    assert 95 < lo < 105 and 145 < hi < 155
    assert browser.execute_script("return RLPlots.byKey(arguments[0]).fetches", key) > before
    for trace in zoomed["traces"]:
        assert all(lo <= x <= hi for x in trace["smooth_x"])
    shot(browser, "iplot-compare")
    no_console_errors(browser)
