"""Importers on real and realistic inputs: SB3 TensorBoard runs, TRL, verl, W&B exports."""
from __future__ import annotations

import math
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from registry.core.errors import InputError, UnknownFormatError
from registry.importers import IMPORTERS, fingerprint, open_source
from registry.importers.params import (
    load_params_file, merge_params, parse_value, params_from_assignments,
)

DATA = Path(__file__).resolve().parent / "data"
SB3 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sb3_ppo"


def by_key(source):
    series = defaultdict(list)
    for point in source.points():
        series[point.key].append(point)
    return series


@pytest.fixture(scope="module")
def sb3_runs():
    if not SB3.is_dir():
        pytest.skip(f"SB3 runs not found at {SB3}")
    return {run.name: run for run in sorted(SB3.iterdir()) if run.is_dir()}


# --- TensorBoard ------------------------------------------------------------------------

@pytest.mark.parametrize("run", [
    "cartpole_healthy_s0", "cartpole_lr_too_high_5e-2", "cartpole_tiny_lr_1e-6", "pendulum_default_s0",
])
def test_sb3_run_has_every_logged_point(sb3_runs, run):
    source = open_source(sb3_runs[run])
    assert source.format == "tensorboard"
    assert source.framework == "stable-baselines3"
    assert source.name == run
    series = by_key(source)
    for key, points in series.items():
        steps = [p.step for p in points]
        if key.startswith("rollout/") or key == "time/fps":
            assert len(points) == 49 and steps[0] == 2048, key
        else:
            assert key.startswith("train/"), key
            assert len(points) == 48 and steps[0] == 4096, key
        assert steps[-1] == 100352, key
        assert all(isinstance(p.step, int) and p.wall_time and p.position.startswith("record ") for p in points)
    assert "train/std" in series if run.startswith("pendulum") else "train/std" not in series


def test_sb3_hyperparameters_come_from_the_hparams_summary(sb3_runs):
    source = open_source(sb3_runs["cartpole_lr_too_high_5e-2"])
    assert source.params["learning_rate"] == pytest.approx(0.05)
    assert source.params["env"] == "CartPole-v1"
    assert source.params["n_steps"] == 2048
    assert source.task == "CartPole-v1"
    assert open_source(sb3_runs["pendulum_default_s0"]).task == "Pendulum-v1"
    assert open_source(sb3_runs["cartpole_tiny_lr_1e-6"]).params["learning_rate"] == pytest.approx(1e-6)


def test_sb3_first_update_kl_spike(sb3_runs):
    series = by_key(open_source(sb3_runs["cartpole_lr_too_high_5e-2"]))
    first_kl = series["train/approx_kl"][0]
    assert first_kl.step == 4096
    assert first_kl.value == pytest.approx(5.98, abs=0.01)
    assert series["train/clip_fraction"][0].value == pytest.approx(0.56, abs=0.01)


def test_single_event_file_opens_like_its_directory(sb3_runs):
    directory = sb3_runs["cartpole_healthy_s0"]
    (file,) = directory.glob("events.out.tfevents.*")
    assert list(open_source(file).points()) == list(open_source(directory).points())


def test_points_can_be_iterated_twice(sb3_runs):
    source = open_source(sb3_runs["cartpole_healthy_s0"])
    assert list(source.points()) == list(source.points())


def _write_events(directory: Path, events) -> None:
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    for event in events:
        writer.add_event(event)
    writer.close()


def _tensor_scalar_event(tag, step, value, with_metadata):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.util import tensor_util

    summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(value))
    if with_metadata:
        summary_value.metadata.plugin_data.plugin_name = "scalars"
    return event_pb2.Event(step=step, wall_time=1740000000.0 + step, summary=summary_pb2.Summary(value=[summary_value]))


def _hparams_event(hparams):
    from google.protobuf import struct_pb2
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData(version=0)
    for name, value in hparams.items():
        proto = struct_pb2.Value()
        if isinstance(value, str):
            proto.string_value = value
        else:
            proto.number_value = value
        data.session_start_info.hparams[name].CopyFrom(proto)
    summary_value = summary_pb2.Summary.Value(tag="_hparams_/session_start_info")
    summary_value.metadata.plugin_data.plugin_name = "hparams"
    summary_value.metadata.plugin_data.content = data.SerializeToString()
    return event_pb2.Event(wall_time=1740000000.0, summary=summary_pb2.Summary(value=[summary_value]))


