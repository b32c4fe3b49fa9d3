"""Property tests: whatever bytes the text importers are fed, they yield points or raise
InputError, never another exception.

Inputs are both generated from scratch (shaped like the format, with hostile cells) and
made by mutating the real fixtures byte by byte.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.core.errors import InputError
from registry.importers import open_source
from registry.core.series import Point

DATA = Path(__file__).resolve().parent / "data"
FIXTURES = {
    "csv": (DATA / "wandb_history.csv").read_bytes(),
    "jsonl": (DATA / "wandb_history.jsonl").read_bytes(),
    "verl_log": (DATA / "broken" / "wrapped_verl.log").read_bytes(),
}
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

cells = st.one_of(
    st.sampled_from(["", "0", "-1", "3.5", "1e-3", "nan", "NaN", "inf", "-inf", "Infinity", "abc", "1e400",
                     "9" * 30, "true", " 7 ", '"', "np.float64(0.5)", "[1, 2]", "\x00", "é"]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=8),
)
keys = st.sampled_from(["step", "_step", "global_step", "train/loss", "value", "key", "_timestamp", "reward", ""])


def outcome(data: bytes, suffix: str, format: str | None) -> list[Point] | InputError:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"input{suffix}"
        path.write_bytes(data)
        try:
            source = open_source(path, format=format)
            points = list(source.points())
        except InputError as error:
            return error
    for point in points:
        assert isinstance(point.key, str) and isinstance(point.step, int) and isinstance(point.value, float)
        assert point.wall_time is None or isinstance(point.wall_time, float)
        assert point.position.startswith("line ")
    return points


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    buffer = bytearray(data)
    for kind, where, byte in edits:
        if not buffer:
            buffer.append(byte)
            continue
        at = where % len(buffer)
        if kind == 0:
            buffer[at] = byte
        elif kind == 1:
            del buffer[at]
        elif kind == 2:
            buffer.insert(at, byte)
        else:
            del buffer[at:]  # truncate
    return bytes(buffer)


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8)
# Bytes that matter to the parsers, so mutations hit structure, not just text.
structural = st.sampled_from(b",\n\r\"{}[]:-. 0123456789eE\x00\xff")


@SETTINGS
@given(st.sampled_from(sorted(FIXTURES)), edits, st.lists(structural, max_size=4))
def test_mutated_fixture_gives_points_or_input_error(format, edit_list, extra):
    data = mutate(FIXTURES[format],
                  [(k, w, extra[i % len(extra)] if extra else b) for i, (k, w, b) in enumerate(edit_list)])
    outcome(data, ".txt", format)
    outcome(data, ".txt", None)  # detection must not crash either


@SETTINGS
@given(st.lists(keys, min_size=1, max_size=5), st.lists(st.lists(cells, min_size=0, max_size=6), max_size=6))
def test_generated_csv(header, rows):
    text = ",".join(header) + "\n" + "".join(",".join(row) + "\n" for row in rows)
    result = outcome(text.encode("utf-8", "surrogatepass"), ".csv", "csv")
    if isinstance(result, list):
        assert all(p.key for p in result)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)


@SETTINGS
@given(st.lists(st.one_of(st.dictionaries(keys, json_values, max_size=5), json_values), max_size=5),
       st.lists(st.sampled_from(["", "{", "}", "NaN", "[[[[", "\n"]), max_size=3))
def test_generated_jsonl(rows, junk):
    import json

    lines = [json.dumps(row) for row in rows] + junk
    outcome("\n".join(lines).encode("utf-8", "surrogatepass"), ".jsonl", "jsonl")


verl_value = st.one_of(cells, st.sampled_from(["0.42", "-8.1e-06", "'text'", "[1, 2]", "{'a': 1}"]))
verl_pair = st.tuples(st.text(alphabet="abcdefghijklmnopqrstuvwxyz/_@-:", min_size=0, max_size=12), verl_value)


@SETTINGS
@given(
    st.lists(st.tuples(cells, st.lists(verl_pair, max_size=5)), max_size=5),
    st.integers(1, 60),
    st.booleans(),
    st.lists(st.sampled_from(["(TaskRunner pid=1) ", "\x1b[36m", "Training Progress: 1%|", "- ", " - ", "step:"]),
             max_size=3),
)
def test_generated_verl_log(records, width, prefix, noise):
    lines = []
    for step, pairs in records:
        body = " - ".join([f"step:{step}"] + [f"{k}:{v}" for k, v in pairs])
        lines += [body[i:i + width] for i in range(0, len(body), width)]  # wrap at a random width
        lines += noise
    text = "\n".join(("(TaskRunner pid=7) " + line) if prefix else line for line in lines) + "\n"
    outcome(text.encode("utf-8", "surrogatepass"), ".log", "verl_log")
