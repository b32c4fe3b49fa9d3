"""The registry API on a real SQLite file and a real PostgreSQL server."""
from __future__ import annotations

import math

import numpy as np
import pytest

from registry import Registry, SeriesData
from registry.core.errors import AlreadyRegisteredError, InputError, NotFoundError, StepOrderError


def test_stream_log_finish_and_read_back(registry: Registry):
    with registry.create_run(
        "grpo-lr1e-6", project="math", algorithm="grpo", framework="verl", task="gsm8k",
        params={"actor": {"lr": 1e-6, "ppo_epochs": 1}, "algorithm": {"adv_estimator": "grpo"}, "use_kl": True},
        tags=["baseline", "seed0"], code_version="abc1234",
    ) as run:
        for step in range(1, 301):
            run.log(step, {"critic/score/mean": step / 300, "actor/ppo_kl": 1e-4 * step, "my/custom": float(step)})
        run.set_outcome(verdict="success", scores={"gsm8k_acc": 0.71}, notes="clean run",
                        checkpoints=[(100, "s3://ckpt/100"), (300, "s3://ckpt/300")])
    detail = registry.run_detail(run.id)
    assert detail["status"] == "finished" and detail["algorithm"] == "GRPO"
    assert detail["params"] == {"actor.lr": 1e-6, "actor.ppo_epochs": 1, "algorithm.adv_estimator": "grpo",
                                "use_kl": True}
    assert detail["tags"] == ["baseline", "seed0"]
    assert detail["scores"] == {"gsm8k_acc": 0.71}
    assert [c["step"] for c in detail["checkpoints"]] == [100, 300]
    by_key = {s["key"]: s for s in detail["series"]}
    assert by_key["critic/score/mean"]["count"] == 300
    assert by_key["critic/score/mean"]["last"] == pytest.approx(1.0)
    assert by_key["my/custom"]["definition"] is None  # unmapped, but stored
    data = registry.read_series(run.id, "critic/score/mean")
    assert data.steps.tolist() == list(range(1, 301))
    assert data.values[-1] == pytest.approx(1.0)


def test_bindings_carry_framework_semantics(registry: Registry):
    """SB3 approx_kl is k3; CleanRL old_approx_kl is k1: the same concept, not comparable."""
    sb3 = registry.register_arrays("sb3", {"train/approx_kl": ([1, 2], [0.01, 0.02]),
                                           "train/entropy_loss": ([1, 2], [-0.69, -0.6])},
                                   framework="stable-baselines3")
    clean = registry.register_arrays("clean", {"losses/old_approx_kl": ([1, 2], [0.01, 0.02])}, framework="cleanrl")
    sb3_series = {s["key"]: s for s in registry.run_detail(sb3.run_id)["series"]}
    clean_series = {s["key"]: s for s in registry.run_detail(clean.run_id)["series"]}
    assert sb3_series["train/approx_kl"]["definition"] == clean_series["losses/old_approx_kl"]["definition"]
    assert sb3_series["train/approx_kl"]["semantics"]["kl_estimator"] == "k3"
    assert clean_series["losses/old_approx_kl"]["semantics"]["kl_estimator"] == "k1"
    # SB3 logs negative entropy; the canonical view flips it, the raw view keeps it.
    entropy_def = sb3_series["train/entropy_loss"]["definition"]
    assert registry.read_series(sb3.run_id, "train/entropy_loss").values.tolist() == [-0.69, -0.6]
    assert registry.read_series(sb3.run_id, entropy_def, canonical=True).values.tolist() == [0.69, 0.6]
    assert registry.canonical_curves(sb3.run_id)[entropy_def].values.tolist() == [0.69, 0.6]


def test_run_level_semantic_override(registry: Registry):
    result = registry.register_arrays(
        "custom-kl", {"train/approx_kl": ([1, 2, 3], [0.1, 0.2, 0.3])}, framework="stable-baselines3",
        semantics={"train/approx_kl": {"kl_estimator": "k1"}},
    )
    series = registry.run_detail(result.run_id)["series"][0]
    assert series["semantics"]["kl_estimator"] == "k1"
    assert series["overrides"] == {"kl_estimator": "k1"}
    with pytest.raises(InputError, match="kl_estimator must be one of"):
        registry.register_arrays("bad", {"train/approx_kl": ([1], [0.1])}, framework="stable-baselines3",
                                 semantics={"train/approx_kl": {"kl_estimator": "k9"}})


