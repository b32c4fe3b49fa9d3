"""Runs written by the frameworks' own code (tests/data/real, see its README) register with default
options, keep every point a trainer wrote, and the README's registration examples run as written."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "tests" / "data" / "real"
CLEANRL_RUN = REAL / "cleanrl_ppo_cartpole" / "runs" / "CartPole-v1__ppo__1__1796394563"
TRL = REAL / "trl_grpo_tiny"


def test_cleanrl_vectorised_envs_keep_every_episode(registry: Registry):
    result = registry.register(CLEANRL_RUN)
    assert not result.warnings and result.framework == "cleanrl"
    returns = registry.read_series(result.run_id, "charts/episodic_return")
    steps = returns.steps
    assert (np.diff(steps) >= 0).all()
    # Four environments: several episodes end at one global step, and each is kept.
    assert len(np.unique(steps)) < len(steps)
    per_step = returns.per_step()
    assert per_step.counts.sum() == len(steps) and per_step.counts.max() >= 2


def test_cleanrl_per_episode_returns_are_judged_through_the_windowed_mean_sb3_would_log(registry: Registry):
    """CleanRL logs one return per finished episode and no windowed mean: the diagnosis derives the mean of
    the last 100 episodes at each update, says so, judges the objective by it and draws its findings on the
    per-episode series the run has."""
    from registry.analysis.health import diagnose_run, summarize_diagnosis

    run_id = registry.register(CLEANRL_RUN).run_id
    d = diagnose_run(registry, run_id, use_baseline=False)
    assert "reward (drop, flat, zero)" in d.checked
    assert d.derived["episode_return_mean"]["from"] == "episode_return"
    assert "the mean of the last 100 episodes at each update" in d.summary()
    episodes = registry.read_series(run_id, "charts/episodic_return")
    updates = registry.read_series(run_id, "losses/clipfrac")
    # At the last update the derived value is the mean of the last 100 episodes logged by then.
    last = updates.steps[-1]
    done = episodes.values[episodes.steps <= last]
    from registry.analysis.diagnosis.episodes import windowed_mean
    from registry.analysis.diagnosis import Curve
    derived = windowed_mean(Curve(episodes.steps, episodes.values), np.asarray(updates.steps))
    assert derived.values[-1] == pytest.approx(float(np.mean(done[-100:])))
    # A CleanRL run whose windowed return fell (408 -> 218 over its last 37k steps): the finding on the derived
    # mean is drawn on the per-episode series.
    (fell,) = (REAL / "cleanrl_sweep" / "cartpole_default_s1" / "runs").iterdir()
    d = diagnose_run(registry, registry.register(fell).run_id, use_baseline=False)
    reward_findings = [f for f in d.findings if f.metric == "episode_return_mean" and f.at_least("warning")]
    assert [f.detector for f in reward_findings] == ["reward_drop"], d.summary()
    spans = summarize_diagnosis(d)["spans"]
    assert "episode_return_mean" not in spans and len(spans["episode_return"]) == 1


def test_a_baseline_of_per_episode_runs_has_the_windowed_return_band_they_are_judged_by(registry: Registry):
    from registry.analysis.baselines import build_task_baseline

    run_id = registry.register(CLEANRL_RUN).run_id
    profile = build_task_baseline(registry, "CartPole-v1", [run_id], author="test", allow_weak=True)
    assert "episode_return_mean" in profile.metrics and profile.metrics["episode_return_mean"].band("late")


def test_a_run_without_a_reward_curve_is_not_called_healthy(registry: Registry, tmp_path: Path):
    csv = tmp_path / "losses_only.csv"
    csv.write_text("step,train/approx_kl,train/clip_fraction\n" + "".join(
        f"{1024 * i},0.005,0.03\n" for i in range(1, 41)))
    run_id = registry.register(csv, framework="stable-baselines3", task="CartPole-v1").run_id
    from registry.analysis.health import diagnose_run

    d = diagnose_run(registry, run_id)
    assert not d.healthy and d.verdict == "not enough data"
    assert d.summary().startswith("not enough data to judge this run: the objective: no reward or return curve")


@pytest.mark.parametrize("path", [
    "beta0.04/runs/Dec04_14-39-08_vm", "num_iterations2/runs/Dec04_14-38-05_vm",
    "beta0.04/trainer_state_after_train.json", "num_iterations2/trainer_state_after_train.json",
])
def test_trl_end_of_training_summary_becomes_scores(registry: Registry, path: str):
    result = registry.register(TRL / path)
    assert not result.warnings
    assert set(result.summary) == {"train_runtime", "train_samples_per_second", "train_steps_per_second",
                                   "total_flos", "train_loss"}
    detail = registry.run_detail(result.run_id)
    assert detail["scores"]["train_runtime"] == pytest.approx(result.summary["train_runtime"])
    keys = {s["key"] for s in detail["series"]}
    epoch_key = "train/epoch" if "train/epoch" in keys else "epoch"
    epoch = registry.read_series(result.run_id, epoch_key)
    assert len(np.unique(epoch.steps)) == len(epoch.steps)  # the summary's repeated epoch is one point
    assert not any(k.endswith("train_runtime") for k in keys)


@pytest.mark.parametrize("log", ["verl_issue_2060_steps0_1.log", "verl_issue_1208_step2.log",
                                 "verl_sglang_tutorial_issue_106_steps80_83.log"])
def test_a_published_verl_excerpt_logged_during_warm_up_is_diagnosed(registry: Registry, log: str):
    """These excerpts log lr = 0 (the first steps of a warm-up): that is no rate the run trains at, so
    the diagnosis does not read a learning rate from it (it used to divide by it)."""
    from registry.analysis.health import diagnose_run

    result = registry.register(REAL / "published" / log)
    d = diagnose_run(registry, result.run_id, use_baseline=False)
    lr = d.settings["settings"].get("learning_rate")
    assert lr is None or lr["value"] > 0
    assert not d.healthy                                   # a few steps are not enough to call it healthy


def test_a_setting_of_zero_is_compared_in_words():
    from registry.analysis.diagnosis.hyperparams import read_settings

    settings = read_settings({"epsilon": 0.0}, "trl").to_dict()["settings"]
    assert settings["clip_range"]["text"] == "epsilon = 0, zero against the TRL default 0.2"


def test_trl_event_files_carry_the_trainer_config_and_the_diagnosis_reads_it(registry: Registry):
    """transformers' TensorBoardCallback writes the TrainingArguments (TRL's GRPOConfig) as the 'args'
    text summary: its settings become the run's hyperparameters, so a TRL run registered from its
    event files alone gets the clip ratio called uninformative (one update per batch), not a problem."""
    from registry.analysis.health import diagnose_run

    result = registry.register(TRL / "beta0.04" / "runs" / "Dec04_14-39-08_vm")
    params = registry.run_detail(result.run_id)["params"]
    assert (params["num_iterations"], params["epsilon"], params["beta"], params["max_completion_length"]) == \
        (1, 0.2, 0.04, 12)
    assert params["output_dir"] == "/tmp/grpo_beta" and len(params) > 150  # the whole config, not a few keys
    clip = diagnose_run(registry, result.run_id, use_baseline=False).by_detector("clip_low")
    assert clip and clip[0].severity == "info" and "uninformative by construction" in clip[0].title


def test_trl_checkpoint_state_has_no_summary_and_registers(registry: Registry):
    result = registry.register(TRL / "beta0.04" / "checkpoint-30" / "trainer_state.json")
    assert result.summary == {} and not result.warnings and result.framework == "trl"


def test_sb3_logger_event_file_registers(registry: Registry):
    events = next((REAL / "sb3_ppo_cartpole_logger").glob("events.out.tfevents.*"))
    result = registry.register(events)
    assert result.framework == "stable-baselines3" and not result.unmapped.get("rollout/ep_rew_mean")


def _readme_register_block() -> list[list[str]]:
    """The `rlreg register/runs/show` lines of the README's "Registering runs" block, as argv lists."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Registering runs\n\n```bash\n(.*?)```", text, re.S).group(1)
    commands = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith(("rlreg register", "rlreg runs", "rlreg show", "rlreg init")):
            commands.append(shlex.split(line)[1:])
    return commands


