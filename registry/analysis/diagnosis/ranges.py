"""The one lookup of a metric's healthy range for a run, with where the range came from.

The diagnosis judges by these ranges and the dashboard draws them, so both must ask the same
question the same way: the definition's range (its task range when it has one for the run's
task), else a range learned from the task's health baseline (three or more healthy runs; a
weak baseline supplies none), else the diagnosis' own default for that metric
(``DiagnosisSettings.fallback_ranges``). A range nobody supplies is None: "no range", never a
hidden one.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from registry.analysis.diagnosis.settings import DiagnosisSettings
from registry.analysis.diagnosis.types import MetricInfo

#: The source text of a range taken from ``DiagnosisSettings.fallback_ranges``.
FALLBACK_SOURCE = "diagnosis default (DiagnosisSettings.fallback_ranges)"
#: A definition range whose MetricInfo carries no source (built by hand, not from the dictionary).
DICTIONARY_SOURCE = "dictionary"


def baseline_source(baseline: Any) -> str:
    n = getattr(baseline, "n_runs", None)
    runs = f" ({n} healthy runs)" if n else ""
    return f"learned from the {baseline.task} baseline{runs}"


#: Quantities whose range learned from a baseline is widened below only (see :func:`resolve_range`).
SCORE_QUANTITIES = frozenset({"reward", "return"})
#: Metrics the detectors read as their mean over a window (joint.detect_advantage_degenerate): a baseline's
#: range for them spans the healthy runs' own phase means. The share of zero-std groups of a batch of two
#: prompts is 0, 0.5 or 1 at each step, so quantiles of the points span [0, 1] whatever the level, and
#: widened by that width the range was [-1, 2].
MEAN_READ = frozenset({"reward_zero_std_fraction"})


def resolve_range(name: str, info: MetricInfo | None, baseline: Any, settings: DiagnosisSettings,
                  quantity: str | None = None) -> dict[str, Any] | None:
    """``{"low", "high", "source"}`` for metric ``name``, or None when nothing gives it a range.

    A baseline's range is its early, mid and late bands together, widened by
    ``settings.baseline_range_widen`` band widths on each side (the bands are medians of a few
    runs: a run may wander further and still be healthy). A reward or return (``info.quantity``, or
    ``quantity`` when there is no info) is widened below only: its top is the best level the
    healthy runs reached, and no run is unhealthy for doing better. Widened above too, the flat test
    measured progress on a scale three times too coarse (LunarLander's learned range was [-602, +579], and
    a healthy run's rise from -167 to -36 was 11% of it: "barely improves"). For :data:`MEAN_READ` it is
    the lowest and highest of the healthy runs' own phase means, not widened (they are how far apart
    healthy runs sit), marked ``"read_as": "mean"``.
    """
    quantity = info.quantity if info is not None and info.quantity else quantity
    low = info.healthy_low if info is not None else None
    high = info.healthy_high if info is not None else None
    if low is not None or high is not None:
        return {"low": low, "high": high, "source": (info.range_source if info is not None else None)
                or DICTIONARY_SOURCE}
    # A weak baseline (fewer than 3 healthy runs) supplies no ranges: its bands are too narrow a sample.
    if baseline is not None and name in baseline.metrics and not getattr(baseline, "weak", False):
        mb = baseline.metrics[name]
        bands = [b for b in (mb.early, mb.mid, mb.late) if b]
        if bands and name in MEAN_READ and all(b.run_mean_low is not None for b in bands):
            return {"low": min(b.run_mean_low for b in bands), "high": max(b.run_mean_high for b in bands),
                    "source": baseline_source(baseline), "read_as": "mean"}
        if bands:
            lo, hi = min(b.low for b in bands), max(b.high for b in bands)
            pad = settings.baseline_range_widen * max(hi - lo, 1e-12)
            return {"low": lo - pad, "high": hi + (0.0 if quantity in SCORE_QUANTITIES else pad),
                    "source": baseline_source(baseline)}
    low, high = settings.fallback_ranges.get(name, (None, None))
    if low is not None or high is not None:
        return {"low": low, "high": high, "source": FALLBACK_SOURCE}
    return None


def resolve_ranges(names: Iterable[str], infos: Mapping[str, MetricInfo], baseline: Any,
                   settings: DiagnosisSettings) -> dict[str, dict[str, Any]]:
    """:func:`resolve_range` for each of ``names`` that has a range."""
    out = {}
    for name in names:
        r = resolve_range(name, infos.get(name), baseline, settings)
        if r is not None:
            out[name] = r
    return out


def range_text(r: Mapping[str, Any] | None) -> str:
    """``<= 0.1 (diagnosis default ...)``, ``0 - 500 (dictionary: task range for CartPole-v1)``, ``none``."""
    if not r or (r.get("low") is None and r.get("high") is None):
        return "none"
    low, high = r.get("low"), r.get("high")
    if low is None:
        text = f"<= {high:g}"
    elif high is None:
        text = f">= {low:g}"
    else:
        text = f"{low:g} - {high:g}"
    return f"{text} ({r['source']})" if r.get("source") else text
