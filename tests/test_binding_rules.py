"""Binding rules: the run's own framework, logger prefixes, templates, config semantics, provenance."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from registry import Registry, open_registry
from registry.store.auth import create_token, create_user
from registry.dictionary.binding import AliasIndex
from registry.cli.dictionary import shipped_alias_index
from registry.cli.main import cli
from registry.core.errors import FilterSyntaxError, InputError
from registry.importers import open_source
from registry.dictionary.keycheck import check_key_lists, read_key_list, unbound_keys
from registry.web.app import create_app

DATA = Path(__file__).resolve().parent / "data"
KEY_LISTS = DATA / "framework_keys"


def write_events(directory: Path, tags: dict[str, list[tuple[int, float]]], text: dict[str, str] | None = None) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    for tag, body in (text or {}).items():
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto([body]))
        value.metadata.plugin_data.plugin_name = "text"
        writer.add_event(event_pb2.Event(step=0, wall_time=1.7e9, summary=summary_pb2.Summary(value=[value])))
    for tag, points in tags.items():
        for step, v in points:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=v)])
            writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary))
    writer.close()


def by_key(detail: dict) -> dict[str, dict]:
    return {s["key"]: s for s in detail["series"]}


def trl_tensorboard(directory: Path) -> Path:
    """What transformers' TensorBoard callback writes for a TRL GRPO run (rewrite_logs: train/, eval/)."""
    steps = [5, 10, 15]
    tags = {f"train/{k}": [(s, v + s / 100) for s in steps] for k, v in {
        "kl": 0.001, "reward": 0.4, "reward_std": 0.3, "rewards/accuracy_reward/mean": 0.2,
        "rewards/accuracy_reward/std": 0.4, "completions/mean_length": 300.0, "clip_ratio/region_mean": 0.001,
        "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "entropy": 0.6, "loss": 0.01, "grad_norm": 0.2,
        "learning_rate": 1e-6, "epoch": 0.01, "global_step": 5.0,
    }.items()}
    tags["eval/reward"] = [(10, 0.5)]
    tags["eval/kl"] = [(10, 0.002)]
    write_events(directory, tags)
    return directory


def test_trl_logged_through_transformers_tensorboard_binds_to_trl(registry: Registry, tmp_path):
    path = trl_tensorboard(tmp_path / "grpo-run")
    for declared in ("trl", None):
        result = registry.register(path, framework=declared, replace=True)
        series = by_key(registry.run_detail(result.run_id))
        kl = series["train/kl"]
        assert kl["definition"] == "kl_ref_mean" and kl["alias_framework"] == "trl"
        assert kl["semantics"]["kl_estimator"] == "k3"  # TRL's kl, not OpenRLHF's k1 train/kl
        assert kl["provenance"]["how"] == "alias" and kl["provenance"]["logger_prefix"] == "train/"
        assert kl["provenance"]["fields"]["kl_estimator"] == {"from": "alias", "framework": "trl"}
        assert not result.guessed
        mapped = {k for k in result.mapped}
        assert {"train/reward", "train/rewards/accuracy_reward/mean", "train/completions/mean_length",
                "train/clip_ratio/region_mean", "train/loss", "train/grad_norm", "train/entropy"} <= mapped
        # Eval series are their own series, logged at eval.
        assert series["eval/reward"]["semantics"]["logging_point"] == "eval"
        assert series["eval/reward"]["labels"] == {"split": "eval"}
        assert series["eval/reward"]["provenance"]["fields"]["logging_point"]["from"] == "layout"
    info = registry.run_detail(result.run_id)["binding"]
    assert info["framework_from"] == "detected" and info["detection"]["confidence"] >= 0.9
    assert info["algorithm"] == "grpo" and info["algorithm_from"] == "detected"