def test_readme_registration_examples_run_as_written(sqlite_url: str, monkeypatch):
    monkeypatch.chdir(REPO)
    commands = _readme_register_block()
    assert sum(c[0] == "register" for c in commands) >= 3
    runner = CliRunner()
    for argv in commands:
        result = runner.invoke(cli, ["--db", sqlite_url, *argv], catch_exceptions=False)
        assert result.exit_code == 0, (argv, result.output)
        if argv[0] == "show":
            assert "cleanrl-cartpole" in result.output


# For every framework-written file: the series of each concept the framework logs, the definition it
# must bind to, and the KL estimator it must carry. (source, params file, framework,
# {raw key: (definition, kl_estimator or None)}, {field of a key: "config"}).
FRAMEWORK_FILES = [
    ("cleanrl_ppo_cartpole/runs/CartPole-v1__ppo__1__1796394563", None, "cleanrl", {
        "losses/approx_kl": ("kl_old_mean", "k3"), "losses/old_approx_kl": ("kl_old_mean", "k1"),
        "charts/episodic_return": ("episode_return", None), "losses/clipfrac": ("clip_fraction", None),
        "losses/entropy": ("entropy", None), "charts/episodic_length": ("episode_length", None)}, {}),
    ("sb3_ppo_cartpole_logger/progress.csv", "sb3_ppo_cartpole_logger/params.json", "stable-baselines3", {
        "train/approx_kl": ("kl_old_mean", "k3"), "rollout/ep_rew_mean": ("episode_return_mean", None),
        "train/clip_fraction": ("clip_fraction", None), "train/entropy_loss": ("entropy", None),
        "rollout/ep_len_mean": ("episode_length_mean", None)}, {}),
    ("trl_grpo_tiny/num_iterations2/runs/Dec04_14-38-05_vm", "trl_grpo_tiny/num_iterations2/config.json", "trl", {
        "train/kl": ("kl_ref_mean", "k3"), "train/reward": ("reward_sequence_mean", None),
        "train/clip_ratio/region_mean": ("clip_fraction", None), "train/entropy": ("entropy", None),
        "train/completions/mean_length": ("response_length_mean", None)}, {}),
    ("verl_tracking_grpo/verl_grpo_tiny/qwen_tiny_gsm8k_grpo.jsonl", "verl_tracking_grpo/config.json", "verl", {
        "actor/kl_loss": ("kl_ref_mean", "k3"), "actor/ppo_kl": ("kl_old_mean", "k1"),
        "critic/score/mean": ("reward_sequence_mean", None), "critic/advantages/mean": ("advantage_mean", None),
        "actor/pg_clipfrac": ("clip_fraction", None), "actor/entropy": ("entropy", None),
        "response_length/mean": ("response_length_mean", None)},
     {"actor/kl_loss": "kl_estimator", "critic/advantages/mean": "normalization_axis"}),
    ("verl_tracking_grpo/console.log", "verl_tracking_grpo/config.json", "verl", {
        "actor/kl_loss": ("kl_ref_mean", "k3"), "actor/ppo_kl": ("kl_old_mean", "k1"),
        "critic/score/mean": ("reward_sequence_mean", None), "critic/advantages/mean": ("advantage_mean", None),
        "actor/pg_clipfrac": ("clip_fraction", None), "actor/entropy": ("entropy", None),
        "response_length/mean": ("response_length_mean", None)},
     {"actor/kl_loss": "kl_estimator", "critic/advantages/mean": "normalization_axis"}),
    ("openrlhf_tensorboard_grpo/qwen_tiny_grpo_k3", "openrlhf_tensorboard_grpo/args.json", "openrlhf", {
        "train/kl": ("kl_ref_mean", "k3"), "train/logprobs_diff": ("kl_ref_mean", "k1"),
        "train/reward": ("reward_sequence_mean", None), "train/ppo_clip_ratio": ("clip_fraction", None),
        "train/entropy_loss": ("entropy", None), "train/response_length": ("response_length_mean", None)},
     {"train/kl": "kl_estimator"}),
]


