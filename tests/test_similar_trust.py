"""Similar runs you can trust, on real SB3 and CleanRL runs in a real registry file: coverage-first
ranking, "no close match" against the collection's own nearest-neighbour distances, the
distance-weighted outcome with its base rate, and neighbours across frameworks."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from registry import Registry
from registry.cli.main import cli
from registry.analysis.similarity import brute_force, find_similar, refresh_embeddings
from registry.analysis.similarity.closeness import MIN_REFERENCE, REFERENCE_SAMPLE, sample_positions
from registry.analysis.similarity.concepts import equivalent_definitions
from registry.analysis.similarity.outcome import MIN_EFFECTIVE, kernel_weights, predict

REAL = Path(__file__).parent / "data" / "real"
SWEEP = REAL / "sb3_sweep"
CLEANRL = REAL / "cleanrl_ppo_cartpole" / "runs"
LABELS = yaml.safe_load((SWEEP / "labels.yaml").read_text())["runs"]
VERDICT = {"healthy": "success", "problem": "failed"}
CARTPOLE = sorted(n for n in LABELS if n.startswith("cartpole_"))


def add(reg: Registry, path: Path, name: str, framework: str, task: str, verdict: str | None = None) -> str:
    res = reg.register(path, name=name, algorithm="ppo", framework=framework, task=task)
    if verdict:
        reg.set_outcome(name, verdict=verdict)
    with reg.transaction() as s:
        refresh_embeddings(s, res.run_id)
    return res.run_id


def add_sweep(reg: Registry, names: list[str], verdicts: bool = True) -> None:
    for name in names:
        env = json.loads((SWEEP / name / "params.json").read_text())["env"]
        add(reg, SWEEP / name, name, "stable-baselines3", env,
            VERDICT.get(LABELS[name]["label"]) if verdicts else None)


def test_a_neighbour_compared_on_fewer_metrics_never_outranks_full_matches(registry: Registry):
    add_sweep(registry, CARTPOLE[:6])
    query = "cartpole_default_s1"
    add_sweep(registry, [query] if query not in CARTPOLE[:6] else [])
    # the query's own entropy curve as a run of its own: identical on 1 of the 3 metrics
    ent = registry.read_series(query, "train/entropy_loss")
    res = registry.register_arrays("entropy-copy", {"train/entropy_loss": (ent.steps, ent.values)},
                                   algorithm="ppo", framework="stable-baselines3", task="CartPole-v1")
    with registry.transaction() as s:
        refresh_embeddings(s, res.run_id)
    full = [n for n in CARTPOLE[:6] if n != query]
    got = find_similar(registry, query, k=len(full) + 1)
    names = [n.name for n in got.neighbours]
    assert names[-1] == "entropy-copy" and set(names[:-1]) == set(full)
    copy = got.neighbours[-1]
    assert copy.metric_distances["entropy"] < min(n.distance for n in got.neighbours[:-1])  # closer, yet last
    assert copy.coverage == "1 of 3 metrics" and copy.metrics_compared == 1 and copy.metrics_total == 3
    assert all(n.coverage == "3 of 3 metrics" for n in got.neighbours[:-1])
    # fewer places than full matches: the partial run is not listed at all
    assert "entropy-copy" not in [n.name for n in find_similar(registry, query, k=3).neighbours]
    truth = brute_force(registry, query, k=len(full) + 1)
    assert [n.name for n in truth.neighbours] == names
    # asked on entropy alone, the copy is a full match and the nearest
    assert find_similar(registry, query, metrics="entropy", k=1).neighbours[0].name == "entropy-copy"


def test_cleanrl_and_sb3_cartpole_runs_are_each_others_neighbours(registry: Registry):
    add_sweep(registry, ["cartpole_default_s1", "cartpole_default_s2", "cartpole_lr_1e-6", "acrobot_default_s1"],
              verdicts=False)
    add(registry, CLEANRL, "cleanrl-cartpole", "cleanrl", "CartPole-v1")
    res = find_similar(registry, "cleanrl-cartpole", k=3, same_task=True)
    assert res.metrics[0] == "episode_return"  # CleanRL's per-episode charts/episodic_return
    first = res.neighbours[0]
    assert first.name.startswith("cartpole_") and first.coverage == "3 of 3 metrics"
    assert any("compared with its episode_return_mean" in w for w in first.warnings)
    assert first.metric_distances["episode_return"] is not None
    back = find_similar(registry, "cartpole_default_s1", k=1, where="framework = cleanrl")
    assert [n.name for n in back.neighbours] == ["cleanrl-cartpole"]
    assert back.neighbours[0].metrics_compared == 3


def test_equivalent_definitions_come_from_the_dictionary_fields():
    base = {"quantity": "return", "layer": "objective", "unit": "u", "kl_estimator": "n/a",
            "normalization_axis": "none", "logging_point": "rollout"}
    rows = [{"name": "ret", "averaging": "none", **base}, {"name": "ret_mean", "averaging": "episode", **base},
            {"name": "ret_token", "averaging": "token", **base},
            {"name": "ret_eval", "averaging": "episode", **base, "logging_point": "eval"}]
    assert equivalent_definitions(rows) == {"ret": ("ret_mean",), "ret_mean": ("ret",)}


def test_no_close_match_is_judged_against_the_collections_own_distances(registry: Registry):
    add_sweep(registry, CARTPOLE)
    near = find_similar(registry, "cartpole_default_s1", k=3, where="name ~ cartpole")
    c = near.closeness
    assert c["status"] == "close" and not c["no_close_match"]
    assert c["reference_runs"] >= MIN_REFERENCE and c["median"] <= c["p95"]
    assert c["best_distance"] == pytest.approx(near.neighbours[0].distance)
    # a run unlike the CartPole sweep: the query's best distance sits above what is usual there
    add_sweep(registry, ["acrobot_lr_3e-2"])
    far = find_similar(registry, "acrobot_lr_3e-2", k=3, where="name ~ cartpole")
    f = far.closeness
    assert f["best_distance"] > f["p95"] and f["status"] == "far" and f["no_close_match"]
    assert "No close match" in far.summary and f"{f['p95']:.2f}" in far.summary
    # the reference is the collection's: a run added changes it
    add_sweep(registry, ["mountaincar_default_s1"])
    again = find_similar(registry, "cartpole_default_s1", k=3)
    assert again.closeness["reference_runs"] == len(CARTPOLE) + 2


def test_the_reference_sample_follows_the_curves_not_the_order_of_run_ids():
    """The runs sampled for the nearest-neighbour reference are chosen by their content: the same curves in
    another order (runs registered under other ids) give the same sample; a collection no larger than the sample
    is used whole."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * REFERENCE_SAMPLE, 32, 3))
    picked = {x[i].tobytes() for i in sample_positions(x)}
    perm = rng.permutation(len(x))
    assert {x[perm][i].tobytes() for i in sample_positions(x[perm])} == picked
    assert len(picked) == REFERENCE_SAMPLE
    assert list(sample_positions(x[:REFERENCE_SAMPLE])) == list(range(REFERENCE_SAMPLE))


