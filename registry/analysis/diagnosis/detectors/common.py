"""What every detector family shares: the cap on findings per metric, whether a control run's
reward is still rising at its last logged step (read by the clip fraction and by the reward), where
a reward sits in its task range, and which warnings say the updates were unstable over some steps."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from registry.analysis.diagnosis.context import Context
from registry.analysis.diagnosis.ranges import baseline_source
from registry.analysis.diagnosis.signal import TINY, rank_corr, rolling_mean, rolling_median
from registry.analysis.diagnosis.types import Finding


def top(findings: list[Finding], ctx: Context, key: str) -> list[Finding]:
    """Keep the ``max_findings_per_metric`` findings with the largest ``evidence[key]``."""
    k = ctx.s.max_findings_per_metric
    if len(findings) <= k:
        return findings
    keep = sorted(findings, key=lambda f: -abs(f.evidence.get(key, 0.0)))[:k]
    return sorted(keep, key=lambda f: f.start)


def aftermath(ctx: Context) -> int:
    """How many steps after a finding (and before it, for the reward's level) are read for what followed it."""
    return max(1, int(ctx.s.spike_aftermath_frac * ctx.span))


#: Findings that say the updates themselves were unstable: a return's fall or an entropy's cliff beside
#: one of them is that instability showing, a warning even when the run carried on well.
INSTABILITY = ("kl_spike", "kl_climb", "clip_high", "entropy_collapse")
_INSTABILITY_WORDS = {"kl_spike": "KL spike", "kl_climb": "KL climb", "clip_high": "clip fraction",
                      "entropy_collapse": "entropy collapse"}


def unstable_updates(ctx: Context, start: int, end: int, severity: str = "warning") -> list[str]:
    """The instability detectors with a finding of ``severity`` or worse (so far) over steps [start, end], in
    ``INSTABILITY``'s order."""
    return [d for d in INSTABILITY if any(f.at_least(severity) for f in ctx.overlapping(d, start, end))]


def instability_words(detectors: list[str], noun: str = "warnings") -> str:
    return " and ".join(_INSTABILITY_WORDS[d] for d in detectors) + f" {noun}"


@dataclass(frozen=True)
class Rising:
    """A reward still rising over the last part of a run: from ``level_from`` (at ``step_from``) to
    ``level_to``, with the raw values' rank correlation with time ``corr`` over ``points`` points."""

    name: str
    step_from: int
    level_from: float
    level_to: float
    corr: float
    points: int

    def words(self) -> str:
        return (f"{self.name} is still rising at its last logged step ({self.level_from:.4g} -> {self.level_to:.4g} "
                f"over the last {self.points} points, rank correlation with time {self.corr:.2f})")


def range_words(ctx: Context, name: str) -> str:
    """How a finding names the reward range it measured against: "the task range" for the
    dictionary's, "the range learned from the <task> baseline (n healthy runs)" for a baseline's
    (its healthy bands, padded: where healthy runs were, not how far the task goes)."""
    source = (ctx.ranges_used.get(name) or {}).get("source")
    learned = ctx.baseline is not None and source == baseline_source(ctx.baseline)
    return f"the range {source}" if learned else "the task range"


def level_in_task_range(ctx: Context, name: str, value: float) -> float | None:
    """Where ``value`` of reward ``name`` sits in its task range: 0 at the worst end, 1 at the best
    (by which way is better); None without one. Only the dictionary's range is a task range here (a
    task's own scale, such as CartPole's cap of 500): a range learned from a baseline spans the healthy
    runs' early and late bands, and 80% of the way up it is still far below where they ended."""
    info = ctx.metrics.get(name)
    if info is None or info.healthy_low is None or info.healthy_high is None:
        return None
    low, high = ctx.range(name)
    if low is None or high is None or high <= low:
        return None
    return (value - low) / (high - low) if ctx.higher_is_better(name) else (high - value) / (high - low)


def reward_top_reached(ctx: Context, start: int, end: int) -> tuple[float, float] | None:
    """(best smoothed reward over steps [start, end], its level in the task range) when that level is
    ``flat_max_level`` or above: the level at which a plateau is no problem (``detect_reward_flat``)."""
    name = ctx.first("reward")
    if name is None:
        return None
    sr = ctx.series(name)
    inside = (sr.steps >= start) & (sr.steps <= end)
    if not inside.any():
        return None
    sign = 1.0 if ctx.higher_is_better(name) else -1.0
    best = sign * float(np.max(sign * rolling_median(sr.y, max(3, ctx.window(name, sr)), "centered")[inside]))
    level = level_in_task_range(ctx, name, best)
    return (best, level) if level is not None and level >= ctx.s.flat_max_level else None


def reward_still_rising(ctx: Context) -> Rising | None:
    """The reward of a control run when it rises steadily over the last ``plateau_frac`` of the run (the raw
    values' rank correlation with time at least ``rising_min_corr``, the smoothed level higher at the end than
    at the start of that stretch); None otherwise, for runs shorter than ``flat_min_points``, for a reward
    that ends at ``flat_max_level`` of its task range or above (the level a plateau is no problem at: what
    rises there is converging), and for language-model runs: what it supports (updates held back from the
    start, ``detect_reward_slow``) was measured on control tasks only, and a language model's learning rates
    and clip fractions are orders of magnitude smaller by their own defaults."""
    st = ctx.s
    name = ctx.first("reward")
    if ctx.run_kind != "control" or name is None:
        return None
    sr = ctx.series(name)
    n = sr.n
    if n < st.flat_min_points:
        return None
    sign = 1.0 if ctx.higher_is_better(name) else -1.0
    tail = max(st.persist_min_points * 2, int(round(st.plateau_frac * n)))
    y = sign * sr.y[n - tail:]
    corr = rank_corr(y)
    s = rolling_median(y, max(3, ctx.window(name, sr)), "centered")
    k = max(1, tail // 4)
    start, end = float(np.median(s[:k])), float(np.median(s[-k:]))
    if corr < st.rising_min_corr or end <= start:
        return None
    level = level_in_task_range(ctx, name, sign * end)
    if level is not None and level >= st.flat_max_level:
        return None          # near the top of its task range: converging, not held back
    return Rising(name, sr.step(n - tail), sign * start, sign * end, corr, tail * sr.bin_size)


def return_at_top(ctx: Context, start: int, end: int) -> tuple[float, float] | None:
    """(median return over steps [start, end], its level in the task range) when that level is
    ``flat_max_level`` or above; None otherwise or without a dictionary task range."""
    rname = ctx.first("reward")
    if rname is None:
        return None
    rv = ctx.values_between(rname, start, end)
    if rv.size == 0:
        return None
    final = float(np.median(rv))
    level = level_in_task_range(ctx, rname, final)
    return (final, level) if level is not None and level >= ctx.s.flat_max_level else None


def by_chance(ctx: Context, at_value: np.ndarray, a: int, b: int) -> bool:
    """Is the stretch ``a..b`` (its points at one value: zero, or the value a constant stretch holds, or
    mostly so when a rolling median found it) as likely as chance makes it, given how often the series
    takes that value elsewhere? A batch statistic over a few samples takes few values: a language-model
    accuracy of 15% over 8 completions is 0 at a quarter of its steps, a mean in sixteenths sits at its
    commonest value at a third of them, a reward std over two groups is 0 whenever both agree. Such a
    stretch counts when that many of its points at that value had less than a 1% chance anywhere in the
    series at that rate (the binomial tail, spread over the series' positions)."""
    if ctx.run_kind == "control":
        return False
    outside = np.concatenate([at_value[:a], at_value[b + 1:]])
    rate = float(np.mean(outside)) if outside.size else 0.0
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    m, k = b - a + 1, int(np.sum(at_value[a:b + 1]))
    return _log_binomial_tail(m, k, rate) > math.log(0.01 / at_value.size)


def _log_binomial_tail(m: int, k: int, p: float) -> float:
    """log P(X >= k) for X ~ Binomial(m, p), summed in logs (m is a few hundred points at most)."""
    terms = [math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) + j * math.log(p)
             + (m - j) * math.log1p(-p) for j in range(k, m + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def reward_level(ctx: Context, values: np.ndarray) -> float:
    """The level of a stretch of reward points: their mean for a language model, whose reward per step is
    a mean over a few completions on a grid of eighths or sixteenths (a median jumps a grid step: 0.5625
    -> 0.5 where the batch means went 0.58 -> 0.69); their median for a control run, whose windowed
    episode mean has outliers (a crashed episode) a median ignores."""
    return float((np.median if ctx.run_kind == "control" else np.mean)(values))


def gain_in_standard_errors(ctx: Context, early: np.ndarray, late: np.ndarray) -> float | None:
    """A language model's reward gain (late mean over early mean) in standard errors of that difference;
    None for a control run or too few points. Under ``flat_llm_gain_se`` it is a gain the batch noise
    could make: a relative gain means little for a reward whose level is set by a format bonus (0.6 ->
    0.64 is 7%)."""
    if ctx.run_kind == "control" or min(early.size, late.size) < 3:
        return None
    se = float(np.sqrt(np.var(early, ddof=1) / early.size + np.var(late, ddof=1) / late.size))
    gain = float(np.mean(late) - np.mean(early))
    return gain / se if se > TINY else (np.inf if gain > 0 else -np.inf if gain < 0 else 0.0)


def rolling_reward_level(ctx: Context, y: np.ndarray, w: int, mode: str = "centered") -> np.ndarray:
    """:func:`reward_level` over a rolling window of ``w`` points (a rolling median's lucky stretch of a
    batch reward made a "best" of 0.94 where the batches averaged 0.75)."""
    return (rolling_median if ctx.run_kind == "control" else rolling_mean)(y, w, mode)


def settle_as_info(f: Finding, title: str, action: str, **evidence: float) -> None:
    """Turn ``f`` into information: the run's own evidence showed it was no problem (``title`` says how), so it
    names no cause and points to no checkpoint to roll back to."""
    f.severity = "info"
    f.title = title
    f.evidence.update(evidence)
    f.causes, f.likely_causes = [], []
    f.suggested_action = action
    f.rollback_step = None
