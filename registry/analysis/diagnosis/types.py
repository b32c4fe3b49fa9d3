"""Input and output types of run diagnosis.

Input: a run as canonical curves (:class:`Curve` keyed by canonical metric name) plus one
:class:`MetricInfo` per metric, taken from the metric dictionary with the task range already
resolved. Output: a :class:`Diagnosis` holding :class:`Finding` objects (one detector's
verdict on one metric over one step range) and :class:`JointReading` objects (several
findings that overlap in time and read together as one story).

Everything that leaves this module is JSON-ready through ``to_dict()``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
#: Triage order: the diagnostic layer first, then constraint, then objective, then the
#: comparison with history (baseline deviations).
TRIAGE_LAYERS = ("diagnostic", "constraint", "objective", "comparison")
LAYER_RANK = {s: i for i, s in enumerate(TRIAGE_LAYERS)}


@dataclass(frozen=True, eq=False)
class Curve:
    """One canonical metric series: ``steps`` (int64, ascending) and ``values`` (float64).

    Values may hold NaN and +-Inf; steps need not be evenly spaced.
    """

    steps: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        steps = np.asarray(self.steps, dtype=np.int64).reshape(-1)
        values = np.asarray(self.values, dtype=np.float64).reshape(-1)
        if steps.shape != values.shape:
            raise ValueError(f"steps ({steps.size}) and values ({values.size}) differ in length")
        if steps.size > 1 and np.any(np.diff(steps) < 0):
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return int(self.steps.size)

    @classmethod
    def from_points(cls, points: Sequence[tuple[int, float]]) -> "Curve":
        if not points:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.float64))
        s, v = zip(*points)
        return cls(np.asarray(s), np.asarray(v))

    def to_dict(self) -> dict[str, list]:
        return {"steps": self.steps.tolist(), "values": [_json_float(v) for v in self.values.tolist()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Curve":
        vals = [float("nan") if v is None else float(v) for v in data["values"]]
        return cls(np.asarray(data["steps"]), np.asarray(vals))


@dataclass(frozen=True)
class MetricInfo:
    """What diagnosis needs from a metric definition (task range already resolved).

    ``healthy_low`` / ``healthy_high`` may be None (unbounded or unknown).
    ``smoothing_window`` is in logged points.
    """

    name: str
    layer: str = "diagnostic"
    healthy_low: float | None = None
    healthy_high: float | None = None
    smoothing_window: int = 10
    higher_is_better: bool | None = None
    #: The definition's quantity (reward, kl, coefficient, throughput, ...), when known.
    quantity: str | None = None
    #: Where healthy_low/high come from ("dictionary: task range for CartPole-v1", ...).
    range_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layer": self.layer, "healthy_low": self.healthy_low,
            "healthy_high": self.healthy_high, "smoothing_window": self.smoothing_window,
            "higher_is_better": self.higher_is_better, "quantity": self.quantity,
            "range_source": self.range_source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MetricInfo":
        return cls(
            name=str(data["name"]), layer=str(data.get("layer") or "diagnostic"),
            healthy_low=_opt_float(data.get("healthy_low")), healthy_high=_opt_float(data.get("healthy_high")),
            smoothing_window=int(data.get("smoothing_window") or 10),
            higher_is_better=data.get("higher_is_better"), quantity=data.get("quantity"),
            range_source=data.get("range_source"),
        )


@dataclass
class Finding:
    """One detector's verdict on one metric over the step range [start, end].

    ``detected_at`` is the first step at which the evidence was sufficient (what an online
    monitor would have seen); ``rollback_step`` the latest checkpoint before ``start``.
    """

    detector: str
    metric: str
    start: int
    end: int
    severity: str
    layer: str
    title: str
    evidence: dict[str, float] = field(default_factory=dict)
    likely_causes: list[str] = field(default_factory=list)
    check_next: list[str] = field(default_factory=list)
    suggested_action: str = ""
    detected_at: int | None = None
    rollback_step: int | None = None
    related_metrics: list[str] = field(default_factory=list)
    #: Ranked candidate causes (:class:`registry.analysis.diagnosis.causes.Cause`), best supported first.
    causes: list[Any] = field(default_factory=list)
    #: How sure the finding is, from the amount of data behind it: high / medium / low.
    confidence: str = "high"
    #: What could not be checked while explaining it ("no KL curve: ...").
    notes: list[str] = field(default_factory=list)

    @property
    def cause(self) -> str | None:
        """The key of the best-supported cause when it has real support (else None: not named)."""
        if self.causes and self.causes[0].support >= 0.5:
            return str(self.causes[0].key)
        return None

    @property
    def id(self) -> str:
        return f"{self.detector}:{self.metric}:{self.start}"

    @property
    def severity_rank(self) -> int:
        return SEVERITY_RANK[self.severity]

    def at_least(self, severity: str) -> bool:
        return SEVERITY_RANK[self.severity] >= SEVERITY_RANK[severity]

    def summary(self) -> str:
        """One line: ``[WARNING] entropy_collapse entropy steps 4096-100352: <title>``."""
        span = f"step {self.start}" if self.start == self.end else f"steps {self.start}-{self.end}"
        text = f"[{self.severity.upper()}] {self.detector} {self.metric} {span}: {self.title}"
        if self.rollback_step is not None:
            text += f" (roll back to checkpoint at step {self.rollback_step})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "detector": self.detector, "metric": self.metric,
            "start": int(self.start), "end": int(self.end), "severity": self.severity,
            "layer": self.layer, "title": self.title,
            "evidence": {k: _json_float(v) for k, v in self.evidence.items()},
            "likely_causes": list(self.likely_causes), "check_next": list(self.check_next),
            "suggested_action": self.suggested_action,
            "detected_at": None if self.detected_at is None else int(self.detected_at),
            "rollback_step": None if self.rollback_step is None else int(self.rollback_step),
            "related_metrics": list(self.related_metrics), "summary": self.summary(),
            "causes": [c.to_dict() for c in self.causes], "cause": self.cause, "confidence": self.confidence,
            "notes": list(self.notes),
        }


@dataclass
class JointReading:
    """Findings that overlap in time and are read together (e.g. reward up + KL up)."""

    kind: str
    title: str
    start: int
    end: int
    finding_ids: list[str]
    interpretation: str
    suggested_action: str
    check_next: list[str] = field(default_factory=list)
    severity: str = "warning"
    evidence: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        return f"[{self.severity.upper()}] {self.kind} steps {self.start}-{self.end}: {self.title}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "title": self.title, "start": int(self.start), "end": int(self.end),
            "finding_ids": list(self.finding_ids), "interpretation": self.interpretation,
            "suggested_action": self.suggested_action, "check_next": list(self.check_next),
            "severity": self.severity, "evidence": {k: _json_float(v) for k, v in self.evidence.items()},
            "summary": self.summary(),
        }


@dataclass
class TriageStep:
    """One line of the triage list, in the order a person should work through them."""

    order: int
    layer: str          # diagnostic / constraint / objective / comparison / rollback
    text: str
    finding_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"order": self.order, "layer": self.layer, "text": self.text, "finding_ids": list(self.finding_ids)}


@dataclass
class Diagnosis:
    """The result of :func:`registry.analysis.diagnosis.diagnose` for one run."""

    findings: list[Finding]
    joint_readings: list[JointReading]
    triage: list[TriageStep]
    rollback_step: int | None = None
    rollback_reason: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    metrics_checked: list[str] = field(default_factory=list)
    missing_roles: list[str] = field(default_factory=list)
    baseline_task: str | None = None
    #: Metrics present but with too few points to judge: [{"metric", "points", "needed", "text"}].
    not_judged: list[dict[str, Any]] = field(default_factory=list)
    #: What was checked: detector families that had enough data.
    checked: list[str] = field(default_factory=list)
    #: The run's hyper-parameters as read for diagnosis (framework, knob -> setting).
    settings: dict[str, Any] = field(default_factory=dict)
    #: The baseline's strength when one was used: "n=3" or "weak baseline (n=1)".
    baseline_note: str | None = None
    #: Every healthy range a detector judged by: metric -> {"low", "high", "source"}.
    ranges_used: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Every metric of the run that has a healthy range, by the same lookup (what the plots draw):
    #: metric -> {"low", "high", "source", "used"}; ``used`` when a detector judged by it.
    ranges: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: "llm" or "control" (or None): how the texts are worded.
    run_kind: str | None = None
    #: Curves the diagnosis derived or read in part: name -> {"from": source metric, "text": how} (a windowed
    #: episode mean from a per-episode series; a clip fraction without its self-comparing points).
    derived: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def worst_severity(self) -> str | None:
        if not self.findings:
            return None
        return max(self.findings, key=lambda f: f.severity_rank).severity

    def at_least(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.at_least(severity)]

    def by_detector(self, detector: str) -> list[Finding]:
        return [f for f in self.findings if f.detector == detector]

    @property
    def enough_data(self) -> bool:
        """Whether the run's objective (its reward/return) had enough points to be judged at all."""
        return bool(self.checked) and not any(n.get("role") == "reward" for n in self.not_judged)

    @property
    def healthy(self) -> bool:
        """No finding of severity warning or above, and enough data to say so."""
        return not self.at_least("warning") and self.enough_data

    @property
    def verdict(self) -> str:
        """``problems``, ``healthy`` or ``not enough data``."""
        if self.at_least("warning"):
            return "problems"
        return "healthy" if self.enough_data else "not enough data"

    def summary(self) -> str:
        n_warn = len(self.at_least("warning"))
        unjudged = "; ".join(n["text"] for n in self.not_judged)
        if not n_warn:
            if not self.enough_data:
                return "not enough data to judge this run" + (f": {unjudged}" if unjudged else
                                                              " (no reward or return curve)")
            text = f"no problems found ({len(self.findings)} informational finding(s))"
        else:
            text = f"{n_warn} problem(s), worst {self.worst_severity}; first: {self.at_least('warning')[0].summary()}"
        if self.checked:
            text += f"; checked: {', '.join(self.checked)}"
        if self.derived:
            text += "; " + "; ".join(d["text"] for d in self.derived.values())
        if unjudged:
            text += f"; could not judge: {unjudged}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "healthy": self.healthy,
            "worst_severity": self.worst_severity,
            "findings": [f.to_dict() for f in self.findings],
            "joint_readings": [j.to_dict() for j in self.joint_readings],
            "triage": [t.to_dict() for t in self.triage],
            "rollback_step": self.rollback_step,
            "rollback_reason": self.rollback_reason,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "metrics_checked": list(self.metrics_checked),
            "missing_roles": list(self.missing_roles),
            "baseline_task": self.baseline_task,
            "verdict": self.verdict,
            "not_judged": [dict(n) for n in self.not_judged],
            "checked": list(self.checked),
            "settings": dict(self.settings),
            "baseline_note": self.baseline_note,
            "ranges_used": {k: dict(v) for k, v in sorted(self.ranges_used.items())},
            "ranges": {k: dict(v) for k, v in sorted(self.ranges.items())},
            "run_kind": self.run_kind,
            "derived": {k: dict(v) for k, v in self.derived.items()},
        }


def _json_float(v: Any) -> Any:
    """JSON has no NaN/Inf: map them to None (and numpy scalars to Python numbers)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    f = float(v)
    return f if math.isfinite(f) else None


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)