def test_another_frameworks_key_is_bound_only_as_guessed_and_shown(db_url):
    reg = open_registry(db_url)
    result = reg.register_arrays("verl-with-stray-key", {
        "actor/kl_loss": ([1, 2], [0.01, 0.02]),
        "train/kl": ([1, 2], [0.1, 0.2]),          # an OpenRLHF key, not a verl one
        "my/probe": ([1, 2], [1.0, 2.0]),
    }, framework="verl")
    assert result.guessed == {"train/kl": "openrlhf"}
    series = by_key(reg.run_detail(result.run_id))
    guessed = series["train/kl"]
    assert guessed["provenance"]["how"] == "guessed" and guessed["provenance"]["guessed_from"] == ["openrlhf"]
    assert guessed["provenance"]["fields"]["kl_estimator"]["from"] == "guessed"
    assert series["actor/kl_loss"]["provenance"]["how"] == "alias"
    assert series["my/probe"]["definition"] is None  # nothing dropped: unmapped, stored

    app = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "t"})
    page = app.test_client().get(f"/runs/{result.run_id}").get_data(as_text=True)
    assert "guessed binding" in page and "Guessed bindings." in page and "<code>train/kl</code>" in page
    shown = CliRunner().invoke(cli, ["--db", db_url, "show", result.run_id], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "(guessed)" in shown.output
    reg.close()


def test_several_aliases_of_the_runs_framework_are_an_error_unless_decided(registry: Registry):
    with pytest.raises(InputError) as err:
        registry.register_arrays("ambiguous", {"kl": ([1], [0.1]), "reward": ([1], [0.5])}, framework="trl")
    message = str(err.value)
    assert "'kl' matches several trl aliases" in message and "kl (grpo)" in message and "kl (rloo)" in message
    assert registry.list_runs()[1] == 0  # nothing half-written
    result = registry.register_arrays("decided", {"kl": ([1], [0.1])}, framework="trl", algorithm="RLOO")
    kl = by_key(registry.run_detail(result.run_id))["kl"]
    assert kl["semantics"]["kl_estimator"] == "k1" and kl["provenance"]["alias_algorithm"] == "rloo"
    # The user's own semantics decide too.
    result = registry.register_arrays("overridden", {"kl": ([1], [0.1])}, framework="trl",
                                      semantics={"kl": {"kl_estimator": "k3", "logging_point": "before_grad_accumulation"}})
    kl = by_key(registry.run_detail(result.run_id))["kl"]
    assert kl["definition"] == "kl_ref_mean" and kl["provenance"]["how"] == "overridden"
    assert kl["provenance"]["fields"]["kl_estimator"] == {"from": "override"}


def test_templated_aliases_capture_labels(registry: Registry):
    result = registry.register_arrays("templated", {
        "val-core/openai/gsm8k/reward/mean@4": ([10, 20], [0.4, 0.5]),
        "val-aux/lighteval/MATH/acc/mean@1": ([10, 20], [0.2, 0.3]),
        "timing_s/update_actor": ([1, 2], [30.0, 31.0]),
    }, framework="verl")
    series = by_key(registry.run_detail(result.run_id))
    core = series["val-core/openai/gsm8k/reward/mean@4"]
    assert core["definition"] == "eval_reward_mean"
    assert core["labels"] == {"data_source": "openai/gsm8k", "var": "reward", "n": "4"}
    assert series["val-aux/lighteval/MATH/acc/mean@1"]["labels"] == {"data_source": "lighteval/MATH", "var": "acc", "n": "1"}
    assert series["timing_s/update_actor"]["labels"] == {"stage": "update_actor"}
    # One definition serves every data source; runs filter on the labels.
    result = registry.register_arrays("trl-rewards", {
        "rewards/accuracy_reward/mean": ([1], [0.1]), "rewards/my_judge/mean": ([1], [0.3]),
        "rewards/my_judge/std": ([1], [0.2]),
    }, framework="trl", algorithm="grpo")
    series = by_key(registry.run_detail(result.run_id))
    assert series["rewards/my_judge/mean"]["definition"] == "reward_component_mean"
    assert series["rewards/my_judge/mean"]["labels"] == {"reward_func_name": "my_judge"}
    assert series["rewards/accuracy_reward/mean"]["definition"] == "reward_accuracy_mean"  # exact alias first


@pytest.mark.parametrize("loss_type,estimator", [("kl", "k1"), ("low_var_kl", "k3"), ("mse", "k2"), ("abs", "abs"),
                                                  ("k3+", "k3")])
def test_verl_kl_loss_type_from_config(registry: Registry, loss_type, estimator):
    params = {"actor_rollout_ref": {"actor": {"kl_loss_type": loss_type, "use_kl_loss": True,
                                              "loss_agg_mode": "seq-mean-token-mean"}},
              "algorithm": {"adv_estimator": "grpo"}}
    result = registry.register_arrays(f"verl-{loss_type}", {
        "actor/kl_loss": ([1, 2], [0.01, 0.02]), "critic/advantages/mean": ([1, 2], [0.0, 0.1]),
    }, framework="verl", params=params)
    series = by_key(registry.run_detail(result.run_id))
    kl = series["actor/kl_loss"]
    assert kl["semantics"]["kl_estimator"] == estimator
    origin = kl["provenance"]["fields"]["kl_estimator"]
    assert origin["from"] == "config" and origin["param"] == "actor_rollout_ref.actor.kl_loss_type"
    assert origin["config_value"] == loss_type and "core_algos.py" in origin["source"]
    assert kl["semantics"]["averaging"] == "sequence"  # loss_agg_mode seq-mean-token-mean
    assert series["critic/advantages/mean"]["semantics"]["normalization_axis"] == "group"
    assert result.binding["algorithm"] == "grpo" and result.binding["algorithm_from"].startswith("config")
    assert not result.warnings


def test_command_line_override_beats_config(registry: Registry):
    params = {"actor_rollout_ref": {"actor": {"kl_loss_type": "low_var_kl"}}}
    result = registry.register_arrays("verl-override", {"actor/kl_loss": ([1], [0.01])}, framework="verl",
                                      params=params, semantics={"actor/kl_loss": {"kl_estimator": "k1"}})
    kl = by_key(registry.run_detail(result.run_id))["actor/kl_loss"]
    assert kl["semantics"]["kl_estimator"] == "k1" and kl["provenance"]["fields"]["kl_estimator"] == {"from": "override"}


def test_config_contradicting_a_key_warns_on_the_run(registry: Registry):
    result = registry.register_arrays("trl-beta0", {"kl": ([1, 2], [0.0, 0.01]), "reward": ([1, 2], [0.1, 0.2])},
                                      framework="trl", algorithm="grpo", params={"beta": 0.0})
    assert any("beta=0.0" in w and "kl" in w for w in result.warnings)
    detail = registry.run_detail(result.run_id)
    assert detail["binding"]["warnings"] == result.warnings
    app = create_app({"REGISTRY": registry, "TESTING": True, "SECRET_KEY": "t"})
    page = app.test_client().get(f"/runs/{result.run_id}").get_data(as_text=True)
    assert "Config contradicts a key." in page
    quiet = registry.register_arrays("trl-beta", {"kl": ([1], [0.01])}, framework="trl", algorithm="grpo",
                                     params={"beta": 0.04})
    assert not quiet.warnings


def test_framework_version_outside_a_rule_skips_it(registry: Registry):
    params = {"actor_rollout_ref": {"actor": {"kl_loss_type": "kl"}}}
    result = registry.register_arrays("old-verl", {"actor/kl_loss": ([1], [0.01])}, framework="verl==0.3.0",
                                      params=params)
    kl = by_key(registry.run_detail(result.run_id))["actor/kl_loss"]
    assert kl["semantics"]["kl_estimator"] == "k3"
    assert kl["provenance"]["fields"]["kl_estimator"] == {"from": "alias", "framework": "verl",
                                                          "framework_version": "0.3.0"}
    assert any("not read" in n for n in kl["provenance"]["notes"])


def test_compare_view_shows_config_provenance(registry: Registry):
    ids = []
    for loss_type in ("kl", "low_var_kl"):
        params = {"actor_rollout_ref": {"actor": {"kl_loss_type": loss_type}}}
        ids.append(registry.register_arrays(f"cmp-{loss_type}", {"actor/kl_loss": ([1, 2, 3], [0.01, 0.02, 0.03])},
                                            framework="verl", params=params).run_id)
    app = create_app({"REGISTRY": registry, "TESTING": True, "SECRET_KEY": "t"})
    page = app.test_client().get("/compare?" + "&".join(f"run={i}" for i in ids)).get_data(as_text=True)
    assert "from config: kl_loss_type=low_var_kl" in page and "from config: kl_loss_type=kl" in page


# --- formats ----------------------------------------------------------------------------------------


def test_verl_file_backend_with_a_partial_last_line(registry: Registry, tmp_path):
    path = tmp_path / "exp.jsonl"
    lines = [json.dumps({"step": s, "data": {"actor/kl_loss": 0.01 * s, "critic/score/mean": 0.1 * s,
                                              "actor/pg_clipfrac": 0.002}}) for s in (1, 2, 3)]
    path.write_text("\n".join(lines) + "\n" + '{"step": 4, "data": {"actor/kl_lo', encoding="utf-8")
    source = open_source(path)
    assert source.format == "verl_file" and source.framework == "verl"
    result = registry.register(path)
    assert result.framework == "verl" and result.point_count == 9
    assert any("line 4: the last line is an incomplete record" in w for w in result.warnings)
    series = by_key(registry.run_detail(result.run_id))
    assert set(series) == {"actor/kl_loss", "critic/score/mean", "actor/pg_clipfrac"}
    assert series["actor/kl_loss"]["definition"] == "kl_ref_mean"
    assert result.binding["layout"]["partial last line"] == "line 4"
    # Damage before the last line is an error naming the line.
    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\n" + '{"step": 2, "data": {"x' + "\n" + lines[2] + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2"):
        registry.register(broken)


def test_sb3_progress_csv_and_json(registry: Registry, tmp_path):
    run = tmp_path / "ppo_cartpole"
    run.mkdir()
    header = ["rollout/ep_len_mean", "rollout/ep_rew_mean", "time/fps", "time/iterations", "time/time_elapsed",
              "time/total_timesteps", "train/approx_kl", "train/clip_fraction", "train/clip_range",
              "train/entropy_loss", "train/explained_variance", "train/learning_rate", "train/loss",
              "train/n_updates", "train/policy_gradient_loss", "train/value_loss"]
    rows = [[22.1, 22.1, 1500, 1, 1, 2048, "", "", "", "", "", "", "", "", "", ""],
            [27.5, 27.5, 1100, 2, 3, 4096, 0.0087, 0.1, 0.2, -0.686, 0.001, 0.0003, 6.9, 10, -0.015, 50.1]]
    (run / "progress.csv").write_text(",".join(header) + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    result = registry.register(run / "progress.csv", params={"clip_range": 0.2, "n_epochs": 10, "ent_coef": 0.0})
    assert result.name == "ppo_cartpole" and result.framework == "stable-baselines3"
    assert result.binding["layout"]["step column"] == "time/total_timesteps"
    detail = registry.run_detail(result.run_id)
    series = by_key(detail)
    assert series["rollout/ep_rew_mean"]["first_step"] == 2048 and series["train/approx_kl"]["first_step"] == 4096
    assert series["train/clip_fraction"]["provenance"]["notes"][0] == "clip_range=0.2"
    assert "time/total_timesteps" not in series
    json_lines = [json.dumps(dict(zip(header, r))) for r in rows]
    (run / "progress.json").write_text("\n".join(line.replace('""', "null") for line in json_lines) + "\n")
    result = registry.register(run / "progress.json")
    assert result.framework == "stable-baselines3"
    assert by_key(registry.run_detail(result.run_id))["train/approx_kl"]["semantics"]["kl_estimator"] == "k3"


def test_cleanrl_hyperparameters_text_and_run_name(registry: Registry, tmp_path):
    run = tmp_path / "runs" / "CartPole-v1__ppo__3__1733300000"
    hyper = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in {
        "exp_name": "ppo", "seed": 3, "env_id": "CartPole-v1", "learning_rate": 0.00025, "clip_coef": 0.2,
        "ent_coef": 0.01, "update_epochs": 4, "anneal_lr": True, "capture_video": False}.items())
    write_events(run, {"charts/episodic_return": [(100, 12.0), (200, 20.0)], "losses/approx_kl": [(128, 0.01)],
                       "losses/clipfrac": [(128, 0.05)], "losses/entropy": [(128, 0.69)]},
                 text={"hyperparameters/text_summary": hyper})
    result = registry.register(run)
    detail = registry.run_detail(result.run_id)
    assert detail["task"] == "CartPole-v1" and detail["framework"] == "cleanrl"
    assert detail["params"]["seed"] == 3 and detail["params"]["learning_rate"] == pytest.approx(0.00025)
    assert detail["params"]["anneal_lr"] is True and detail["params"]["clip_coef"] == pytest.approx(0.2)
    clipfrac = by_key(detail)["losses/clipfrac"]
    assert "clip_coef=0.2" in clipfrac["provenance"]["notes"]


def test_tensorboard_directory_of_runs_registers_as_several_runs(db_url, tmp_path):
    root = tmp_path / "runs"
    for seed in (1, 2, 3):
        write_events(root / f"CartPole-v1__ppo__{seed}__173330000{seed}",
                     {"charts/episodic_return": [(100, 10.0 + seed)], "losses/approx_kl": [(128, 0.01)],
                      "losses/clipfrac": [(128, 0.05)]})
    out = CliRunner().invoke(cli, ["--db", db_url, "register", str(root), "--json"])
    assert out.exit_code == 0, out.output
    results = json.loads(out.output)
    assert len(results) == 3 and {r["framework"] for r in results} == {"cleanrl"}
    reg = open_registry(db_url)
    runs, total = reg.list_runs()
    assert total == 3 and sorted(r["params"]["seed"] for r in runs) == [1, 2, 3]
    # A second registration of the same directory is refused for every run and leaves nothing new.
    again = CliRunner().invoke(cli, ["--db", db_url, "register", str(root)])
    assert reg.list_runs()[1] == 3, again.output
    reg.close()


def test_several_runs_are_all_or_nothing(registry: Registry, tmp_path):
    root = tmp_path / "runs"
    write_events(root / "PPO_1", {"rollout/ep_rew_mean": [(2048, 20.0)], "train/approx_kl": [(2048, 0.01)]})
    write_events(root / "PPO_2", {"rollout/ep_rew_mean": [(2048, 20.0)], "train/approx_kl": [(2048, 0.01)]})
    bad = next((root / "PPO_2").glob("events.out.tfevents.*"))
    bad.write_bytes(bad.read_bytes()[:-5])  # truncated: an error at its last record
    with pytest.raises(InputError):
        registry.register_all(root)
    assert registry.list_runs()[1] == 0


def test_upload_reads_config_semantics_and_tensorboard_runs(db_url, tmp_path):
    reg = open_registry(db_url)
    create_user(reg, "u", "upload-password")
    token = create_token(reg, "u", "ci")
    app = create_app({"REGISTRY": reg, "TESTING": True, "SECRET_KEY": "t", "UPLOAD_DIR": str(tmp_path / "up")})
    client = app.test_client()
    lines = "\n".join(json.dumps({"step": s, "data": {"actor/kl_loss": 0.01 * s}}) for s in (1, 2)) + "\n"
    params = {"actor_rollout_ref": {"actor": {"kl_loss_type": "kl"}}}
    response = client.post("/api/uploads", headers={"Authorization": f"Bearer {token}"},
                           content_type="multipart/form-data",
                           data={"file": (io.BytesIO(lines.encode()), "exp.jsonl"), "params": json.dumps(params)})
    assert response.status_code == 201, response.get_data(as_text=True)
    run_id = response.get_json()["run_id"]
    series = by_key(client.get(f"/api/runs/{run_id}").get_json())
    assert series["actor/kl_loss"]["semantics"]["kl_estimator"] == "k1"
    assert series["actor/kl_loss"]["provenance"]["fields"]["kl_estimator"]["from"] == "config"
    page = client.get(f"/runs/{run_id}").get_data(as_text=True)
    assert "from config: kl_loss_type=kl" in page
    # A zipped TensorBoard directory of runs: several runs from one upload.
    import zipfile

    root = tmp_path / "tb"
    for n in (1, 2):
        write_events(root / f"PPO_{n}", {"rollout/ep_rew_mean": [(2048, 20.0 + n)], "train/approx_kl": [(2048, 0.01)]})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in root.rglob("*"):
            if file.is_file():
                archive.write(file, file.relative_to(tmp_path).as_posix())
    response = client.post("/api/uploads", headers={"Authorization": f"Bearer {token}"},
                           content_type="multipart/form-data",
                           data={"file": (io.BytesIO(buffer.getvalue()), "tb.zip")})
    assert response.status_code == 201, response.get_data(as_text=True)
    assert sorted(r["name"] for r in response.get_json()["runs"]) == ["PPO_1", "PPO_2"]
    reg.close()


# --- the dictionary against the frameworks' current keys -------------------------------------------


def test_every_pinned_framework_key_has_a_definition():
    report = check_key_lists(shipped_alias_index(), KEY_LISTS)
    assert set(report) >= {"verl.txt", "trl-grpo.txt", "openrlhf.txt", "stable-baselines3.txt", "cleanrl.txt"}
    assert report == {name: [] for name in report}


def test_key_check_fails_on_an_unknown_key(tmp_path):
    listed = tmp_path / "trl-new.txt"
    listed.write_text("# framework: trl\n# algorithm: grpo\nkl\nsampling/some_new_metric\n")
    problems = unbound_keys(shipped_alias_index(), read_key_list(listed))
    assert problems == ["sampling/some_new_metric: unmapped"]
    out = CliRunner().invoke(cli, ["dictionary", "check-keys", "--shipped", str(tmp_path)])
    assert out.exit_code == 1 and "sampling/some_new_metric" in out.output


def test_index_detects_each_framework_from_its_pinned_keys():
    index: AliasIndex = shipped_alias_index()
    for name, framework in (("verl.txt", "verl"), ("trl-grpo.txt", "trl"), ("openrlhf.txt", "openrlhf"),
                            ("stable-baselines3.txt", "stable-baselines3"), ("cleanrl.txt", "cleanrl")):
        assert index.detect(read_key_list(KEY_LISTS / name).keys).framework == framework, name


def test_runs_filter_on_series_labels(registry: Registry):
    registry.register_arrays("gsm8k-run", {"val-core/openai/gsm8k/acc/mean@4": ([1], [0.5])}, framework="verl")
    registry.register_arrays("math-run", {"val-core/lighteval/MATH/acc/mean@4": ([1], [0.3])}, framework="verl")
    registry.register_arrays("judge-run", {"rewards/format_judge/mean": ([1], [0.3])}, framework="trl",
                             algorithm="grpo")
    names = lambda where: sorted(r["name"] for r in registry.list_runs(where=where)[0])  # noqa: E731
    assert names("label.data_source=openai/gsm8k") == ["gsm8k-run"]
    assert names("label.data_source ~ MATH and label.n=4") == ["math-run"]
    assert names("label.reward_func_name~format") == ["judge-run"]
    assert names("not label.data_source=openai/gsm8k") == ["judge-run", "math-run"]
    with pytest.raises(FilterSyntaxError, match="label.NAME takes"):
        registry.list_runs(where="label.n>3")
