"""Which stored series stands for a canonical name in a run: one rule, the same for every reader.

Two raw keys of one run bound to one definition: the series with more points stands for the
name; equal counts go to the first raw key in sort order. The store's reads, the canonical
curves behind diagnosis and similarity, and the web's series lookup and card values all agree.
"""
from __future__ import annotations

import numpy as np
import pytest

from registry import open_registry
from registry.web import queries

FORCED = {"aa_kl": {"definition": "kl_ref_mean"}, "zz_kl": {"definition": "kl_ref_mean"}}


@pytest.fixture()
def reg(tmp_path):
    registry = open_registry(f"sqlite:///{tmp_path / 'canonical.db'}")
    yield registry
    registry.close()


def register(reg, name: str, n_aa: int, n_zz: int) -> str:
    data = {"aa_kl": (np.arange(n_aa), np.full(n_aa, 1.0)), "zz_kl": (np.arange(n_zz), np.full(n_zz, 2.0))}
    return reg.register_arrays(name, data, semantics=FORCED, project="p").run_id


@pytest.mark.parametrize(("n_aa", "n_zz", "expected_key", "expected_value"), [
    (5, 10, "zz_kl", 2.0),    # more points wins although its key sorts last
    (10, 5, "aa_kl", 1.0),
    (7, 7, "aa_kl", 1.0),     # a tie goes to the first key
])
def test_every_reader_resolves_the_same_series(reg, n_aa, n_zz, expected_key, expected_value) -> None:
    run_id = register(reg, f"run-{n_aa}-{n_zz}", n_aa, n_zz)
    expected_len = max(n_aa, n_zz)

    stored = reg.read_series(run_id, "kl_ref_mean", canonical=True)
    assert len(stored.steps) == expected_len and set(stored.values) == {expected_value}

    curve = reg.canonical_curves(run_id)["kl_ref_mean"]
    assert len(curve.steps) == expected_len and set(curve.values) == {expected_value}

    ref = queries.series_ref(reg, run_id, "kl_ref_mean")
    assert ref.key == expected_key

    card = queries.last_values(reg, [run_id])[run_id]["kl_ref_mean"]
    assert card["key"] == expected_key and card["value"] == expected_value


def test_the_store_reads_a_step_range_per_step_and_reduced(reg) -> None:
    steps = np.repeat(np.arange(1000), 2)            # two points at every step
    values = np.sin(steps / 50.0)
    values[1200] = 40.0                              # one spike inside the range
    run_id = reg.register_arrays("window", {"loss": (steps, values)}, project="p").run_id

    window = reg.read_series(run_id, "loss", from_step=400, to_step=799)
    assert window.steps.min() == 400 and window.steps.max() == 799 and len(window.steps) == 800

    per_step = reg.read_series(run_id, "loss", from_step=400, to_step=799, per_step=True)
    assert len(per_step.steps) == 400 and set(per_step.counts) == {2}

    reduced = reg.read_series(run_id, "loss", from_step=400, to_step=799, max_points=50)
    assert len(reduced.steps) <= 50
    assert reduced.values.max() == 40.0              # MinMaxLTTB keeps the spike
