"""The end-of-training summary that the Hugging Face Trainer (and so TRL) logs as one more entry.

When ``Trainer.train()`` ends, ``_inner_training_loop`` builds ``speed_metrics("train", ...)``
(``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``, and
``train_tokens_per_second`` with ``include_tokens_per_second``), adds ``total_flos`` and
``train_loss`` (the mean loss over the whole run) and calls ``self.log(metrics)``, which adds
``epoch`` and logs it at the last global step (transformers ``src/transformers/trainer.py``,
4.x and 5.x). That entry lands in ``trainer_state.json``'s ``log_history`` and, through
``TensorBoardCallback.on_log``, in the event file with a ``train/`` prefix.

These are one number per run, not curves: registered as the run's outcome scores, they stop
clashing with the per-step series (the repeated ``epoch`` is handled by the series builder's
schedule rule).
"""
from __future__ import annotations

import math
from typing import Mapping

from .series import SeriesData

SUMMARY_NAMES = (
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
    "total_flos", "train_loss",
)
_MARKER = "train_runtime"
# trainer_state.json keeps the Trainer's names; TensorBoardCallback prefixes them with train/.
_PREFIXES = ("", "train/")


def split_run_summary(data: Mapping[str, SeriesData]) -> tuple[dict[str, SeriesData], dict[str, float]]:
    """The series without the Trainer's end-of-training summary, and that summary as scores.

    A summary name counts only as the summary when it holds one point at the step of the one
    ``train_runtime`` point: a custom log that records ``train_loss`` at every step keeps it as a series.
    """
    series = dict(data)
    for prefix in _PREFIXES:
        marker = series.get(prefix + _MARKER)
        if marker is None or len(marker) != 1:
            continue
        step = marker.steps[0]
        scores: dict[str, float] = {}
        for name in SUMMARY_NAMES:
            sd = series.get(prefix + name)
            if sd is None or len(sd) != 1 or sd.steps[0] != step or not math.isfinite(sd.values[0]):
                continue
            scores[name] = float(sd.values[0])
            del series[prefix + name]
        return series, scores
    return series, {}
