"""Shared state of one diagnosis: prepared series, resolved ranges, windows, checkpoints."""
from __future__ import annotations

import bisect
from typing import Any, Mapping, Sequence

import numpy as np

from registry.analysis.diagnosis.baseline import PHASES, BaselineProfile, PhaseBand
from registry.analysis.diagnosis.settings import DEFAULT_LAYERS, FIRST_ONLY_ROLES, METRIC_ROLES, DiagnosisSettings
from registry.analysis.diagnosis.signal import Series, early_count, prepare
from registry.analysis.diagnosis.types import Curve, Finding, MetricInfo
from registry.analysis.diagnosis.ranges import resolve_range


LLM_METRICS = frozenset({"response_length_mean", "reward_sequence_mean", "reward_accuracy_mean",
                         "response_truncation_rate", "kl_ref_mean", "reward_zero_std_fraction"})
CONTROL_METRICS = frozenset({"episode_return_mean", "return_mean", "episode_length_mean", "episode_return_std"})


def run_kind(curves: Mapping[str, Any]) -> str | None:
    """``llm`` or ``control`` from the canonical metrics the run logs (None when neither shows)."""
    names = set(curves)
    if names & LLM_METRICS:
        return "llm"
    if names & CONTROL_METRICS:
        return "control"
    return None


