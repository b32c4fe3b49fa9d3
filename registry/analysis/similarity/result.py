"""What a similar-run search returns: ranked neighbours with their hyperparameters and outcomes."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from registry.core.jsonsafe import json_safe

VERDICT_VERBS = {
    "success": "succeeded", "failed": "failed", "diverged": "diverged", "inconclusive": "were inconclusive",
    None: "have no verdict",
}
VERDICT_VERBS_ONE = {
    "success": "succeeded", "failed": "failed", "diverged": "diverged", "inconclusive": "was inconclusive",
    None: "has no verdict",
}


_clean = json_safe


@dataclass
class Neighbour:
    rank: int
    run_id: str
    name: str
    project: str
    task: str | None
    algorithm: str | None
    status: str
    verdict: str | None
    scores: dict[str, float]
    params: dict[str, Any]
    param_diff: dict[str, list[Any]]         # key -> [query value, this run's value]
    distance: float                          # multi-metric banded DTW, RMS per grid point
    metric_distances: dict[str, float | None]  # per metric (None: not compared)
    metrics_compared: int
    compared_steps: dict[str, list[int]]     # metric -> [first, last] step of the compared portion
    peak_step: int | None                    # where this run's objective metric peaked (whole run)
    warnings: list[str] = field(default_factory=list)
    match_start: float | None = None         # anywhere searches: where the matched window starts (fraction)
    metrics_total: int = 0                   # how many metrics the query compares (coverage: compared of total)
    coverage: str = ""                       # "2 of 3 metrics"

    def matched_at(self) -> str | None:
        """Where an anywhere search matched this run: its steps and how far into its training."""
        steps = next(iter(self.compared_steps.values()), None)
        if self.match_start is None or not steps:
            return None
        return f"steps {steps[0]:,}\u2013{steps[1]:,} ({self.match_start:.0%})"


@dataclass
class SimilarResult:
    query: dict[str, Any]
    metrics: list[str]
    weights: dict[str, float]
    k: int
    engine: str
    embedding_version: str
    neighbours: list[Neighbour]
    excluded: list[dict[str, Any]]           # groups: reason, metric, count, example runs
    excluded_counts: dict[str, int]
    warnings: list[str]
    stats: dict[str, int]
    timings: dict[str, float]
    summary: str = ""
    predicted_verdict: str | None = None
    verdict_counts: dict[str, int] = field(default_factory=dict)
    #: is the nearest run close, against the collection's own nearest-neighbour distances (``closeness``)
    closeness: dict[str, Any] = field(default_factory=dict)
    #: distance-weighted outcome with its confidence and the base rate (``outcome``)
    prediction: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))

    def __iter__(self):
        return iter(self.neighbours)

    def __len__(self) -> int:
        return len(self.neighbours)


def summarize(result: SimilarResult, objective: str | None) -> None:
    """Fill in the verdict counts, the predicted verdict and the summary sentence."""
    ns = result.neighbours
    if not ns:
        result.summary = "No comparable runs found."
        return
    counts = Counter(n.verdict for n in ns)
    result.verdict_counts = {str(k): v for k, v in counts.most_common()}
    # the distance-weighted prediction (``outcome``), not the majority of the k nearest: k far
    # neighbours outvote nothing, and "not enough similar runs" leaves it None
    result.predicted_verdict = (result.prediction or {}).get("verdict")
    parts = []
    for i, (verdict, count) in enumerate(counts.most_common()):
        if i == 0:
            verb = VERDICT_VERBS_ONE[verdict] if count == 1 else VERDICT_VERBS[verdict]
            head = f"{count} of the {len(ns)} nearest run{'s' if len(ns) > 1 else ''}"
            if result.query.get("portion_kind") == "prefix":
                verb = {"succeeded": "went on to succeed", "failed": "went on to fail",
                        "diverged": "went on to diverge"}.get(verb, verb)
            clause = f"{head} {verb}"
            peaks = [n.peak_step for n in ns if n.verdict == verdict and n.peak_step is not None]
            if verdict in ("diverged", "failed") and objective and peaks:
                median = _round_step(sorted(peaks)[len(peaks) // 2])
                clause += f" (their {objective} peaked around step ~{median:,}, median)"
            parts.append(clause)
        else:
            parts.append(f"{count} {VERDICT_VERBS_ONE[verdict] if count == 1 else VERDICT_VERBS[verdict]}")
    lead = result.query.get("portion_label")
    sentence = "; ".join(parts) + "."
    result.summary = (f"Matching {lead}: " + sentence) if lead else sentence[0].upper() + sentence[1:]
    closeness, prediction = result.closeness or {}, result.prediction or {}
    if closeness.get("no_close_match"):
        result.summary += " " + closeness["message"]
    if prediction.get("message"):
        result.summary += " " + prediction["message"]


def _round_step(step: int) -> int:
    if step < 100:
        return int(step)
    digits = len(str(int(step))) - 2
    return int(round(step, -digits))
