"""Rendering benchmark: a run dashboard of 12 metrics x 100,000 points, and the runs page with 10,000 runs.

Printed next to a reference measured in the same process: plain matplotlib (object-oriented
API, same figure size and resolution) plotting the same 12 curves already reduced to 2,000
points, raw line plus smoothed line. Targets:

- dashboard cold (empty plot cache: read, smooth on the full series, downsample, draw) within 2x of the reference;
- dashboard cached (same requests again) at least 20x faster than cold;
- runs page over 10,000 runs (first page, a filter, a deep page, a sort) under 200 ms each;
- interactive dashboard (plotly.js) in headless Chromium: time to first paint of every plot within
  1.5x the PNG dashboard measured in the same run, a zoom re-fetch under 50 ms of server time, the
  JSON of a plot at most 2x the bytes of its PNG (``bench/render_browser.py``).

Exits non-zero when a target is missed. Run: ``.venv/bin/python bench/render.py [--db-url URL]``.
"""
from __future__ import annotations

import argparse
import html
import io
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from registry import Registry, SeriesData, open_registry  # noqa: E402
from registry.db.models import Run, RunParam, RunTag, Series  # noqa: E402
from registry.web.app import create_app  # noqa: E402
from registry.core.downsample import downsample  # noqa: E402
from registry.web.smoothing import smooth  # noqa: E402

import render_browser  # noqa: E402  (bench/, beside this file)

# Twelve verl keys across the three layers.
DASHBOARD_KEYS = (
    "critic/score/mean", "critic/rewards/mean", "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac",
    "actor/entropy", "actor/pg_loss", "critic/vf_loss", "response_length/mean", "actor/grad_norm",
    "critic/advantages/mean", "response_length/clip_ratio",
)
POINTS = 100_000
RUNS = 10_000


def make_curves(n: int) -> dict[str, SeriesData]:
    rng = np.random.default_rng(0)
    steps = np.arange(1, n + 1, dtype=np.int64)
    out = {}
    for i, key in enumerate(DASHBOARD_KEYS):
        trend = np.linspace(0, 1, n) ** (0.5 + i / 12)
        values = trend + rng.normal(0, 0.05, n)
        values[rng.integers(0, n, 5)] += 3.0  # spikes that must survive downsampling
        out[key] = SeriesData(steps, values)
    return out