@pytest.mark.parametrize("source, params, framework, expected, from_config", FRAMEWORK_FILES,
                         ids=[f[0].split("/")[0] + ":" + f[0].rsplit("/", 1)[-1][:24] for f in FRAMEWORK_FILES])
def test_framework_files_bind_each_concept_by_their_own_alias(registry: Registry, source, params, framework,
                                                              expected, from_config):
    from registry.importers.params import load_params_file

    result = registry.register(REAL / source, params=load_params_file(REAL / params) if params else None)
    assert result.framework == framework and not result.guessed
    series = {s["key"]: s for s in registry.run_detail(result.run_id)["series"]}
    for key, (definition, estimator) in expected.items():
        s = series[key]
        assert s["definition"] == definition, (key, s["definition"])
        assert s["provenance"]["how"] == "alias", (key, s["provenance"])
        if estimator:
            assert s["semantics"]["kl_estimator"] == estimator, (key, s["semantics"])
    for key, field in from_config.items():
        origin = series[key]["provenance"]["fields"][field]
        assert origin["from"] == "config" and origin["param"] and origin["verified_in"], (key, origin)


#: Every kind of real file the project holds outside the labelled SB3 sweep (which its own tests diagnose).
EVERY_REAL_SOURCE = [
    "trl_grpo_tiny/beta0.04/runs/Dec04_14-39-08_vm", "trl_grpo_tiny/beta0_eval/runs/Dec04_15-00-02_vm",
    "trl_grpo_tiny/num_iterations2/runs/Dec04_14-38-05_vm", "trl_grpo_tiny/beta0.04/trainer_state_after_train.json",
    "openrlhf_tensorboard_grpo/qwen_tiny_grpo_k3", "verl_tracking_grpo/console.log",
    "cleanrl_ppo_cartpole/runs/CartPole-v1__ppo__1__1796394563", "sb3_ppo_cartpole_tensorboard_log",
    "published/chaos_economy_grpo", *(f"published/{p.name}" for p in sorted((REAL / "published").glob("*.log"))),
]


