"""Clip-fraction points that compare the policy with itself, left out before the detectors read the curve.

TRL's ``GRPOTrainer`` with ``num_iterations`` above 1 reuses each generated batch for that many optimizer
steps, and takes the old policy's log-probabilities when the batch is generated (trl 1.16.0,
``trainer/grpo_trainer.py``: ``_generate_and_score_completions`` computes ``old_per_token_logps`` with the
model of that moment; ``_compute_loss`` forms the ratio against them). The first step on each batch
therefore compares the policy with itself: its ratio is 1 and its clip ratio 0 by construction. Those steps
are the ones the generation metrics (the reward) are logged at, so the reward's steps name them. Read with
them, a run clipping 10-50% of its tokens on the other steps has a median clip fraction near 0.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from registry.analysis.diagnosis.settings import METRIC_ROLES
from registry.analysis.diagnosis.types import Curve


def without_self_comparisons(curves: Mapping[str, Curve],
                             hp: Any) -> tuple[dict[str, Curve], dict[str, dict[str, str]]]:
    """``curves`` with the clip-fraction points at a TRL run's generation steps left out when the run makes
    several updates per batch, and what was left out: clip name -> {"from", "text"}."""
    out = dict(curves)
    setting = hp.get("n_epochs") if hp is not None and hp.framework == "trl" else None
    if setting is None or setting.value is None or setting.value <= 1:
        return out, {}
    reward = next((curves[n] for n in METRIC_ROLES["reward"] if n in curves and len(curves[n])), None)
    if reward is None:
        return out, {}
    generation = np.unique(np.asarray(reward.steps, dtype=np.int64))
    changed: dict[str, dict[str, str]] = {}
    for name in METRIC_ROLES["clip_fraction"]:
        c = curves.get(name)
        # Only where the reward is logged less often than the clip fraction do its steps tell the
        # generation steps apart (every step logs both when each batch gets one update).
        if c is None or len(c) <= generation.size:
            continue
        keep = ~np.isin(np.asarray(c.steps, dtype=np.int64), generation)
        if keep.all() or not keep.any():
            continue
        out[name] = Curve(np.asarray(c.steps)[keep], np.asarray(c.values)[keep])
        changed[name] = {
            "from": name,
            "text": f"{name} read on the updates after each batch's first: with {setting.name} = "
                    f"{setting.value:g}, the first update on a generated batch compares the policy with itself "
                    f"(ratio 1, nothing clipped), so its {int((~keep).sum())} points (the steps the reward is "
                    f"logged at) are left out"}
    return out, changed