class Context:
    def __init__(self, curves: Mapping[str, Curve], metrics: Mapping[str, MetricInfo],
                 settings: DiagnosisSettings, checkpoints: Sequence[int] = (), baseline: Any = None,
                 hp: Any = None):
        self.curves = {k: (c if isinstance(c, Curve) else Curve(*c)) for k, c in curves.items()}
        self.metrics = dict(metrics)
        self.s = settings
        self.checkpoints = sorted(int(c) for c in checkpoints)
        self.baseline = baseline
        #: The run's hyper-parameters as read for diagnosis (a RunSettings).
        self.hp = hp
        self.findings: list[Finding] = []
        #: Every range a detector asked for: name -> {"low", "high", "source"} (shown to the user).
        self.ranges_used: dict[str, dict[str, Any]] = {}
        self._series: dict[str, Series | None] = {}
        #: "llm" (responses, sequence rewards) or "control" (episodes, returns) or None: chooses wording.
        self.run_kind = run_kind(self.curves)
        firsts = [int(c.steps[0]) for c in self.curves.values() if len(c)]
        lasts = [int(c.steps[-1]) for c in self.curves.values() if len(c)]
        self.first_step = min(firsts) if firsts else None
        self.last_step = max(lasts) if lasts else None

    # --- metrics ----------------------------------------------------------------------
    def series(self, name: str) -> Series | None:
        if name not in self._series:
            c = self.curves.get(name)
            s = prepare(name, c, self.s.max_points) if c is not None and len(c) else None
            self._series[name] = s if s is not None and s.n > 0 else None
        return self._series[name]

    def role(self, role: str) -> list[str]:
        present = [m for m in METRIC_ROLES[role] if self.series(m) is not None]
        return present[:1] if role in FIRST_ONLY_ROLES else present

    def first(self, role: str) -> str | None:
        names = self.role(role)
        return names[0] if names else None

    def info(self, name: str) -> MetricInfo:
        info = self.metrics.get(name)
        return info if info is not None else MetricInfo(name=name, layer=DEFAULT_LAYERS.get(name, "diagnostic"))

    def range(self, name: str) -> tuple[float | None, float | None]:
        """Healthy (low, high) by the one lookup the dashboard also draws (:func:`resolve_range`):
        the definition's (task range resolved), else one learned from a baseline of three or more
        healthy runs, else the settings' fallback. Every range asked for is recorded in
        ``ranges_used`` with its source."""
        r = resolve_range(name, self.metrics.get(name), self.baseline, self.s)
        if r is None:
            return None, None
        self.ranges_used[name] = dict(r)
        return r["low"], r["high"]

    def higher_is_better(self, name: str) -> bool:
        return self.info(name).higher_is_better is not False

    def layer(self, name: str) -> str:
        info = self.metrics.get(name)
        if info is not None and info.layer:
            return info.layer
        return DEFAULT_LAYERS.get(name, "diagnostic")

    # --- windows --------------------------------------------------------------------------
    def window(self, name: str, sr: Series) -> int:
        """The metric's smoothing window in bins, capped to a fraction of the run."""
        w = max(1, int(round(self.info(name).smoothing_window / sr.bin_size)))
        cap = max(1, int(self.s.max_window_frac * sr.n))
        return int(min(w, cap))

    def first_series(self, role: str) -> tuple[str, Series, int] | None:
        """How a detector opens its metric: the role's first present metric, its series and its
        point count; None when the run logs no metric of that role. Each detector then applies
        the minimum length its own test needs (or :meth:`opening`'s common one)."""
        name = self.first(role)
        if name is None:
            return None
        sr = self.series(name)
        return name, sr, sr.n

    def opening(self, name: str, extra: int = 2) -> tuple[Series, int, int] | None:
        """What most detectors start from: the series, its point count ``n`` and the persistence
        ``M`` a finding needs (``persist``); None when fewer than ``M + extra`` points leave
        nothing to judge (the summary then says the metric was not judged)."""
        sr = self.series(name)
        n = sr.n
        M = self.persist(n)
        return None if n < M + extra else (sr, n, M)

    def persist(self, n: int) -> int:
        s = self.s
        return int(min(s.persist_max_points, max(s.persist_min_points, round(s.persist_frac * n))))

    def early(self, n: int) -> int:
        return early_count(n, self.s.early_frac)

    @property
    def span(self) -> int:
        if self.first_step is None or self.last_step is None:
            return 0
        return self.last_step - self.first_step

    # --- values in a step range --------------------------------------------------------
    def values_between(self, name: str, start: int, end: int) -> np.ndarray:
        sr = self.series(name)
        if sr is None:
            return np.zeros(0)
        lo = np.searchsorted(sr.raw_steps, start, side="left")
        hi = np.searchsorted(sr.raw_steps, end, side="right")
        return sr.raw_values[lo:hi]

    def median_between(self, name: str, start: int, end: int) -> float | None:
        v = self.values_between(name, start, end)
        return float(np.median(v)) if v.size else None

    def phase_medians(self, name: str, profile: BaselineProfile, start: int = -2**62, end: int = 2**62
                      ) -> list[tuple[str, PhaseBand, int, int, float]]:
        """Metric ``name`` beside the healthy runs of ``profile``, phase by phase: ``(phase, band,
        first step, last step, the run's median there)`` for each phase with a band for ``name`` that
        holds ``baseline_min_points`` of the run's points within [``start``, ``end``], in time order.
        """
        mb = profile.metrics.get(name)
        if mb is None:
            return []
        out = []
        for phase in PHASES:
            band, bounds = mb.band(phase), profile.phase_bounds(phase)
            if band is None or bounds is None:
                continue
            lo, hi = max(start, bounds[0]), min(end, bounds[1])
            v = self.values_between(name, lo, hi)
            if v.size >= self.s.baseline_min_points:
                out.append((phase, band, lo, hi, float(np.median(v))))
        return out

    # --- reward helpers -----------------------------------------------------------------
    def reward_saturated(self, name: str, level: float) -> bool:
        """Is ``level`` of reward metric ``name`` at its ceiling (cap reached, not broken)?

        With a healthy (task) range from the dictionary: within ``saturation_tol`` of its width
        below the high end. Without one: at the run's own maximum after a clear rise from its
        early level. A range learned from a baseline does not count: its bands cover the early
        and mid phases of healthy runs, padded, so its high end says nothing about the task's cap.
        """
        sr = self.series(name)
        if sr is None:
            return False
        hib = self.higher_is_better(name)
        y = sr.y if hib else -sr.y
        lvl = level if hib else -level
        info = self.metrics.get(name)
        low, high = (info.healthy_low, info.healthy_high) if info is not None else (None, None)
        if not hib:
            low, high = (None if high is None else -high), (None if low is None else -low)
        tol = self.s.saturation_tol
        if high is not None:
            if low is not None and high > low:
                width = high - low
            else:
                width = max(abs(high - float(np.median(y[: self.early(sr.n)]))), 1e-12)
            return lvl >= high - tol * width
        ymax, ymin = float(y.max()), float(y.min())
        rng = ymax - ymin
        if rng <= 0:
            return False
        early = float(np.median(y[: self.early(sr.n)]))
        return lvl >= ymax - tol * rng and (ymax - early) >= 0.5 * rng

    def settled_from(self, name: str) -> int | None:
        """The first step at which windowed episode mean ``name`` averages enough episodes to be a
        level (``level_min_episodes`` finished since the start); None when it cannot be told.

        Such a mean (SB3's ``rollout/ep_rew_mean``) is logged from the first rollout, when its window
        holds a handful of episodes: a lucky or unlucky few, not where the policy stands. Episodes are
        counted from the episode-length series: the steps between two points over the mean length.
        That count needs steps that are environment steps: when the first point comes before one
        episode could have finished, or the whole run never reaches the count, the steps are
        something else (updates, iterations) and nothing is told. Per-episode series and batch
        rewards have no such warm-up.
        """
        lengths = self.curves.get("episode_length_mean")
        if name != "episode_return_mean" or lengths is None or len(lengths) == 0:
            return None
        steps = np.asarray(lengths.steps, dtype=np.float64)
        ln = np.asarray(lengths.values, dtype=np.float64)
        ok = np.isfinite(ln) & (ln > 0) & np.isfinite(steps)
        steps, ln = steps[ok], ln[ok]
        if steps.size == 0 or steps[0] < ln[0]:
            return None
        episodes = np.cumsum(np.diff(steps, prepend=0.0) / ln)
        reached = np.flatnonzero(episodes >= self.s.level_min_episodes)
        return int(steps[reached[0]]) if reached.size else None

    # --- findings ------------------------------------------------------------------------
    def rollback_before(self, step: int) -> int | None:
        i = bisect.bisect_left(self.checkpoints, step)
        return self.checkpoints[i - 1] if i > 0 else None

    def finding(self, detector: str, metric: str, start: int, end: int, severity: str, title: str, *,
                evidence: dict[str, float] | None = None, causes: Sequence[str] = (),
                check: Sequence[str] = (), action: str = "", detected_at: int | None = None,
                related: Sequence[str] = (), layer: str | None = None) -> Finding:
        rb = self.rollback_before(start) if severity != "info" else None
        if rb is not None:
            action = f"{action}; roll back to checkpoint at step {rb} (latest before step {start})" if action \
                else f"roll back to checkpoint at step {rb} (latest before step {start})"
        return Finding(
            detector=detector, metric=metric, start=int(start), end=int(end), severity=severity,
            layer=layer or self.layer(metric), title=title,
            evidence={k: float(v) for k, v in (evidence or {}).items() if v is not None},
            likely_causes=list(causes), check_next=list(check), suggested_action=action,
            detected_at=None if detected_at is None else int(detected_at), rollback_step=rb,
            related_metrics=list(related),
        )

    def overlapping(self, detector: str, start: int, end: int, tol: int = 0) -> list[Finding]:
        return [f for f in self.findings
                if f.detector == detector and f.start <= end + tol and f.end >= start - tol]
