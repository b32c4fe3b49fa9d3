"""Property tests for the binary and JSON importers, and for registration as a whole:
mutated real files give a registration or an InputError, never a crash or a partial write."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import open_registry
from registry.core.errors import InputError, RegistryError
from registry.importers import open_source

from test_importers_properties import edits, mutate, structural

DATA = Path(__file__).resolve().parent / "data"
SB3 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sb3_ppo"
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])


def _event_bytes() -> bytes:
    files = sorted(SB3.glob("cartpole_tiny_lr_1e-6/events.out.tfevents.*"))
    if not files:
        pytest.skip("shared SB3 runs not present")
    return files[0].read_bytes()


def _trainer_state_bytes() -> bytes:
    return next(DATA.rglob("trainer_state.json")).read_bytes()


def _points_or_error(data: bytes, name: str, fmt: str | None) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / name
        path.write_bytes(data)
        try:
            for p in open_source(path, format=fmt).points():
                assert isinstance(p.step, int) and isinstance(p.value, float) and p.position
        except InputError as error:
            assert path.name in str(error) or "no metric points" in str(error) or "format" in str(error)


@SETTINGS
@given(edits, st.lists(structural, max_size=4))
def test_mutated_event_file(edit_list, extra):
    data = mutate(_event_bytes(),
                  [(k, w, extra[i % len(extra)] if extra else b) for i, (k, w, b) in enumerate(edit_list)])
    _points_or_error(data, "events.out.tfevents.1.host", "tensorboard")


@SETTINGS
@given(edits, st.lists(structural, max_size=4))
def test_mutated_trainer_state(edit_list, extra):
    data = mutate(_trainer_state_bytes(),
                  [(k, w, extra[i % len(extra)] if extra else b) for i, (k, w, b) in enumerate(edit_list)])
    _points_or_error(data, "trainer_state.json", "trainer_state")
    _points_or_error(data, "trainer_state.json", None)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(edits)
def test_mutated_registration_is_all_or_nothing(sqlite_url, edit_list):
    reg = open_registry(sqlite_url)
    before = reg.list_runs(limit=None)[1]
    data = mutate(_trainer_state_bytes(), edit_list)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trainer_state.json"
        path.write_bytes(data)
        try:
            result = reg.register(path, replace=True)
        except RegistryError:
            assert reg.list_runs(limit=None)[1] == before
        else:
            detail = reg.run_detail(result.run_id)
            assert sum(s["count"] for s in detail["series"]) == result.point_count
    reg.close()
