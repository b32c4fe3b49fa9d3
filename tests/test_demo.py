"""The demo registry: realistic runs of both projects, bound through real framework aliases."""
from __future__ import annotations

from registry import open_registry
from registry.demo.builder import DEFAULT_REAL_DATA, FRAMEWORK_PAIR, PROJECTS, REAL_FRAMEWORK_RUNS, REAL_RUN_OUTCOMES, build_demo
from registry.analysis.health import diagnose_run


def test_demo_builds_projects_with_bound_metrics_and_outcomes(sqlite_url: str, sb3_runs):
    summary = build_demo(sqlite_url, shared_data=sb3_runs, echo=lambda _: None)
    expected = sum(len(kinds) for *_, kinds in PROJECTS) + len(FRAMEWORK_PAIR)
    framework_runs = [p for pattern, *_ in REAL_FRAMEWORK_RUNS for p in DEFAULT_REAL_DATA.glob(pattern)]
    assert len(framework_runs) >= 5  # CleanRL, the SB3 logger, TRL GRPO runs, verl's file logger
    assert f"{expected} synthetic and {4 + len(framework_runs)} real" in summary
    reg = open_registry(sqlite_url)
    rows, total = reg.list_runs(limit=None)
    assert total == expected + 4 + len(framework_runs)
    assert {r["project"] for r in rows} == {"math-grpo", "control-ppo", "sb3-classic-control", "cleanrl-cartpole",
                                            "trl-tiny", "verl-tiny", "math-grpo-frameworks"}
    # Synthetic runs and the labelled shared runs carry verdicts; runs nobody judged carry none.
    judged = [r for r in rows if "demo" in r["tags"] or r["name"] in REAL_RUN_OUTCOMES]
    assert len(judged) == expected + 4 and all(r["verdict"] for r in judged)
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


def test_demo_seed_groups_step_scales_verdicts_baselines_and_closing_pages(sqlite_url: str, sb3_runs):
    from registry.analysis.health import current_findings
    from registry.analysis.baselines import get_baseline
    from registry.web.app import create_app
    from registry.web.compare_curves import build_units

    summary = build_demo(sqlite_url, shared_data=sb3_runs, echo=lambda _: None)
    reg = open_registry(sqlite_url)
    # The CLI can be pointed at the demo's registry with the line it prints.
    assert f"export RLREG_DATABASE_URL={sqlite_url}" in summary
    for project, _, _, task, kinds in PROJECTS:
        rows, _ = reg.list_runs(where=f"project={project}", limit=None)
        # One step scale per project: every run ends at the same last step.
        last_steps = {max(s["last_step"] for s in reg.run_detail(r["id"])["series"]) for r in rows}
        assert len(last_steps) == 1, (project, last_steps)
        seeds = [reg.run_detail(f"{project}-healthy-s{seed}") for kind, seed in kinds if kind == "healthy"]
        # The healthy seeds differ only in their seed, so the compare view groups them as one.
        units = build_units(seeds, group_seeds=True)
        assert len(units) == 1 and units[0].is_group
        assert {s["verdict"] for s in seeds} == {"success"}
        # ... and the diagnosis raises nothing on them (a healthy seed with a warning would be a false alarm).
        for seed_run in seeds:
            assert current_findings(reg, seed_run["id"]).n_problems == 0, (seed_run["name"], current_findings(
                reg, seed_run["id"]).lines)
        assert get_baseline(reg, task) is not None
    # Verdicts follow the run's curves: the KL blow-up diverged or failed, the zero reward failed.
    assert reg.run_detail("math-grpo-kl_blowup-s0")["verdict"] in ("diverged", "failed")
    assert reg.run_detail("math-grpo-reward_zero-s0")["verdict"] == "failed"
    # The two-framework pair warns before overlaying: verl's k1 KL against TRL's k3.
    pair = [reg.run_detail(name) for name, *_ in FRAMEWORK_PAIR]
    assert {r["framework"] for r in pair} == {"verl", "trl"} and len({r["task"] for r in pair}) == 1
    estimators = {s["semantics"].get("kl_estimator") for r in pair for s in r["series"]
                  if s["definition"] == "kl_ref_mean"}
    assert estimators == {"k1", "k3"}
    # The three pages it names open.
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()
    pages = [line.split(": ", 1)[1] for line in summary.splitlines() if line.startswith("  ") and ": /" in line]
    assert len(pages) == 3
    for page in pages:
        response = client.get(page.split("#")[0])
        assert response.status_code == 200, page
        if page.startswith("/compare"):
            assert "KL estimator: k3 vs k1" in response.get_data(as_text=True)
    reg.close()
