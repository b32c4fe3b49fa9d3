"""The filter language: parsed, never evaluated; clean errors for malformed and hostile input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import Registry
from registry.errors import FilterSyntaxError
from registry.filters import compile_filter


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
    reg = Registry(db_url)
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