@pytest.mark.parametrize("source", EVERY_REAL_SOURCE)
def test_every_real_file_registers_and_is_diagnosed_without_error(registry: Registry, source: str):
    """Registration diagnoses a run and only logs an error: read the findings back (computed again when
    none were stored, which raises), and diagnose the way the dashboard does."""
    from registry.analysis.health import current_findings, diagnose_run

    result = registry.register(REAL / source)
    assert current_findings(registry, result.run_id).state == "fresh"
    d = diagnose_run(registry, result.run_id)
    assert d.summary() and d.to_dict()["findings"] is not None


def test_a_trl_run_without_its_configuration_gets_its_zero_clip_ratio_read_against_trls_default(registry: Registry):
    """A published TRL trainer_state.json carries no GRPOConfig: with TRL's default num_iterations = 1 the
    clip ratio is 0 by construction, so it is information that says the default was assumed, not
    'updates too conservative'."""
    from registry.analysis.health import diagnose_run

    result = registry.register(REAL / "published" / "chaos_economy_grpo")
    assert result.framework == "trl" and not registry.run_detail(result.run_id)["params"].get("num_iterations")
    d = diagnose_run(registry, result.run_id, use_baseline=False)
    (clip,) = d.by_detector("clip_low")
    assert clip.severity == "info" and "num_iterations is not recorded" in clip.title
    assert "TRL's default of 1" in clip.title


def test_a_finding_names_the_bound_it_judged_by(registry: Registry):
    """A CleanRL run at a tenth of the default learning rate moves the policy very little (approx_kl ~6e-7,
    clip fraction 0): the KL definition has no healthy low, so the finding says the bound it used was a share
    of the high."""
    from registry.analysis.health import diagnose_run

    (run,) = (REAL / "cleanrl_sweep" / "cartpole_lr_2.5e-5_s15" / "runs").iterdir()
    d = diagnose_run(registry, registry.register(run).run_id, use_baseline=False)
    (clip,) = d.by_detector("clip_low")
    assert "below 0.0005 (1% of its healthy high 0.05)" in clip.title and "healthy low" not in clip.title
