"""The interactive dashboard against the PNG one, in headless Chromium (used by ``bench/render.py``).

- time to first paint: from navigation start until every plot of the dashboard is drawn (PNG
  images loaded, or plotly plots ready), each in a fresh browser profile (first visit: plotly.js
  is fetched too) with the server's plot cache emptied; the folded layer is opened by a script
  the browser runs before the page's own, so both pages draw all their plots;
- JavaScript heap after the paint (``performance.memory``);
- zoom re-fetch: server time of ``/api/runs/<id>/plot`` for a 10% step range at 650 px;
- payload per plot: the PNG's bytes against the JSON of one interactive plot at 650 px.
"""
from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
PLOT_WIDTH = 650

OPEN_FOLDED = "document.addEventListener('DOMContentLoaded', () => document.querySelectorAll('details.layer')" \
              ".forEach(d => { d.open = true; }), {capture: true});"
DONE_PNG = ("const imgs = Array.from(document.querySelectorAll('.layer img.plot'));"
            "return imgs.length && imgs.every(i => i.complete && i.naturalWidth > 0) ? "
            "[performance.now(), imgs.length, performance.memory.usedJSHeapSize] : null;")
DONE_INTERACTIVE = ("const ps = Array.from(document.querySelectorAll('.layer .iplot'));"
                    "return ps.length && ps.every(e => e.dataset.state === 'ready') ? "
                    "[performance.now(), ps.length, performance.memory.usedJSHeapSize] : null;")


def available() -> bool:
    return Path(CHROMEDRIVER).exists()


@contextlib.contextmanager
def _serve(app: Any):
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)


def _driver(profile: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--enable-precise-memory-info", "--disable-background-networking", "--no-first-run",
                f"--user-data-dir={profile}", "--window-size=1400,6000"):
        options.add_argument(arg)
    if Path(CHROMIUM).exists():
        options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": OPEN_FOLDED})
    return driver


def _paint(url: str, done_js: str, cache: Any) -> tuple[float, int, float]:
    profile = tempfile.mkdtemp(prefix="rlreg-bench-")
    driver = _driver(profile)
    try:
        cache.clear()
        driver.get(url)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = driver.execute_script(done_js)
            if done:
                return done[0] / 1000.0, int(done[1]), done[2] / 1e6
            time.sleep(0.01)
        raise TimeoutError(f"{url}: plots not drawn within 120 s")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def figures(app: Any, client: Any, run_id: str, keys: list[str], last_step: int, repeats: int = 3) -> dict[str, Any]:
    cache = app.extensions["rlregistry.plot_cache"]
    with _serve(app) as base:
        _paint(f"{base}/runs/{run_id}?plots=static", DONE_PNG, cache)  # warm the server (imports, fonts)
        _paint(f"{base}/runs/{run_id}", DONE_INTERACTIVE, cache)
        png, inter = [], []
        for _ in range(repeats):  # interleaved: both see the same machine load
            png.append(_paint(f"{base}/runs/{run_id}?plots=static", DONE_PNG, cache))
            inter.append(_paint(f"{base}/runs/{run_id}", DONE_INTERACTIVE, cache))
    zoom = []
    span = last_step // 10
    for i, key in enumerate(keys):
        lo = (i * span // 2) % (last_step - span)
        url = f"/api/runs/{run_id}/plot"
        query = {"key": key, "points": PLOT_WIDTH, "from_step": lo, "to_step": lo + span}
        client.get(url, query_string=query)
        start = time.perf_counter()
        r = client.get(url, query_string={**query, "from_step": lo + 1})  # a new range: no ETag shortcut
        zoom.append(time.perf_counter() - start)
        assert r.status_code == 200, r.status_code
    png_bytes, json_bytes = [], []
    for key in keys:
        png_bytes.append(len(client.get(f"/plots/run/{run_id}", query_string={"key": key}).data))
        json_bytes.append(len(client.get(f"/api/runs/{run_id}/plot",
                                         query_string={"key": key, "points": PLOT_WIDTH}).data))
    return {
        "png_paint": statistics.median(p[0] for p in png), "png_plots": png[0][1],
        "png_heap": statistics.median(p[2] for p in png),
        "interactive_paint": statistics.median(p[0] for p in inter), "interactive_plots": inter[0][1],
        "interactive_heap": statistics.median(p[2] for p in inter),
        "zoom_median": statistics.median(zoom), "zoom_max": max(zoom),
        "png_bytes": statistics.mean(png_bytes), "json_bytes": statistics.mean(json_bytes),
    }


def report(f: dict[str, Any]) -> bool:
    """Print the figures; True when every target is met."""
    ok = True
    ratio = f["interactive_paint"] / f["png_paint"]
    print("interactive dashboard in headless Chromium (median of interleaved first visits, fresh profiles):")
    print(f"  PNG dashboard: {f['png_plots']} plots painted                         : "
          f"{f['png_paint'] * 1000:8.1f} ms   JS heap {f['png_heap']:.1f} MB")
    print(f"  interactive (plotly.js): {f['interactive_plots']} plots painted               : "
          f"{f['interactive_paint'] * 1000:8.1f} ms   JS heap {f['interactive_heap']:.1f} MB"
          f"   {ratio:.2f}x the PNG dashboard (target <= 1.5x)")
    ok &= ratio <= 1.5
    print(f"  zoom re-fetch, 10% range at {PLOT_WIDTH} px (server, median / max)     : "
          f"{f['zoom_median'] * 1000:8.1f} ms / {f['zoom_max'] * 1000:.1f} ms (target < 50 ms)")
    ok &= f["zoom_max"] < 0.05
    payload = f["json_bytes"] / f["png_bytes"]
    print(f"  payload per plot: PNG {f['png_bytes'] / 1024:.1f} KiB, JSON {f['json_bytes'] / 1024:.1f} KiB"
          f"                  : {payload:.2f}x the PNG (target <= 2x)")
    ok &= payload <= 2.0
    return ok
