"""The filter language: parsed, never evaluated; clean errors for malformed and hostile input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import open_registry
from registry.core.errors import FilterSyntaxError
from registry.store.filters import compile_filter


@pytest.mark.parametrize("expression, message", [
    ("lr>>1", "column 4"),
    ("lr >", "expected"),
    ("(algorithm=PPO", "expected"),
    ("algorithm<PPO", "is text"),
    ("lr > abc", "needs a number"),
    ("metric.reward_mean.median>1", "STAT one of"),
    ("score.acc ~ 3", "compares with a number"),
])
def test_malformed_filters_name_the_problem(expression: str, message: str):
    with pytest.raises(FilterSyntaxError, match=message):
        compile_filter(expression)


@pytest.mark.parametrize("payload", [
    "name=\"x' OR '1'='1\"",
    "name='; DROP TABLE runs; --'",
    "tag=\"\\\" OR 1=1 --\"",
    "algorithm=PPO) OR (1=1",
])
def test_sql_injection_payloads_are_values_or_syntax_errors(db_url: str, payload: str):
    reg = open_registry(db_url)
    reg.register_arrays("victim", {"x": ([1], [1.0])})
    try:
        rows, total = reg.list_runs(where=payload)
        assert total == 0
    except FilterSyntaxError:
        pass
    assert reg.list_runs()[1] == 1  # the table is still there, with its run
    reg.close()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_random_text_parses_or_raises_filter_syntax_error(text: str):
    try:
        compile_filter(text)
    except FilterSyntaxError:
        pass


def test_a_hyperparameter_no_run_has_is_an_error_with_suggestions(registry):
    from registry.core.errors import InputError
    from registry.core.series import SeriesData
    import numpy as np

    curve = {"loss": SeriesData(np.arange(1, 4), np.array([1.0, 0.5, 0.2]))}
    registry.register_arrays("a", curve, params={"learning_rate": 3e-4, "actor": {"optim": {"lr": 1e-6}}})
    registry.register_arrays("b", curve, params={"learning_rate": 1e-3, "n_epochs": 10})
    with pytest.raises(InputError, match=r"no run has a hyperparameter 'lr'; did you mean .*learning_rate"):
        registry.list_runs(where="lr>1e-4")
    with pytest.raises(InputError, match=r"'n_epoch'; did you mean n_epochs"):
        registry.list_runs(where="algorithm=PPO and n_epoch=10")
    # Keys that exist (also only in some runs, or nested) filter as before.
    assert registry.list_runs(where="learning_rate>5e-4")[1] == 1
    assert registry.list_runs(where="actor.optim.lr<1e-5")[1] == 1
    assert registry.list_runs(where="n_epochs=10 or learning_rate<1e-3")[1] == 2
