"""Registering real training logs: the SB3 TensorBoard runs, and every documented failure mode."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from registry import Registry
from registry.core.errors import AlreadyRegisteredError, InputError, StepOrderError


def _series(reg: Registry, run_id: str) -> dict[str, dict]:
    return {s["key"]: s for s in reg.run_detail(run_id)["series"]}


def test_sb3_tensorboard_run_binds_every_headline_metric(registry: Registry, sb3_runs: Path):
    result = registry.register(sb3_runs / "cartpole_lr_too_high_5e-2", project="cartpole", algorithm="PPO")
    assert result.framework == "stable-baselines3"
    assert result.source_format == "tensorboard"
    detail = registry.run_detail(result.run_id)
    assert detail["task"] == "CartPole-v1"
    assert detail["params"]["learning_rate"] == pytest.approx(0.05)
    series = _series(registry, result.run_id)
    assert series["rollout/ep_rew_mean"]["count"] == 49
    assert series["train/approx_kl"]["count"] == 48
    assert series["train/approx_kl"]["first_step"] == 4096 and series["train/approx_kl"]["last_step"] == 100352
    assert series["train/approx_kl"]["first"] == pytest.approx(5.98, abs=0.01)
    assert series["train/approx_kl"]["semantics"]["kl_estimator"] == "k3"
    assert series["train/entropy_loss"]["sign"] == -1.0
    for key in ("rollout/ep_rew_mean", "rollout/ep_len_mean", "train/approx_kl", "train/clip_fraction",
                "train/entropy_loss", "train/value_loss", "train/policy_gradient_loss", "train/loss",
                "train/explained_variance", "train/learning_rate", "rollout/ep_rew_std", "time/fps"):
        assert series[key]["definition"], f"{key} is unmapped"
    layers = {series[k]["layer"] for k in ("rollout/ep_rew_mean", "train/approx_kl", "rollout/ep_len_mean")}
    assert layers == {"objective", "constraint", "diagnostic"}


def test_same_source_twice_is_refused_unless_replaced(registry: Registry, sb3_runs: Path):
    first = registry.register(sb3_runs / "cartpole_healthy_s0")
    with pytest.raises(AlreadyRegisteredError) as info:
        registry.register(sb3_runs / "cartpole_healthy_s0")
    assert info.value.run_id == first.run_id
    again = registry.register(sb3_runs / "cartpole_healthy_s0", replace=True)
    assert again.replaced == first.run_id
    assert registry.list_runs()[1] == 1


def test_every_shared_run_registers(registry: Registry, sb3_runs: Path):
    for run_dir in sorted(sb3_runs.iterdir()):
        result = registry.register(run_dir, project="sb3")
        assert not result.unmapped or set(result.unmapped) <= {"train/n_updates"}, result.unmapped
    assert registry.list_runs(where="task=Pendulum-v1")[1] == 1
    assert registry.list_runs(where="learning_rate<1e-5")[0][0]["name"] == "cartpole_tiny_lr_1e-6"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_decreasing_step_is_rejected_with_file_and_line(registry: Registry, tmp_path: Path):
    csv = _write(tmp_path / "run.csv", "step,loss\n1,0.5\n2,0.4\n3,0.35\n2,0.3\n")
    with pytest.raises(StepOrderError, match=r"run.csv, line 5: decreasing step 2 for metric 'loss'.*keep-last"):
        registry.register(csv)
    assert registry.list_runs()[1] == 0
    result = registry.register(csv, on_disorder="keep-last")
    assert registry.read_series(result.run_id, "loss").values.tolist() == [0.5, 0.3]
    assert any("step 2" in w for w in result.warnings)


def test_repeated_steps_are_kept_by_default_and_refused_when_strict(registry: Registry, tmp_path: Path):
    csv = _write(tmp_path / "run.csv", "step,loss\n1,0.5\n2,0.4\n2,0.3\n3,0.2\n")
    with pytest.raises(StepOrderError, match=r"run.csv, line 4: duplicate step 2 for metric 'loss'.*keep-all"):
        registry.register(csv, on_disorder="error")
    assert registry.list_runs()[1] == 0
    result = registry.register(csv)
    assert result.point_count == 4 and not result.warnings
    stored = registry.read_series(result.run_id, "loss")
    assert stored.steps.tolist() == [1, 2, 2, 3] and stored.values.tolist() == [0.5, 0.4, 0.3, 0.2]


def test_text_in_numeric_column_names_line_and_column(registry: Registry, tmp_path: Path):
    csv = _write(tmp_path / "bad.csv", "step,reward\n1,0.5\n2,oops\n")
    with pytest.raises(InputError, match=r"bad.csv.*line 3") as info:
        registry.register(csv)
    assert "reward" in str(info.value)
    assert registry.list_runs()[1] == 0


@pytest.mark.parametrize("content, message", [
    ("", "empty|no metric points"),
    ("hello world\nthis is not a log\n", "format|no metric points"),
])
def test_empty_and_unknown_files(registry: Registry, tmp_path: Path, content: str, message: str):
    with pytest.raises(InputError, match=message):
        registry.register(_write(tmp_path / "x.txt", content))


def test_truncated_event_file_changes_nothing(registry: Registry, sb3_runs: Path, tmp_path: Path):
    registry.register(sb3_runs / "cartpole_healthy_s0")
    src = next((sb3_runs / "cartpole_tiny_lr_1e-6").glob("events.out.tfevents.*"))
    broken_dir = tmp_path / "truncated"
    broken_dir.mkdir()
    data = src.read_bytes()
    (broken_dir / src.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=src.name):
        registry.register(broken_dir)
    assert registry.list_runs()[1] == 1


def test_params_and_semantics_from_arguments(registry: Registry, sb3_runs: Path, tmp_path: Path):
    run_dir = tmp_path / "copy"
    shutil.copytree(sb3_runs / "cartpole_healthy_s0", run_dir)
    result = registry.register(run_dir, params={"seed": 0, "notes": {"owner": "rl-team"}},
                               semantics={"train/approx_kl": {"kl_estimator": "k1"}}, tags=["repro"])
    detail = registry.run_detail(result.run_id)
    assert detail["params"]["notes.owner"] == "rl-team" and detail["tags"] == ["repro"]
    assert _series(registry, result.run_id)["train/approx_kl"]["semantics"]["kl_estimator"] == "k1"
