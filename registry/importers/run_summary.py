"""The end-of-training summary that the Hugging Face Trainer (and so TRL) logs as one more entry.

When ``Trainer.train()`` ends, ``_inner_training_loop`` builds ``speed_metrics("train", ...)``
(``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``), adds ``total_flos``
and ``train_loss`` (the mean loss over the whole run) and calls ``self.log(metrics)``, which adds
``epoch`` and logs it at the last global step (transformers 5.25.0 ``src/transformers/trainer.py``,
``_inner_training_loop`` and ``log``; the same in 4.x). That entry lands in ``trainer_state.json``'s
``log_history`` and, through ``TensorBoardCallback.on_log`` (``rewrite_logs``), in the event file
with a ``train/`` prefix. With ``include_num_input_tokens_seen``, ``log`` adds ``train_runtime`` and
``train_tokens_per_second`` to *every* entry: those are then real per-step series, and only
``total_flos`` marks the summary.

These are one number per run, not curves: registered as the run's outcome scores, they stop
clashing with the per-step series (the repeated ``epoch`` is handled by the series builder's
schedule rule).
"""
from __future__ import annotations

import math
from typing import Mapping

from registry.core.series import SeriesData

SUMMARY_NAMES = (
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
    "total_flos", "train_loss",
)
_MARKERS = ("total_flos", "train_runtime")
# trainer_state.json keeps the Trainer's names; TensorBoardCallback prefixes them with train/.
_PREFIXES = ("", "train/")


def split_run_summary(data: Mapping[str, SeriesData]) -> tuple[dict[str, SeriesData], dict[str, float]]:
    """The series without the Trainer's end-of-training summary, and that summary as scores.

    The summary sits at the step of a marker (``total_flos`` or ``train_runtime``) logged exactly
    once. A summary name holding that one point moves to the scores; one that is a real per-step
    series ending at that step (``train_runtime`` with ``include_num_input_tokens_seen``, or a custom
    log's ``train_loss``) stays a series, and only its last value is also a score when it is the
    Trainer's (a single-point marker exists).
    """
    series = dict(data)
    for prefix in _PREFIXES:
        marker = next((series[prefix + m] for m in _MARKERS
                       if prefix + m in series and len(series[prefix + m]) == 1), None)
        if marker is None:
            continue
        step = marker.steps[0]
        scores: dict[str, float] = {}
        for name in SUMMARY_NAMES:
            sd = series.get(prefix + name)
            if sd is None or sd.steps[-1] != step or not math.isfinite(sd.values[-1]):
                continue
            if len(sd) == 1:
                scores[name] = float(sd.values[0])
                del series[prefix + name]
            elif name != "train_loss":  # a per-step train_loss is somebody's own curve, not the summary
                scores[name] = float(sd.values[-1])
        return series, scores
    return series, {}