def test_too_few_runs_to_know_what_close_means(registry: Registry):
    add_sweep(registry, CARTPOLE[:4])
    res = find_similar(registry, CARTPOLE[0], k=3)
    assert res.closeness["status"] == "unknown" and "Too few comparable runs" in res.closeness["message"]
    assert res.predicted_verdict is None and res.prediction["message"].startswith("Not enough similar runs")


def test_weighted_prediction_needs_close_neighbours_and_shows_the_base_rate():
    counts = {"failed": 6, "success": 3, None: 2}
    far = predict(["failed"] * 10, [3.0] * 10, [1.0] * 10, 1.0, counts)
    assert far.verdict is None and far.effective_neighbours < MIN_EFFECTIVE  # unanimous, but all far away
    assert far.message.startswith("Not enough similar runs")
    near = predict(["success", "success", "success", "failed", "failed"], [0.1, 0.2, 0.3, 1.5, 1.6],
                   [1, 1, 1, 1, 1], 0.5, counts)
    w = kernel_weights(np.array([0.1, 0.2, 0.3, 1.5, 1.6]), np.ones(5), 0.5)
    assert near.verdict == "success" and near.agreement == pytest.approx(w[:3].sum() / w.sum())
    assert near.effective_neighbours == pytest.approx(w.sum())
    assert near.base_rate == pytest.approx(3 / 9) and near.runs_with_verdict == 9
    assert "base rate 33%" in near.message
    partial = predict(["success"] * 3, [0.1] * 3, [1 / 3] * 3, 0.5, counts)
    assert partial.verdict is None  # compared on 1 of 3 metrics each: a third of the weight


def test_a_split_vote_or_one_that_only_repeats_the_base_rate_is_not_a_prediction():
    counts = {"failed": 6, "success": 3}
    split = predict(["success", "failed", "success", "failed"], [0.1, 0.1, 0.2, 0.2], [1] * 4, 0.5, counts)
    assert split.verdict is None and split.agreement == pytest.approx(0.5)
    assert split.message.startswith("No prediction: the similar runs ended") and "needs 67%" in split.message
    # 70% failed among close neighbours, where 6 of 9 runs of the collection failed anyway: no lift
    common = predict(["failed"] * 7 + ["success"] * 3, [0.1] * 10, [1] * 10, 0.5, {"failed": 8, "success": 2})
    assert common.verdict is None and "no more common among them than in the collection (80%)" in common.message
    clear = predict(["failed"] * 8 + ["success"] * 2, [0.1] * 10, [1] * 10, 0.5, {"failed": 1, "success": 1})
    assert clear.verdict == "failed" and clear.agreement == pytest.approx(0.8)


