"""The detectors. Each takes a :class:`Context` and returns a list of findings.

Every threshold is read from ``ctx.s`` (:class:`DiagnosisSettings`) or from the metric's
healthy range (``ctx.range``); windows scale with the run's length (``ctx.persist``,
``ctx.window``), so a 48-point SB3 run and a 20,000-step GRPO run are judged alike.

One module per layer of the metric a detector judges (``objective``, ``constraint``,
``diagnostic``; the constraint layer's clip-fraction detectors, its largest family, are in
``clipping``, the objective layer's falling reward in ``reward_falls``), one for the detectors that
read several metrics or settings together (``joint``),
and ``excursions``, which runs after them all and turns brief KL and clip-fraction excursions that
nothing followed into information. Every detector opens with ``Context.opening`` where it needs
the usual series, point count and persistence, and builds its findings with ``Context.finding``.
"""
from __future__ import annotations

from typing import Callable

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.detectors.clipping import detect_clip_high, detect_clip_low
from registry.analysis.diagnosis.detectors.constraint import (
    detect_kl_climb,
    detect_kl_spike,
    detect_policy_loss_growing,
    detect_value_loss_flat,
)
from registry.analysis.diagnosis.detectors.entropy import detect_entropy_collapse, detect_entropy_narrowing
from registry.analysis.diagnosis.detectors.diagnostic import (
    detect_grad_spikes,
    detect_length_hacking,
    detect_nonfinite,
    detect_signal_collapse,
)
from registry.analysis.diagnosis.detectors.joint import JOINT_DETECTORS
from registry.analysis.diagnosis.detectors.objective import (
    detect_advantage_drift,
    detect_reward_flat,
    detect_reward_slow,
    detect_reward_zero,
)
from registry.analysis.diagnosis.detectors.reward_falls import detect_reward_drop
from registry.analysis.diagnosis.types import Finding

DETECTORS: tuple[tuple[str, Callable[[Context], list[Finding]]], ...] = (
    ("nan_inf", detect_nonfinite),
    ("kl_spike", detect_kl_spike),
    ("kl_climb", detect_kl_climb),
    ("clip_high", detect_clip_high),
    ("entropy_collapse", detect_entropy_collapse),
    ("clip_low", detect_clip_low),
    ("reward_zero", detect_reward_zero),
    ("reward_drop", detect_reward_drop),
    ("reward_flat", detect_reward_flat),
    ("reward_slow", detect_reward_slow),                # reads the clip fraction's and the reward's
    ("entropy_collapse", detect_entropy_narrowing),     # reads the reward's findings (flat, slid back, slow)
    ("length_hacking", detect_length_hacking),
    ("value_loss_flat", detect_value_loss_flat),
    ("signal_collapse", detect_signal_collapse),
    ("advantage_drift", detect_advantage_drift),
    ("grad_norm_spikes", detect_grad_spikes),
    ("policy_loss_growing", detect_policy_loss_growing),
) + JOINT_DETECTORS
DETECTOR_IDS = tuple(dict.fromkeys(d for d, _ in DETECTORS)) + ("baseline_deviation",)