def test_nan_and_inf_are_kept_and_counted(registry: Registry):
    values = [1.0, math.nan, 2.0, math.inf, -math.inf, 3.0]
    result = registry.register_arrays("nan-run", {"loss": (list(range(6)), values)})
    series = registry.run_detail(result.run_id)["series"][0]
    assert (series["count"], series["nan_count"], series["inf_count"]) == (6, 1, 2)
    assert (series["min"], series["max"], series["mean"]) == (1.0, 3.0, 2.0)
    back = registry.read_series(result.run_id, "loss").values
    assert np.array_equal(back, np.array(values), equal_nan=True)


def test_append_only_and_idempotent_batches(registry: Registry):
    run = registry.create_run("streamer")
    run.log(1, {"loss": 1.0})
    run.log(2, {"loss": 0.9})
    run.log(2, {"loss": 0.8})  # a second point at one step (another episode ending there) is data
    with pytest.raises(InputError, match="before step 2"):
        run.log(1, {"loss": 0.8})
    run.flush()
    batch = {"loss": SeriesData(np.array([3, 4]), np.array([0.7, 0.6]))}
    assert registry.append(run.id, batch, batch_id="b-1") is True
    assert registry.append(run.id, batch, batch_id="b-1") is False  # a retry after a timeout
    with pytest.raises(StepOrderError, match="append-only"):
        registry.append(run.id, {"loss": SeriesData(np.array([3]), np.array([0.5]))})
    registry.append(run.id, {"loss": SeriesData(np.array([4]), np.array([0.5]))})
    run.finish()
    assert registry.read_series(run.id, "loss").steps.tolist() == [1, 2, 2, 3, 4, 4]


def test_many_small_appends_are_compacted_and_read_in_order(registry: Registry):
    run = registry.create_run("chunky")
    for i in range(40):
        registry.append(run.id, {"x": SeriesData(np.arange(i * 10, i * 10 + 10), np.full(10, float(i)))})
    run.finish()
    data = registry.read_series(run.id, "x")
    assert data.steps.tolist() == list(range(400))
    assert data.values[-1] == 39.0


def test_crash_inside_context_marks_run_crashed(registry: Registry):
    with pytest.raises(RuntimeError):
        with registry.create_run("doomed") as run:
            run.log(1, {"loss": 1.0})
            raise RuntimeError("trainer died")
    detail = registry.run_detail(run.id)
    assert detail["status"] == "crashed"
    assert detail["series"][0]["count"] == 1


def test_failed_registration_leaves_nothing(registry: Registry):
    with pytest.raises(InputError):
        registry.register_arrays("half", {"ok": ([1, 2], [1.0, 2.0]), "bad": ([2, 1], [1.0, 2.0])})
    rows, total = registry.list_runs()
    assert total == 0 and rows == []


def test_user_run_id_is_idempotent(registry: Registry):
    registry.create_run("mine", run_id="a" * 32)
    with pytest.raises(AlreadyRegisteredError):
        registry.create_run("mine again", run_id="a" * 32)


def test_resolve_by_name_prefix_and_missing(registry: Registry):
    run = registry.create_run("unique-name")
    assert registry.run_detail("unique-name")["id"] == run.id
    assert registry.run_detail(run.id[:8])["id"] == run.id
    with pytest.raises(NotFoundError):
        registry.run_detail("nope")


def test_hostile_strings_are_stored_verbatim(registry: Registry):
    name = "<script>alert(1)</script>'; DROP TABLE runs; --"
    result = registry.register_arrays(name, {"x": ([1], [1.0])}, tags=["<b>x</b>"], params={"note": "' OR 1=1 --"})
    detail = registry.run_detail(result.run_id)
    assert detail["name"] == name and detail["tags"] == ["<b>x</b>"] and detail["params"]["note"] == "' OR 1=1 --"
    with pytest.raises(InputError, match="control characters"):
        registry.create_run("bad\x00name")


@pytest.mark.parametrize("args, kwargs, field", [
    (("\ud800", {"x": ([1], [1.0])}), {}, "run name"),
    (("a", {"k\ud800": ([1], [1.0])}), {}, "metric key"),
    (("a", {"x": ([1], [1.0])}), {"params": {"lr": "\udfff"}}, "hyperparameter 'lr'"),
    (("a", {"x": ([1], [1.0])}), {"params": {"\ud800": 1}}, "hyperparameter name"),
    (("a", {"x": ([1], [1.0])}), {"tags": ["\ud800"]}, "tag"),
    (("a", {"x": ([1], [1.0])}), {"outcome": {"notes": "ok\ud800"}}, "notes"),
])
def test_text_no_database_can_store_is_refused_naming_the_field(registry: Registry, args, kwargs, field):
    # A lone surrogate cannot be encoded by any driver: it is an InputError, and nothing is stored
    with pytest.raises(InputError, match=field):
        registry.register_arrays(*args, **kwargs)
    assert registry.list_runs()[0] == []