def test_prediction_in_a_labelled_registry(registry: Registry):
    names = CARTPOLE
    add_sweep(registry, names)
    res = find_similar(registry, "cartpole_default_s2", k=10)
    p = res.prediction
    others = [VERDICT.get(LABELS[n]["label"]) for n in names if n != "cartpole_default_s2"]
    known = [v for v in others if v]
    assert p["runs_with_verdict"] == len(known)
    assert p["base_rates"]["failed"] == pytest.approx(known.count("failed") / len(known))
    shares = {}
    for n in res.neighbours:
        if n.verdict:
            shares[n.verdict] = shares.get(n.verdict, 0.0) + float(np.exp(-0.5 * (n.distance / p["bandwidth"]) ** 2))
    assert p["effective_neighbours"] == pytest.approx(sum(shares.values()))
    assert res.predicted_verdict == p["verdict"]
    if p["verdict"]:
        assert p["verdict"] == max(shares, key=shares.get)


def test_cli_shows_coverage_closeness_and_outcome(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    reg = Registry(url)
    add_sweep(reg, CARTPOLE)
    reg.close()
    out = CliRunner().invoke(cli, ["--db", url, "similar", "cartpole_default_s1", "-k", "3"],
                             env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "3 of 3 metrics" in out.output and "compared on" in out.output
    assert "closeness: The nearest run is" in out.output
    assert any(said in out.output for said in ("Likely outcome", "Not enough similar runs", "No prediction"))
    js = json.loads(CliRunner().invoke(cli, ["--db", url, "similar", "cartpole_default_s1", "--json"]).output)
    assert js["closeness"]["status"] == "close" and "effective_neighbours" in js["prediction"]
    assert all(n["coverage"] == "3 of 3 metrics" for n in js["neighbours"])


def test_web_panel_and_api_show_coverage_closeness_and_outcome(tmp_path: Path, openapi):
    from registry.web.app import create_app
    from test_web_support import check_response

    reg = Registry(f"sqlite:///{tmp_path / 'web.db'}")
    add_sweep(reg, CARTPOLE + ["acrobot_lr_3e-2"])
    client = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "trust", "PLOT_REF_TTL": 0}).test_client()
    ids = {n: reg.run_detail(n)["id"] for n in ("cartpole_default_s1", "acrobot_lr_3e-2")}
    page = client.get(f"/runs/{ids['cartpole_default_s1']}").get_data(as_text=True)
    panel = page[page.index('id="similar-panel"'):]
    panel = panel[:panel.index("</section>")]
    assert ">Compared on</th>" in panel and panel.count(">3 of 3 metrics</td>") == 10
    assert 'id="similar-close"' in panel and 'id="similar-far"' not in panel
    assert 'id="similar-prediction"' in panel
    far = client.get(f"/runs/{ids['acrobot_lr_3e-2']}").get_data(as_text=True)
    far = far[far.index('id="similar-panel"'):]
    assert 'id="similar-far"' in far[:far.index("</section>")] and "No close match" in far
    api = client.get(f"/api/runs/{ids['acrobot_lr_3e-2']}/similar")
    body = api.get_json()
    assert body["closeness"]["no_close_match"] and body["closeness"]["best_distance"] > body["closeness"]["p95"]
    assert body["neighbours"][0]["coverage"] == "3 of 3 metrics"
    with_verdict = [n for n in CARTPOLE if LABELS[n]["label"] != "borderline"]  # borderline runs have none
    assert body["prediction"]["runs_with_verdict"] == len(with_verdict)
    check_response(openapi, api, f"/api/runs/{ids['acrobot_lr_3e-2']}/similar")
    reg.close()


def test_a_registry_with_one_run_answers_with_no_neighbours(tmp_path) -> None:
    """The first run of a registry has nothing to be compared with: an empty answer, not an error."""
    from registry import open_registry
    from registry.analysis.similarity import find_similar_for_run

    reg = open_registry(f"sqlite:///{tmp_path / 'one.db'}")
    steps = np.arange(200)
    run_id = reg.register_arrays("only", {"rollout/ep_rew_mean": (steps, np.tanh(steps / 50.0) * 500)},
                                 framework="stable-baselines3", project="p").run_id
    result = find_similar_for_run(reg, run_id)
    assert result.neighbours == []
    reg.close()
