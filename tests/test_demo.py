"""The demo registry: realistic runs of both projects, bound through real framework aliases."""
from __future__ import annotations

from registry import Registry
from registry.demo import PROJECTS, build_demo
from registry.health import diagnose_run


def test_demo_builds_projects_with_bound_metrics_and_outcomes(sqlite_url: str, sb3_runs):
    summary = build_demo(sqlite_url, shared_data=sb3_runs, echo=lambda _: None)
    expected = sum(len(kinds) for *_, kinds in PROJECTS)
    assert f"{expected} synthetic and 4 real" in summary
    reg = Registry(sqlite_url)
    rows, total = reg.list_runs(limit=None)
    assert total == expected + 4
    assert {r["project"] for r in rows} == {"math-grpo", "control-ppo", "sb3-classic-control"}
    assert all(r["verdict"] for r in rows)
    grpo = reg.run_detail("math-grpo-kl_blowup-s0")
    assert grpo["framework"] == "verl" and grpo["checkpoints"]
    unmapped = [s["key"] for s in grpo["series"] if s["definition"] is None]
    assert unmapped == []
    kl = next(s for s in grpo["series"] if s["key"] == "actor/ppo_kl")
    assert kl["semantics"]["kl_estimator"] == "k1"
    # The demo's failures are visible to diagnosis; its healthy seeds are not flagged.
    blowup = diagnose_run(reg, "math-grpo-kl_blowup-s0")
    assert {f.detector for f in blowup.at_least("warning")} & {"kl_spike", "kl_climb", "clip_high"}
    assert diagnose_run(reg, "math-grpo-healthy-s0").healthy
    assert diagnose_run(reg, "cartpole_healthy_s0").healthy
    # Building again adds nothing.
    assert "0 synthetic and 0 real" in build_demo(sqlite_url, shared_data=sb3_runs, echo=lambda _: None)
    reg.close()
