"""The broken-file corpus in tests/data/broken: every failure names the file and where.

See tests/data/broken/README.md for how each file was made.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest

from registry.core.errors import InputError, UnknownFormatError
from registry.importers import open_source
from registry.importers.params import load_params_file

BROKEN = Path(__file__).resolve().parent / "data" / "broken"


def read_all(path: Path, format: str | None = None) -> list:
    return list(open_source(path, format=format).points())


@pytest.mark.parametrize("name, position, message", [
    # The loader swallows these and stops; the importer compares bytes read with the file size.
    ("events.out.tfevents.truncated", "record 337",
     "event file is truncated: the record needs 48 bytes but only 34 remain"),
    ("events.out.tfevents.bitflip", "record 250", "event file is corrupt: record data fails its CRC check"),
    ("mixed_types.csv", "line 4, column 'losses/approx_kl'", "expected a number, got 'see log'"),
    ("fractional_step.csv", "line 4, column 'step'", "step must be an integer, got '6144.5'"),
    ("short_row.csv", "line 4", "row has 2 cells but the header has 4"),
    ("not_utf8.csv", "line 4", "not UTF-8 text"),
    ("bad_line.jsonl", "line 3", "not valid JSON: Expecting ':' delimiter"),
    ("bad_step_verl.log", "line 3", "step must be an integer, got 'two'"),
])
def test_broken_input_names_file_and_position(name, position, message):
    path = BROKEN / name
    with pytest.raises(InputError) as info:
        read_all(path)
    error = info.value
    assert type(error) is InputError
    assert (error.source, error.position) == (str(path), position)
    assert error.reason.startswith(message)
    assert name in str(error) and position in str(error)


def test_points_before_the_damage_are_yielded_first():
    # Opening scans the whole event file, so the damage is reported before any point.
    with pytest.raises(InputError, match="record 337"):
        open_source(BROKEN / "events.out.tfevents.truncated")
    # A text file fails only when its bad line is reached.
    source = open_source(BROKEN / "bad_line.jsonl")
    seen = []
    with pytest.raises(InputError, match="line 3"):
        for point in source.points():
            seen.append(point.step)
    assert seen == [0, 0, 1, 1]


def test_wrapped_verl_log_parses():
    source = open_source(BROKEN / "wrapped_verl.log")
    series = defaultdict(list)
    for point in source.points():
        series[point.key].append(point)
    assert source.warnings == []
    reference = {p.key for p in open_source(BROKEN.parent / "verl_grpo.log").points() if p.step == 2}
    assert set(series) == reference  # every key of an unwrapped step-2 record, nothing half-joined
    assert all(len(points) == 2 for points in series.values())
    # Split mid-key ("actor/pg_clipf" / "rac_lower"), after the prefix, after trimmed spaces.
    assert [p.value for p in series["actor/pg_clipfrac_lower"]] == [0.0, 0.0]
    assert [p.value for p in series["actor/ppo_kl"]] == [1e-05, -8.1e-06]
    assert [p.value for p in series["perf/cpu_memory_used_gb"]] == [82.3, 82.3]
    assert [(p.value, p.position) for p in series["perf/total_num_tokens"]] == [
        (518100.0, "line 11"), (518200.0, "line 23"),
    ]


def test_nonfinite_trainer_state_keeps_nan_and_inf():
    values = {(p.key, p.step): p.value for p in read_all(BROKEN / "nonfinite_trainer_state.json")}
    assert math.isnan(values["grad_norm", 20])
    assert values["grad_norm", 30] == math.inf
    assert values["loss", 30] == -math.inf
    assert values["reward", 30] == 0.7


@pytest.mark.parametrize("name, format", [
    ("empty.csv", None),
    ("empty.csv", "jsonl"),
    ("empty_history_trainer_state.json", None),
    ("no_metrics.log", "verl_log"),
])
def test_no_metric_points(name, format):
    with pytest.raises(InputError, match="no metric points found") as info:
        open_source(BROKEN / name, format=format)
    assert name in str(info.value)


@pytest.mark.parametrize("name", ["unknown_format.txt", "no_metrics.log"])
def test_unknown_format_lists_the_formats(name):
    with pytest.raises(UnknownFormatError) as info:
        open_source(BROKEN / name)
    assert name in str(info.value)
    assert "known formats: tensorboard, trainer_state, verl_log, verl_file, csv, jsonl" in str(info.value)


def test_directory_without_event_files_is_unknown(tmp_path):
    (tmp_path / "notes.md").write_text("nothing here\n")
    with pytest.raises(UnknownFormatError, match="cannot tell what kind of directory"):
        open_source(tmp_path)


def test_bad_params_yaml_names_line_and_column():
    path = BROKEN / "bad_params.yaml"
    with pytest.raises(InputError) as info:
        load_params_file(path)
    assert (info.value.source, info.value.position) == (str(path), "line 5, column 13")
    assert "not valid YAML" in str(info.value)


def test_params_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="params.yaml: expected a mapping of names to values, got list"):
        load_params_file(path)


def test_event_file_of_garbage(tmp_path):
    path = tmp_path / "events.out.tfevents.0.host"
    path.write_bytes(b"this is not a record file at all, just bytes\n" * 4)
    with pytest.raises(InputError) as info:
        open_source(path)
    assert info.value.position == "record 1"
    assert "record header fails its CRC check" in str(info.value)


def test_event_file_cut_inside_a_header(tmp_path):
    data = next((BROKEN.parent.parent.parent.parent / "shared" / "data" / "sb3_ppo").glob("*/events.*"), None)
    if data is None:
        pytest.skip("SB3 runs not available")
    whole = data.read_bytes()
    path = tmp_path / "events.out.tfevents.1.host"
    path.write_bytes(whole[: len(whole) - 40] + whole[-40:-30])  # last record loses its tail but keeps 10 stray bytes
    with pytest.raises(InputError, match="event file is truncated"):
        open_source(path)