def reference_render(curves: dict[str, SeriesData], width: float = 5.0, height: float = 2.6, dpi: int = 140) -> float:
    """Plain matplotlib: the same curves, pre-reduced to 2,000 points, raw and smoothed lines."""
    reduced = []
    for sd in curves.values():
        x, y = downsample(sd.steps, sd.values, 2000)
        reduced.append((x, y, smooth(y, "ema", 10)))
    start = time.perf_counter()
    for x, y, s in reduced:
        fig = Figure(figsize=(width, height), dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.grid(True)
        ax.plot(x, y, color="#a9c9ea", linewidth=0.8)
        ax.plot(x, s, color="#17467f", linewidth=1.6)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    return time.perf_counter() - start


def dashboard_requests(client, run_id: str) -> tuple[float, int]:
    start = time.perf_counter()
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200, page.status_code
    urls = [html.unescape(u) for u in re.findall(r'<img class="plot" src="([^"]+)"', page.get_data(as_text=True))]
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200 and r.data[:4] == b"\x89PNG", (url, r.status_code)
    return time.perf_counter() - start, len(urls)


def revalidate(client, run_id: str) -> float:
    """What a browser does on a second visit: the page, then each image with If-None-Match (304)."""
    page = client.get(f"/runs/{run_id}")
    urls = [html.unescape(u) for u in re.findall(r'<img class="plot" src="([^"]+)"', page.get_data(as_text=True))]
    etags = {u: client.get(u).headers["ETag"] for u in urls}
    start = time.perf_counter()
    client.get(f"/runs/{run_id}")
    for url, etag in etags.items():
        r = client.get(url, headers={"If-None-Match": etag})
        assert r.status_code == 304, r.status_code
    return time.perf_counter() - start


def bulk_runs(reg: Registry, n: int) -> None:
    """10,000 runs straight into the tables (register_arrays would take minutes for setup alone)."""
    defs = reg.definitions_by_name()
    ids = {name: None for name in ("reward_sequence_mean", "kl_ref_mean", "entropy", "clip_fraction")}
    from sqlalchemy import select

    from registry.db.models import MetricDefinition

    with reg.read() as session:
        for name in ids:
            ids[name] = session.scalar(select(MetricDefinition.id).where(MetricDefinition.name == name))
    keys = {"reward_sequence_mean": "critic/score/mean", "kl_ref_mean": "actor/kl_loss", "entropy": "actor/entropy",
            "clip_fraction": "actor/pg_clipfrac"}
    rng = np.random.default_rng(1)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    runs, params, tags, series = [], [], [], []
    for i in range(n):
        rid = uuid.uuid4().hex
        algo = "GRPO" if i % 3 else "PPO"
        runs.append({"id": rid, "name": f"run-{i:05d}", "project": f"project-{i % 7}", "algorithm": algo,
                     "framework": "verl", "task": ("gsm8k", "math", "aime")[i % 3], "status": "finished",
                     "verdict": ("success", "failed", "diverged", None)[i % 4], "data_version": 1,
                     "created_at": base + timedelta(minutes=i), "updated_at": base + timedelta(minutes=i)})
        lr = float(10 ** rng.uniform(-7, -4))
        for key, vtype, num, text in (("learning_rate", "float", lr, None), ("seed", "int", float(i % 5), None),
                                      ("kl_loss_coef", "float", 0.001, None), ("rollout.n", "int", 8.0, None),
                                      ("model", "str", None, "qwen2.5-1.5b")):
            params.append({"run_id": rid, "key": key, "value_type": vtype, "num_value": num, "text_value": text})
        tags.append({"run_id": rid, "tag": f"sweep-{i % 20}"})
        for name, did in ids.items():
            last = float(rng.uniform(0, 1))
            series.append({"run_id": rid, "key": keys[name], "definition_id": did, "definition_version": 1,
                           "sign": 1.0, "semantics": {}, "overrides": {}, "count": 1000, "nan_count": 0,
                           "inf_count": 0, "first_step": 1, "last_step": 1000, "first_value": 0.0,
                           "last_value": last, "min_value": 0.0, "max_value": 1.0, "finite_sum": 500.0,
                           "chunk_count": 0})
    with reg.transaction() as session:
        for table, rows in ((Run.__table__, runs), (RunParam.__table__, params), (RunTag.__table__, tags),
                            (Series.__table__, series)):
            for start in range(0, len(rows), 5000):
                session.execute(table.insert(), rows[start:start + 5000])
    del defs


def timed(client, url: str, repeats: int = 7) -> float:
    client.get(url)  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - start)
        assert r.status_code == 200, (url, r.status_code)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db-url", help="registry URL (default: a temporary SQLite file)")
    parser.add_argument("--points", type=int, default=POINTS)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--no-browser", action="store_true", help="skip the headless Chromium figures")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    url = args.db_url or f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    reg = open_registry(url)
    if reg.list_runs(limit=1)[1]:
        print(f"{url} already holds runs: point --db-url at an empty database", file=sys.stderr)
        return 2
    curves = make_curves(args.points)
    run = reg.register_arrays("dashboard-bench", curves, framework="verl", algorithm="GRPO", task="gsm8k",
                              params={"learning_rate": 1e-6})
    app = create_app({"REGISTRY": reg, "TESTING": True})
    client = app.test_client()
    cache = app.extensions["rlregistry.plot_cache"]

    # Warm imports, fonts and the connection pool on a different run, then measure.
    warm = reg.register_arrays("warm", {k: (np.arange(10), np.arange(10.0)) for k in DASHBOARD_KEYS}, framework="verl")
    dashboard_requests(client, warm.run_id)
    reference_render(curves)

    reference = min(reference_render(curves) for _ in range(3))
    colds, cacheds = [], []
    n_plots = 0
    for _ in range(3):
        cache.clear()
        cold, n_plots = dashboard_requests(client, run.run_id)
        cached, _ = dashboard_requests(client, run.run_id)
        colds.append(cold)
        cacheds.append(cached)
    cold, cached = min(colds), min(cacheds)
    revalidated = min(revalidate(client, run.run_id) for _ in range(3))
    browser = None
    if not args.no_browser and render_browser.available():
        browser = render_browser.figures(app, client, run.run_id, list(DASHBOARD_KEYS), args.points)

    bulk_runs(reg, args.runs)
    total = reg.list_runs(limit=1)[1]
    pages = {
        "first page": "/runs",
        "filter learning_rate>1e-5 and algorithm=GRPO": "/runs?q=learning_rate%3E1e-5+and+algorithm%3DGRPO",
        "deep page (150)": "/runs?page=150",
        "sorted by name": "/runs?order=name",
        "API, 50 runs": "/api/runs?limit=50",
    }
    page_times = {label: timed(client, u) for label, u in pages.items()}

    ok = True
    print(f"dashboard: {n_plots} plots x {args.points:,} points ({url.split(':')[0]})")
    print(f"  reference (matplotlib, {n_plots} curves pre-reduced to 2,000 points): {reference * 1000:8.1f} ms")
    ratio_cold = cold / reference
    print(f"  cold (page + {n_plots} images, empty cache)                      : {cold * 1000:8.1f} ms"
          f"   {ratio_cold:.2f}x reference  (target <= 2x)")
    ok &= ratio_cold <= 2.0
    speedup = cold / cached
    print(f"  cached (same requests again)                                  : {cached * 1000:8.1f} ms"
          f"   {speedup:.0f}x faster than cold (target >= 20x)")
    ok &= speedup >= 20
    print(f"  revalidated (page + {n_plots} x If-None-Match -> 304)                : {revalidated * 1000:8.1f} ms"
          f"   {cold / revalidated:.0f}x faster than cold")
    if browser is not None:
        ok &= render_browser.report(browser)
    else:
        print("interactive dashboard: skipped (--no-browser, or no /usr/bin/chromedriver)")
    print(f"runs page with {total:,} runs (median of 7):")
    for label, t in page_times.items():
        flag = "ok" if t < 0.2 else "MISSED"
        print(f"  {label:48s}: {t * 1000:8.1f} ms   {flag} (target < 200 ms)")
        ok &= t < 0.2
    reg.close()
    tmp.cleanup()
    print("all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
