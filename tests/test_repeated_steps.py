"""Series that hold several points at one step: stored as logged, read one point per step where a
curve is needed, and the Trainer's end-of-training summary kept apart as scores."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from registry import Registry, open_registry
from registry.core.errors import StepOrderError
from registry.core.series import Point
from registry.core.series import SeriesBuilder, SeriesData
from registry.web.app import create_app

DATA = Path(__file__).parent / "data"


def _points(key: str, pairs: list[tuple[int, float]]) -> list[Point]:
    return [Point(key, step, value, None, f"line {i + 2}") for i, (step, value) in enumerate(pairs)]


def test_per_step_means_finite_points_counts_them_and_keeps_order():
    sd = SeriesData(np.array([1, 1, 2, 3, 3, 3, 4, 4]),
                    np.array([5.0, 7.0, 2.0, 1.0, math.nan, 3.0, math.inf, math.nan]),
                    np.array([10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]))
    assert sd.has_repeats
    one = sd.per_step()
    assert one.steps.tolist() == [1, 2, 3, 4]
    assert one.values[:3].tolist() == [6.0, 2.0, 2.0]  # NaN left out of step 3's mean
    assert one.values[3] == math.inf  # no finite point at step 4: its first non-finite value stands
    assert one.counts.tolist() == [2, 1, 3, 2]
    assert one.wall_times.tolist() == [11.0, 12.0, 15.0, 17.0]  # the step's last wall time
    plain = SeriesData(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    assert not plain.has_repeats and plain.per_step() is plain


def test_builder_keeps_every_point_of_a_step_and_refuses_a_step_going_back():
    builder = SeriesBuilder("runs/a")
    builder.extend(_points("charts/episodic_return", [(128, 9.0), (128, 11.0), (256, 20.0), (256, 20.0)]))
    built = builder.build()["charts/episodic_return"]
    assert built.steps.tolist() == [128, 128, 256, 256]
    assert built.values.tolist() == [9.0, 11.0, 20.0, 20.0]  # equal returns of two episodes are two points
    assert not builder.warnings
    with pytest.raises(StepOrderError, match=r"runs/a, line 6: decreasing step 128 .*keep-last"):
        builder.add(Point("charts/episodic_return", 128, 1.0, None, "line 6"))


def test_a_schedule_repeating_its_value_at_one_step_is_one_point():
    builder = SeriesBuilder("trainer_state.json", "error")  # even the strict policy accepts it
    builder.extend(_points("epoch", [(10, 0.5), (20, 1.0), (20, 1.0)]))
    builder.extend(_points("train/learning_rate", [(20, 1e-5), (20, 1e-5)]))
    built = builder.build()
    assert built["epoch"].steps.tolist() == [10, 20]
    assert built["train/learning_rate"].steps.tolist() == [20]
    with pytest.raises(StepOrderError, match="duplicate step 20 for metric 'epoch'"):
        builder.add(Point("epoch", 20, 1.5, None, "log_history[3]"))  # a different value is no repeat


def test_trainer_state_with_end_of_training_summary_registers_by_default(registry: Registry):
    result = registry.register(DATA / "trl_grpo" / "trainer_state.json")
    assert result.summary == {"train_runtime": 1832.4, "train_samples_per_second": 0.437,
                              "train_steps_per_second": 0.027, "total_flos": 0.0, "train_loss": 0.0041}
    assert not result.warnings
    detail = registry.run_detail(result.run_id)
    assert detail["scores"]["train_runtime"] == 1832.4
    keys = {s["key"] for s in detail["series"]}
    assert not keys & {"train_runtime", "total_flos", "train_loss"}
    epoch = registry.read_series(result.run_id, "epoch")
    assert epoch.steps.tolist() == sorted(set(epoch.steps.tolist()))  # the summary's epoch is no second point


def test_per_step_train_loss_in_a_custom_log_stays_a_series(registry: Registry, tmp_path: Path):
    csv = tmp_path / "custom.csv"
    csv.write_text("step,train_loss,train_runtime\n1,0.9,\n2,0.7,\n3,0.5,12.5\n")
    result = registry.register(csv)
    assert result.summary == {"train_runtime": 12.5}  # only the one-point summary moves to scores
    assert registry.read_series(result.run_id, "train_loss").values.tolist() == [0.9, 0.7, 0.5]


def _episodes_csv(path: Path, level) -> Path:
    """A CleanRL-like log: two episodes end at each of 40 steps."""
    rows = ["step,charts/episodic_return"]
    for step in range(1, 41):
        rows += [f"{step * 100},{level(step)}", f"{step * 100},{level(step) + 2}"]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_curves_for_diagnosis_and_similarity_take_one_point_per_step(registry: Registry, tmp_path: Path):
    result = registry.register(_episodes_csv(tmp_path / "a.csv", lambda s: s), framework="cleanrl")
    name = result.mapped["charts/episodic_return"]
    assert len(registry.read_series(result.run_id, "charts/episodic_return")) == 80
    curve = registry.canonical_curves(result.run_id)[name]
    assert curve.steps.tolist() == [s * 100 for s in range(1, 41)]
    assert curve.values.tolist() == [s + 1.0 for s in range(1, 41)]
    assert curve.counts.tolist() == [2] * 40

    from registry.analysis.similarity import find_similar

    twin = registry.register(_episodes_csv(tmp_path / "b.csv", lambda s: 2 * s), framework="cleanrl")
    other = registry.register(_episodes_csv(tmp_path / "c.csv", lambda s: 40 - s), framework="cleanrl")
    found = find_similar(registry, result.run_id, metrics=name, k=2)
    ranked = [n.run_id for n in found.neighbours]
    assert ranked == [twin.run_id, other.run_id]  # same rising shape first, the falling one last


def test_series_api_returns_every_point_or_one_per_step_with_counts(db_url, openapi, tmp_path: Path):
    from test_web_support import check_response

    reg = open_registry(db_url)
    csv = tmp_path / "r.csv"
    csv.write_text("step,ret\n1,5\n1,7\n2,3\n3,4\n3,8\n")
    run_id = reg.register(csv).run_id
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()
    for query, steps, values, counts in (
        ({"key": "ret"}, [1, 1, 2, 3, 3], [5, 7, 3, 4, 8], None),
        ({"key": "ret", "per_step": "1"}, [1, 2, 3], [6, 3, 6], [2, 1, 2]),
    ):
        response = client.get(f"/api/runs/{run_id}/series", query_string=query)
        assert response.status_code == 200
        check_response(openapi, response, f"/api/runs/{run_id}/series", query_string=query)
        body = response.get_json()
        assert body["repeated_steps"] is True and body["count"] == 5
        assert body["steps"] == steps and body["values"] == values and body.get("counts") == counts
    reg.close()


def test_dashboard_plot_and_export_of_a_repeated_step_series(db_url, tmp_path: Path):
    reg = open_registry(db_url)
    run_id = reg.register(_episodes_csv(tmp_path / "r.csv", lambda s: s % 7), framework="cleanrl").run_id
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()
    assert client.get(f"/runs/{run_id}").status_code == 200
    plot = client.get(f"/plots/run/{run_id}", query_string={"key": "charts/episodic_return"})
    assert plot.status_code == 200 and plot.mimetype == "image/png" and plot.data[:4] == b"\x89PNG"
    export = client.get(f"/plots/run/{run_id}/data.json", query_string={"key": "charts/episodic_return"})
    rows = export.get_json()
    assert rows["count"] == 80 and rows["step"][:2] == [100, 100]
    # Both episodes of a step share the step's smoothed value: the line runs over per-step means.
    assert all(rows["smoothed"][i] == rows["smoothed"][i + 1] for i in range(0, 80, 2))
    assert rows["smoothed"][0] == pytest.approx(1 + 1)  # first step: mean of 1 and 3, nothing before it
    reg.close()


def test_summary_with_runtime_logged_every_step_keeps_the_runtime_curve():
    """transformers with include_num_input_tokens_seen adds train_runtime to every log entry."""
    from registry.importers.run_summary import split_run_summary

    steps = np.array([10, 20, 30])
    data = {
        "train/loss": SeriesData(steps, np.array([1.0, 0.8, 0.6])),
        "train/train_runtime": SeriesData(np.array([10, 20, 30, 30]), np.array([1.0, 2.0, 3.0, 3.1])),
        "train/total_flos": SeriesData(np.array([30]), np.array([5e12])),
        "train/train_loss": SeriesData(np.array([30]), np.array([0.8])),
    }
    series, scores = split_run_summary(data)
    assert scores == {"train_runtime": 3.1, "total_flos": 5e12, "train_loss": 0.8}
    assert set(series) == {"train/loss", "train/train_runtime"}
    assert len(series["train/train_runtime"]) == 4


def test_downsampling_a_repeated_step_series_keeps_its_spike(db_url, tmp_path: Path):
    reg = open_registry(db_url)
    csv = tmp_path / "many.csv"
    rows = ["step,charts/episodic_return"] + [f"{i // 3},{(i * 7919) % 13}" for i in range(15000)]
    rows[7001] = "2333,500"  # one episode's spike, among three at its step
    csv.write_text("\n".join(rows) + "\n")
    run_id = reg.register(csv).run_id
    client = create_app({"REGISTRY": reg, "TESTING": True}).test_client()
    body = client.get(f"/api/runs/{run_id}/series",
                      query_string={"key": "charts/episodic_return", "points": 300}).get_json()
    assert body["downsampled"] and body["returned"] <= 300 and 500 in body["values"]
    assert body["steps"] == sorted(body["steps"])
    reg.close()