def test_tensor_scalars_and_shared_tags_across_subdirectories(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    # Metadata on a tag's first event only, as some writers do.
    _write_events(tmp_path / "train", [
        _hparams_event({"learning_rate": 3e-4, "env_id": "HalfCheetah-v4"}),
        *(_tensor_scalar_event("loss", s, 1.0 / s, with_metadata=(s == 1)) for s in (1, 2, 3)),
        *(_tensor_scalar_event("charts/learning_rate", s, 3e-4, with_metadata=True) for s in (1, 2, 3)),
    ])
    _write_events(tmp_path / "eval", [_tensor_scalar_event("loss", s, 2.0, with_metadata=True) for s in (2, 3)])
    source = open_source(tmp_path)
    series = by_key(source)
    assert sorted(series) == ["charts/learning_rate", "eval/loss", "train/loss"]
    assert [p.value for p in series["train/loss"]] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [p.step for p in series["eval/loss"]] == [2, 3]
    assert source.params == {"learning_rate": pytest.approx(3e-4), "env_id": "HalfCheetah-v4"}
    assert source.task == "HalfCheetah-v4"
    assert source.framework is None
    assert len(source.files) == 2


def test_two_sb3_runs_in_one_directory_are_prefixed(sb3_runs, tmp_path):
    shutil.copytree(sb3_runs["cartpole_healthy_s0"], tmp_path / "PPO_1")
    shutil.copytree(sb3_runs["cartpole_tiny_lr_1e-6"], tmp_path / "PPO_2")
    source = open_source(tmp_path)
    series = by_key(source)
    assert len(series["PPO_1/rollout/ep_rew_mean"]) == 49 and len(series["PPO_2/train/approx_kl"]) == 48
    assert "rollout/ep_rew_mean" not in series
    assert source.framework == "stable-baselines3"
    # The runs disagree on learning_rate: the first file's value is kept, with a warning.
    assert source.params["learning_rate"] == pytest.approx(3e-4)
    assert any("'learning_rate'" in warning for warning in source.warnings)


def test_cleanrl_tags_give_the_cleanrl_hint(tmp_path):
    _write_events(tmp_path, [
        _tensor_scalar_event("charts/episodic_return", 128, 9.0, with_metadata=True),
        _tensor_scalar_event("losses/approx_kl", 128, 0.01, with_metadata=True),
    ])
    assert open_source(tmp_path).framework == "cleanrl"


# --- trainer_state.json -----------------------------------------------------------------

def test_trl_grpo_trainer_state():
    source = open_source(DATA / "trl_grpo" / "trainer_state.json")
    assert source.format == "trainer_state"
    assert source.framework == "trl"
    assert source.name == "trl_grpo"
    assert source.params == {"trainer": {
        "train_batch_size": 8, "num_train_epochs": 1, "max_steps": 50,
        "logging_steps": 5, "eval_steps": 500, "save_steps": 25,
    }}
    series = by_key(source)
    for key in ("rewards/accuracy_reward/mean", "kl", "completions/mean_length", "grad_norm", "learning_rate",
                "loss", "reward", "reward_std", "clip_ratio/region_mean", "entropy"):
        assert len(series[key]) == 10, key
    assert len(series["epoch"]) == 11  # also in the end-of-training summary entry
    assert [p.step for p in series["reward"]] == list(range(5, 55, 5))
    nan = [p for p in series["grad_norm"] if math.isnan(p.value)]
    assert [(p.step, p.position) for p in nan] == [(30, "log_history[5]")]
    # The end-of-training summary entry is metrics too.
    assert [p.value for p in series["train_runtime"]] == [1832.4]
    assert series["epoch"][-1].position == "log_history[10]"


def test_trainer_state_directory_and_checkpoint_name(tmp_path):
    checkpoint = tmp_path / "grpo-qwen" / "checkpoint-50"
    checkpoint.mkdir(parents=True)
    shutil.copy(DATA / "trl_grpo" / "trainer_state.json", checkpoint)
    source = open_source(checkpoint)
    assert source.format == "trainer_state"
    assert source.name == "grpo-qwen"


def test_trainer_state_rejects_fractional_step(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": [{"loss": 1.0, "step": 1}, {"loss": 0.9, "step": 2.5}]}')
    with pytest.raises(InputError, match=r"log_history\[1\]: step must be an integer, got 2\.5"):
        list(open_source(path).points())


# --- verl console logs ------------------------------------------------------------------

def test_verl_log_records_behind_ray_prefix():
    source = open_source(DATA / "verl_grpo.log")
    assert source.format == "verl_log"
    assert source.framework == "verl"
    points = list(source.points())
    assert Counter(p.step for p in points) == {0: 2, 1: 32, 2: 32, 3: 32}
    series = by_key(source)
    assert [p.value for p in series["critic/score/mean"]] == pytest.approx([0.34, 0.38, 0.42])
    assert series["val-core/openai/gsm8k/reward/mean@1"][0].value == pytest.approx(0.312)
    assert source.warnings == []


def test_verl_wrapped_record_rejoins_split_tokens():
    series = by_key(open_source(DATA / "verl_grpo.log"))
    # Line 13 ends "actor/ppo_kl:" and line 14 starts "-8.1e-06"; line 14 ends "- per",
    # line 15 starts "f/cpu_memory_used_gb:82.3".
    kl = [p for p in series["actor/ppo_kl"] if p.step == 2]
    assert [(p.value, p.position) for p in kl] == [(-8.1e-06, "line 13")]
    assert [p.position for p in series["perf/cpu_memory_used_gb"] if p.step == 2] == ["line 14"]
    assert [p.position for p in series["perf/throughput"] if p.step == 2] == ["line 18"]
    assert "per" not in series and "f/cpu_memory_used_gb" not in series


def test_verl_numpy_reprs_are_numbers():
    series = by_key(open_source(DATA / "verl_grpo.log"))
    assert [p.value for p in series["critic/score/max"] if p.step == 3] == [1.0]


def test_verl_non_numeric_values_are_skipped_and_counted(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(
        "step:1 - actor/pg_loss:0.5 - rollout/sample:'The answer is 4' - timing/per_worker:[1.2, 3.4]"
        " - actor/entropy:nan - actor/kl:-inf\n"
        "step:2 - actor/pg_loss:0.4 - rollout/sample:'x'\n"
    )
    source = open_source(path)
    series = by_key(source)
    assert sorted(series) == ["actor/entropy", "actor/kl", "actor/pg_loss"]
    assert math.isnan(series["actor/entropy"][0].value) and series["actor/kl"][0].value == -math.inf
    assert source.warnings == [
        "skipped 3 non-numeric values in 2 keys: 'rollout/sample' (line 1), 'timing/per_worker' (line 1)"
    ]


def test_verl_other_output_is_not_glued_to_a_record(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(
        "(TaskRunner pid=1) step:1 - actor/pg_loss:0.5\n"
        "(TaskRunner pid=1) Saving checkpoint to checkpoints/global_step_1\n"
        "(TaskRunner pid=1) step:2 - actor/pg_loss:0.4 [repeated 2x across cluster]\n"
    )
    assert [(p.step, p.value) for p in open_source(path).points()] == [(1, 0.5), (2, 0.4)]


def test_verl_record_wrapped_right_after_step(tmp_path):
    path = tmp_path / "run.log"
    path.write_text("step:7 -\n actor/pg_loss:0.5 - actor/k\nl:0.1\nstep: starting the next rollout\n")
    assert [(p.key, p.step, p.value, p.position) for p in open_source(path, "verl_log").points()] == [
        ("actor/pg_loss", 7, 0.5, "line 2"), ("actor/kl", 7, 0.1, "line 2"),
    ]


# --- CSV and JSONL ----------------------------------------------------------------------

def test_wandb_csv_wide():
    source = open_source(DATA / "wandb_history.csv")
    assert source.format == "csv"
    series = by_key(source)
    assert "" not in series  # pandas index column
    # Stepped by the trainer's train/global_step, not W&B's _step (a count of log calls).
    assert [p.step for p in series["train/loss"]] == [10, 20, 30, 40, 50]
    assert math.isnan(series["train/loss"][2].value)
    assert series["train/kl"][3].value == math.inf
    # The eval row carries no train/global_step: it sits at the trainer step logged before it.
    assert [(p.step, p.value) for p in series["eval/reward"]] == [(20, 0.47), (50, 0.58)]
    assert any("1 row(s) without 'train/global_step' (first: line 4)" in w for w in source.warnings)
    assert source.layout["step column"] == "train/global_step"
    assert series["train/loss"][0].wall_time == pytest.approx(1740912001.52)
    assert "_timestamp" not in series and "train/global_step" not in series
    assert [p.value for p in series["_step"]] == [0, 1, 3, 4, 5]  # the logger's counter, kept as a metric
    assert series["eval/reward"][0].position == "line 4"


def test_csv_long():
    series = by_key(open_source(DATA / "metrics_long.csv"))
    assert [(p.step, p.value) for p in series["rollout/ep_rew_mean"][:2]] == [(2048, 22.4), (4096, 27.9)]
    assert math.isnan(series["rollout/ep_rew_mean"][2].value)
    assert "train/clip_fraction" not in series
    assert series["time/fps"][0].wall_time == pytest.approx(1740912001.5)


def test_csv_text_column_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("Step,run,reward\n1,ppo-a,0.5\n2,ppo-a,0.7\n")
    source = open_source(path)
    assert [(p.key, p.step, p.value) for p in source.points()] == [("reward", 1, 0.5), ("reward", 2, 0.7)]
    assert source.warnings == [f"{path}, line 2: column 'run' holds text ('ppo-a'); skipped"]


def test_csv_prefers_global_step_over_wandb_step(tmp_path):
    path = tmp_path / "cleanrl.csv"
    path.write_text("_step,global_step,charts/episodic_return\n0,128,9.0\n1,256,11.0\n")
    series = by_key(open_source(path))
    assert [p.step for p in series["charts/episodic_return"]] == [128, 256]
    assert [p.value for p in series["_step"]] == [0, 1]


def test_wandb_jsonl():
    source = open_source(DATA / "wandb_history.jsonl")
    assert source.format == "jsonl"
    series = by_key(source)
    assert [p.step for p in series["train/loss"]] == [10, 20, 30, 40]  # the trainer step, nested train.global_step
    assert math.isnan(series["train/loss"][2].value)
    assert series["train/kl"][-1].value == math.inf
    assert series["eval/reward"][0].position == "line 3"
    assert series["train/loss"][-1].position == "line 6"  # the blank line 5 still counts
    assert series["_runtime"][0].value == pytest.approx(31.2)
    assert series["train/loss"][0].wall_time == pytest.approx(1740912001.52)
    assert not any(k.startswith("_wandb") or k == "note" for k in series)
    assert source.warnings == [
        f"{DATA / 'wandb_history.jsonl'}: 1 row(s) without 'train/global_step' (first: line 3) placed at the last "
        "train/global_step logged before them (their own _step/_runtime counters left out)",
        "skipped non-numeric values in 2 keys: 'eval/completions/_type' (line 3), 'eval/completions/path' (line 3)",
    ]
    assert [p.step for p in series["eval/reward"]][0] == 20


# --- detection, open_source, fingerprint ------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("trl_grpo/trainer_state.json", "trainer_state"),
    ("trl_grpo", "trainer_state"),
    ("verl_grpo.log", "verl_log"),
    ("wandb_history.csv", "csv"),
    ("metrics_long.csv", "csv"),
    ("wandb_history.jsonl", "jsonl"),
    ("broken/nonfinite_trainer_state.json", "trainer_state"),
])
def test_format_is_detected(name, expected):
    assert open_source(DATA / name).format == expected


def test_detection_goes_by_content_not_extension(tmp_path):
    for source_name, disguise, expected in [
        ("wandb_history.csv", "export.txt", "csv"),
        ("wandb_history.jsonl", "history.json", "jsonl"),
        ("verl_grpo.log", "stdout", "verl_log"),
        ("trl_grpo/trainer_state.json", "state.txt", "trainer_state"),
    ]:
        shutil.copy(DATA / source_name, tmp_path / disguise)
        assert open_source(tmp_path / disguise).format == expected, disguise


def test_explicit_format_and_unknown_names():
    assert open_source(DATA / "wandb_history.csv", format="csv").format == "csv"
    with pytest.raises(UnknownFormatError, match="known formats: tensorboard, trainer_state, verl_log, verl_file, csv, jsonl"):
        open_source(DATA / "wandb_history.csv", format="parquet")
    assert list(IMPORTERS) == ["tensorboard", "trainer_state", "verl_log", "verl_file", "csv", "jsonl"]


def test_missing_path():
    with pytest.raises(InputError, match="no such file or directory"):
        open_source(DATA / "does-not-exist.csv")


def test_fingerprint_is_by_content(sb3_runs, tmp_path):
    run = sb3_runs["cartpole_healthy_s0"]
    copy = tmp_path / "elsewhere"
    shutil.copytree(run, copy)
    assert fingerprint(open_source(run)) == fingerprint(open_source(copy))
    assert fingerprint(open_source(run)) != fingerprint(open_source(sb3_runs["cartpole_tiny_lr_1e-6"]))
    assert len(fingerprint(open_source(DATA / "verl_grpo.log"))) == 64


def test_fingerprint_covers_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(DATA / "wandb_history.csv", a / "one.csv")
    shutil.copy(DATA / "wandb_history.csv", b / "two.csv")
    assert fingerprint(open_source(a / "one.csv")) != fingerprint(open_source(b / "two.csv"))


# --- params -----------------------------------------------------------------------------

def test_params_yaml_reads_numbers_as_numbers():
    params = load_params_file(DATA / "params.yaml")
    assert params["learning_rate"] == 3e-4 and isinstance(params["learning_rate"], float)
    assert params["clip_range"] == 0.2
    assert params["seed"] == 10  # YAML 1.1 would make 010 octal 8
    assert params["target_kl"] is None and params["normalize_advantage"] is True
    assert params["policy_kwargs"] == {"net_arch": [64, 64], "activation": "tanh"}
    assert params["env"] == "CartPole-v1" and params["algo"] == "PPO"


def test_params_json():
    assert load_params_file(DATA / "params.json")["optim"] == {"lr": 1e-06, "betas": [0.9, 0.999]}


def test_hydra_overrides_file(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text("- algorithm.adv_estimator=grpo\n- actor_rollout_ref.actor.optim.lr=1e-6\n")
    assert load_params_file(path) == {
        "algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}},
    }


@pytest.mark.parametrize("text, expected", [
    ("3e-4", 3e-4), ("2048", 2048), ("-1", -1), ("0.99", 0.99), ("1_000", 1000), ("inf", math.inf),
    ("true", True), ("False", False), ("null", None), ("None", None),
    ("PPO", "PPO"), ("CartPole-v1", "CartPole-v1"), ('"3"', "3"), ("'yes'", "yes"), ("no", "no"),
    ("[64, 64]", [64, 64]), ("{a: 1e-3}", {"a": 1e-3}), ("", ""),
])
def test_parse_value(text, expected):
    value = parse_value(text)
    assert value == expected and type(value) is type(expected)


def test_assignments_nest_and_merge_over_a_file():
    overrides = params_from_assignments(["learning_rate=1e-3", "policy_kwargs.activation=relu"])
    merged = merge_params(load_params_file(DATA / "params.yaml"), overrides)
    assert merged["learning_rate"] == 1e-3
    assert merged["policy_kwargs"] == {"net_arch": [64, 64], "activation": "relu"}


@pytest.mark.parametrize("argument, message", [
    ("learning_rate", "parameter 'learning_rate': expected key=value"),
    ("=3", "parameter '=3': bad parameter name ''"),
    ("a..b=1", "parameter 'a..b=1': bad parameter name 'a..b'"),
    ("arch=[64, 64", "parameter 'arch=[64, 64': not a valid list or mapping"),
])
def test_bad_assignments_name_the_argument(argument, message):
    with pytest.raises(InputError) as info:
        params_from_assignments([argument])
    assert str(info.value).startswith(message)


def test_assignment_conflict():
    with pytest.raises(InputError, match="'optim' was already given a value"):
        params_from_assignments(["optim=adam", "optim.lr=1e-3"])
