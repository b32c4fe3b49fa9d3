"""The labelled real run sets (tests/data/real/sb3_sweep, cleanrl_sweep, trl_sweep): what a diagnosis
must say about a run, by its label."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REAL = Path(__file__).parent / "data" / "real"


def load_labels(run_set: str) -> dict[str, dict[str, Any]]:
    """Run name -> label of one set (``sb3_sweep``, ``cleanrl_sweep``, ``trl_sweep``)."""
    return yaml.safe_load((REAL / run_set / "labels.yaml").read_text())["runs"]


def logger_run_dir(run_set: str, name: str) -> Path:
    """The one run directory a framework's logger made under ``<run>/runs/`` (CleanRL's
    ``<env>__ppo__<seed>__<time>``, transformers' ``<time>_<host>``)."""
    (inner,) = (REAL / run_set / name / "runs").iterdir()
    return inner


def found_problem(prob: dict[str, Any], warn: list[Any], name: str) -> list[Any]:
    """The warnings that find labelled problem ``prob`` of run ``name``: one of its detectors, over its
    steps; asserts there is one."""
    lo, hi = prob["steps"]
    hit = [f for f in warn if f.detector in prob["detectors"] and f.start <= hi and f.end >= lo]
    assert hit, f"{name}: {prob['what']} not found ({[f.summary() for f in warn]})"
    return hit


def assert_finds_labelled_problems(lab: dict[str, Any], name: str, d: Any) -> None:
    """Every labelled problem of run ``name`` has a warning in its steps naming the labelled cause,
    and every warning of diagnosis ``d`` is one of the label's problems or their consequences."""
    warn = d.at_least("warning")
    for prob in lab["problems"]:
        hit = found_problem(prob, warn, name)
        assert any(f.cause == lab["cause"] for f in hit), \
            f"{name}: {[(f.detector, f.cause) for f in hit]} instead of {lab['cause']}"
    allowed = {det for p in lab["problems"] for det in p["detectors"]} | set(lab.get("consequences") or [])
    assert {f.detector for f in warn} <= allowed, [f.summary() for f in warn]