def test_notes_keep_their_lines(registry: Registry):
    registry.register_arrays("r", {"x": ([1], [1.0])})
    registry.set_outcome("r", notes="re-evaluated\non 100 episodes\tok")
    assert registry.run_detail("r")["notes"] == "re-evaluated\non 100 episodes\tok"
    with pytest.raises(InputError, match="control characters"):
        registry.set_outcome("r", notes="bell\x07")


def test_an_edit_with_unstorable_text_changes_nothing(registry: Registry):
    from registry.store.run_history import CheckpointEntry, RunEdit, edit_run
    registry.register_arrays("r", {"x": ([1], [1.0])}, tags=["keep"])
    bad = RunEdit(verdict=None, scores={}, tags=["keep"], notes=None,
                  checkpoints=[CheckpointEntry(step=1, uri="s3://ckpt\ud800")])
    with pytest.raises(InputError, match="lone surrogate"):
        edit_run(registry, "r", bad, author=None)
    assert registry.run_detail("r")["tags"] == ["keep"] and registry.run_detail("r")["checkpoints"] == []


def test_outcome_validation(registry: Registry):
    run = registry.create_run("r")
    with pytest.raises(InputError, match="verdict must be one of"):
        registry.set_outcome(run.id, verdict="great")
    with pytest.raises(InputError, match="must be a number"):
        registry.set_outcome(run.id, scores={"acc": "high"})


def test_list_runs_filters(registry: Registry):
    registry.register_arrays("a", {"critic/score/mean": ([1, 2], [0.1, 0.9])}, framework="verl",
                             algorithm="GRPO", params={"actor": {"lr": 1e-6}}, tags=["sweep"])
    registry.register_arrays("b", {"critic/score/mean": ([1, 2], [0.1, 0.2])}, framework="verl",
                             algorithm="GRPO", params={"actor": {"lr": 1e-4}})
    registry.register_arrays("c", {"rollout/ep_rew_mean": ([1], [20.0])}, framework="stable-baselines3",
                             algorithm="PPO", params={"learning_rate": 3e-4})
    names = lambda where: sorted(r["name"] for r in registry.list_runs(where=where)[0])  # noqa: E731
    assert names("actor.lr>1e-5 and algorithm=GRPO") == ["b"]
    assert names("algorithm=grpo") == ["a", "b"]
    assert names("tag=sweep or learning_rate=3e-4") == ["a", "c"]
    assert names("not tag=sweep") == ["b", "c"]
    assert names("metric.critic/score/mean.last>0.5") == ["a"]
    assert names("metric.reward_sequence_mean.last>0.5") == names("metric.critic/score/mean.last>0.5")
    assert names("name in (a, c)") == ["a", "c"]
    assert names("name ~ '%'") == []  # LIKE wildcards are escaped
    rows, total = registry.list_runs(limit=2, order_by="name")
    assert total == 3 and [r["name"] for r in rows] == ["a", "b"]


def test_sort_by_hyperparameter_and_metric(registry: Registry):
    for name, lr, last in (("a", 3e-4, 0.5), ("b", 1e-6, 0.9), ("c", None, 0.1)):
        params = {"learning_rate": lr} if lr is not None else {"optimizer": "adam"}
        registry.register_arrays(name, {"critic/score/mean": ([1, 2], [0.0, last])}, framework="verl", params=params)
    order = lambda key: [r["name"] for r in registry.list_runs(order_by=key)[0]]  # noqa: E731
    assert order("param.learning_rate") == ["b", "a", "c"]  # runs without the key last
    assert order("-param.learning_rate") == ["a", "b", "c"]
    assert order("-metric.reward_sequence_mean.last") == ["b", "a", "c"]
    assert order("metric.critic/score/mean.max") == ["c", "a", "b"]
    with pytest.raises(InputError, match="cannot sort by"):
        registry.list_runs(order_by="bogus")
    with pytest.raises(InputError, match="STAT one of"):
        registry.list_runs(order_by="metric.reward.median")
