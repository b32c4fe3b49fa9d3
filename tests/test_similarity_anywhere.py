"""Anywhere searches (SQLite and PostgreSQL): a window of the query matched wherever it lies in other runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.core.errors import InputError
from registry.analysis.similarity import find_similar, refresh_embeddings

METRICS = ("episode_return_mean", "kl_old_mean", "entropy")
EVENT_WIDTH = 0.08  # of training: a KL spike, an entropy drop and a dip in the return


def curves(n: int, event_at: float | None, seed: int, stride: int = 10) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A healthy PPO-like run of n logged points; with ``event_at`` an instability centred there."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n) * stride
    x = np.linspace(0.0, 1.0, n)
    ret = 200 * (1 - np.exp(-3 * x))
    kl = 0.01 + 0.002 * x
    ent = 0.69 - 0.2 * x
    if event_at is not None:
        bump = np.exp(-0.5 * ((x - event_at) / (EVENT_WIDTH / 4)) ** 2)
        ret, kl, ent = ret - 60 * bump, kl + 0.08 * bump, ent - 0.25 * bump
    noise = rng.standard_normal((3, n))
    return {"episode_return_mean": (steps, ret + 2 * noise[0]), "kl_old_mean": (steps, kl + 5e-4 * noise[1]),
            "entropy": (steps, ent + 2e-3 * noise[2])}


def add(reg: Registry, name: str, data: dict, verdict: str) -> str:
    res = reg.register_arrays(name, data, algorithm="ppo", task="synthetic-cartpole", framework="custom",
                              outcome={"verdict": verdict})
    with reg.transaction() as s:
        refresh_embeddings(s, res.run_id)
    return res.run_id


@pytest.fixture
def planted(registry: Registry) -> dict[str, float | None]:
    """Runs of varied lengths: eight with the event at different points of training, twelve without
    (run id -> where the event is; ``SPANS``: run id -> its last step)."""
    where: dict[str, float | None] = {}
    SPANS.clear()
    for i, at in enumerate((0.15, 0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.5)):
        rid = add(registry, f"event-{i}", curves(300 + 70 * i, at, seed=i), "diverged")
        where[rid], SPANS[rid] = at, (299 + 70 * i) * 10
    for i in range(12):
        rid = add(registry, f"calm-{i}", curves(250 + 55 * i, None, seed=100 + i), "success")
        where[rid], SPANS[rid] = None, (249 + 55 * i) * 10
    return where


SPANS: dict[str, int] = {}


def query_run(reg: Registry) -> str:
    return add(reg, "query", curves(400, 0.3, seed=999), "diverged")


def test_anywhere_finds_the_pattern_wherever_it_happened_and_says_where(registry: Registry, planted):
    q = query_run(registry)
    res = find_similar(registry, q, k=8, window=(0.22, 0.38), anywhere=True)
    assert res.engine.startswith("numpy subsequence")
    names = [n.name for n in res.neighbours]
    assert sorted(names) == sorted(f"event-{i}" for i in range(8)), names
    for n in res.neighbours:
        at = planted[n.run_id]
        centre = n.match_start + 0.08  # the window is 16% wide, the event in its middle
        assert centre == pytest.approx(at, abs=0.03), (n.name, n.match_start, at)
        steps = n.compared_steps["kl_old_mean"]
        assert steps[1] > steps[0]
    assert res.query["anywhere"] and "anywhere in each run" in res.summary
    assert "8 of the 8 nearest runs diverged" in res.summary and "The pattern sat at a median" in res.summary
    # the same window matched only against the same portion of training misses the late events
    same = find_similar(registry, q, k=8, window=(0.22, 0.38))
    found = {planted[n.run_id] for n in same.neighbours if planted[n.run_id] is not None}
    assert 0.3 in found and not found & {0.65, 0.75, 0.85}


def test_two_stages_agree_with_every_start_of_every_run(registry: Registry, planted):
    q = query_run(registry)
    for kwargs in ({"window": (0.22, 0.38)}, {"prefix": 0.4}, {"window": (0.22, 0.38), "normalize": "raw"}):
        fast = find_similar(registry, q, k=5, anywhere=True, **kwargs)
        exact = find_similar(registry, q, k=5, anywhere=True, exact=True, **kwargs)
        assert exact.stats["dtw_computed"] > 20 * fast.stats["dtw_computed"] / 5
        assert [n.run_id for n in fast] == [n.run_id for n in exact]
        assert [n.distance for n in fast] == pytest.approx([n.distance for n in exact], rel=0.02)
        assert [n.distance for n in exact] == sorted(n.distance for n in exact)


def test_step_aligned_anywhere_excludes_runs_shorter_than_the_window(registry: Registry, planted):
    q = query_run(registry)  # 4,000 steps
    res = find_similar(registry, q, k=5, window=(500, 3500), align="step", anywhere=True)
    # runs under 3,000 steps cannot hold the window; the others are searched at every start
    short = [rid for rid in planted if SPANS[rid] < 3000]
    assert short and res.excluded_counts["too_short"] == len(short)
    group = next(g for g in res.excluded if g["reason"] == "too_short")
    assert group["differences"] == ["the run is shorter than the query window"]
    assert not {n.run_id for n in res.neighbours} & set(short)
    for n in res.neighbours:
        a, b = n.compared_steps["kl_old_mean"]
        assert b - a == pytest.approx(3000, abs=60)


def test_anywhere_needs_a_portion(registry: Registry, planted):
    q = query_run(registry)
    with pytest.raises(InputError, match="anywhere needs a window or a prefix"):
        find_similar(registry, q, anywhere=True)


def test_cli_and_api_anywhere(registry: Registry, planted):
    from registry.cli.main import cli
    from registry.web.app import create_app

    q = query_run(registry)
    out = CliRunner().invoke(cli, ["--db", registry.url, "similar", q, "--window", "0.22,0.38", "--anywhere",
                                   "-k", "3"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "matched at" in out.output and "anywhere in each run" in out.output
    out = CliRunner().invoke(cli, ["--db", registry.url, "similar", q, "--window", "0.22,0.38", "--anywhere",
                                   "-k", "3", "--json"], catch_exceptions=False)
    data = json.loads(out.output)
    assert data["query"]["anywhere"] is True and all(n["match_start"] is not None for n in data["neighbours"])
    client = create_app({"REGISTRY": registry, "TESTING": True}).test_client()
    got = client.get(f"/api/runs/{q}/similar?window=0.22,0.38&anywhere=1&k=3").get_json()
    assert [n["run_id"] for n in got["neighbours"]] == [n["run_id"] for n in data["neighbours"]]
    plain = client.get(f"/api/runs/{q}/similar?window=0.22,0.38&k=3").get_json()
    assert plain["query"]["anywhere"] is False and all(n["match_start"] is None for n in plain["neighbours"])


def test_cascade_with_its_paa_stage_still_finds_every_occurrence(registry: Registry, planted, monkeypatch):
    """Stage 1b (PAA-32 DTW) runs once stage 1 passes more runs than the exact pool: shrink both
    so that it runs on this small collection."""
    from registry.analysis.similarity import anywhere as A

    monkeypatch.setattr(A, "STAGE1_MIN", 14)
    monkeypatch.setattr(A, "POOL_MIN", 9)
    monkeypatch.setattr(A, "POOL_PER_K", 1)
    q = query_run(registry)
    res = find_similar(registry, q, k=8, window=(0.22, 0.38), anywhere=True)
    assert res.stats["dtw_computed"] <= 9 * (2 * A.NEAR + 1)
    assert sorted(n.name for n in res.neighbours) == sorted(f"event-{i}" for i in range(8))
    exact = find_similar(registry, q, k=8, window=(0.22, 0.38), anywhere=True, exact=True)
    assert [n.distance for n in res.neighbours] == pytest.approx([n.distance for n in exact.neighbours], rel=0.05)
