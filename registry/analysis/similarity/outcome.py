"""How will this run end? A distance-weighted vote of its neighbours, next to the collection's base rate.

Each neighbour with a verdict votes with a Gaussian kernel weight ``exp(-(d / h)^2 / 2)`` times
its coverage (metrics compared / metrics asked), where ``h`` is the collection's median
nearest-neighbour distance (``closeness``): a run as close as runs here usually are to their
nearest neighbour counts ~0.6, one at twice that distance ~0.14, one at the same distance as
the query itself 1. The sum of the weights is the *effective number of neighbours*: ten
neighbours that are all far away add up to little, however unanimous they are, where a
majority of the k nearest would still have called it. A prediction is made only when that sum
reaches ``MIN_EFFECTIVE`` and a reference exists; otherwise the honest answer is "not enough
similar runs". The predicted verdict's weighted share (the agreement) is shown next to the
share of that verdict among the collection's runs (the base rate).

A split vote is not a prediction: the leading verdict must hold at least ``MIN_AGREEMENT`` of the
weight and more than its base rate, else the answer says the neighbours are split (with their
shares). On the labelled real SB3 sweep (``bench/similar_real.py``) the ungated vote was right
on 2 of 11 held-out runs it answered, below the base rate's 10 of 15: its leads were 50-77%
shares of runs whose failures (entropy collapse, a narrow clip range) leave the return curve
looking healthy.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

MIN_EFFECTIVE = 2.0
#: Share of the weight the leading verdict needs before it is called the likely outcome.
MIN_AGREEMENT = 2 / 3


@dataclass
class OutcomePrediction:
    verdict: str | None                   # None: not enough similar runs
    agreement: float | None               # weighted share of the predicted verdict (0-1)
    effective_neighbours: float           # sum of kernel weights (a neighbour at distance 0 counts 1)
    base_rate: float | None               # share of the predicted (or, without one, the leading) verdict in the collection
    bandwidth: float | None               # h: the collection's median nearest-neighbour distance
    shares: dict[str, float] = field(default_factory=dict)      # weighted share per verdict
    base_rates: dict[str, float] = field(default_factory=dict)  # collection share per verdict
    runs_with_verdict: int = 0            # in the collection (the base rate's denominator)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_weights(distances: np.ndarray, coverage: np.ndarray, bandwidth: float) -> np.ndarray:
    """Gaussian kernel of the distances in units of the bandwidth, times each neighbour's coverage share."""
    z = np.asarray(distances, dtype=np.float64) / bandwidth
    return np.exp(-0.5 * z * z) * np.asarray(coverage, dtype=np.float64)


def base_rates(counts: Mapping[str | None, int]) -> tuple[dict[str, float], int]:
    """Share of each verdict among the collection's runs that have one, and how many have one."""
    known = {str(v): int(c) for v, c in counts.items() if v}
    total = sum(known.values())
    return ({v: c / total for v, c in sorted(known.items(), key=lambda kv: -kv[1])} if total else {}), total


def predict(verdicts: Sequence[str | None], distances: Sequence[float], coverage: Sequence[float],
            bandwidth: float | None, collection_counts: Mapping[str | None, int]) -> OutcomePrediction:
    """Distance-weighted outcome of the neighbours (see the module)."""
    rates, n_known = base_rates(collection_counts)
    keep = [i for i, v in enumerate(verdicts) if v]
    if bandwidth is None or not bandwidth > 0:
        lead = next(iter(rates), None)
        return OutcomePrediction(None, None, 0.0, rates.get(lead) if lead else None, None, {}, rates, n_known,
                                 "Not enough similar runs to predict the outcome: the collection is too small to "
                                 "know what distance counts as close.")
    if not keep:
        return OutcomePrediction(None, None, 0.0, None, bandwidth, {}, rates, n_known,
                                 "Not enough similar runs to predict the outcome: none of the neighbours has a "
                                 "verdict.")
    w = kernel_weights(np.asarray(distances)[keep], np.asarray(coverage)[keep], bandwidth)
    mass = float(w.sum())
    shares: dict[str, float] = {}
    for i, wi in zip(keep, w):
        shares[str(verdicts[i])] = shares.get(str(verdicts[i]), 0.0) + float(wi)
    if mass > 0:
        shares = {v: s / mass for v, s in sorted(shares.items(), key=lambda kv: -kv[1])}
    lead = next(iter(shares))
    if mass < MIN_EFFECTIVE:
        return OutcomePrediction(None, None, mass, rates.get(lead), bandwidth, shares, rates, n_known,
                                 f"Not enough similar runs to predict the outcome: the neighbours with a verdict "
                                 f"add up to {mass:.1f} effective neighbours (at least {MIN_EFFECTIVE:.0f} needed; "
                                 f"a run at the collection's usual nearest-neighbour distance, {bandwidth:.2f}, "
                                 "counts 0.6).")
    base = rates.get(lead)
    if shares[lead] < MIN_AGREEMENT or (base is not None and shares[lead] <= base):
        split = ", ".join(f"{v} {sh:.0%}" for v, sh in shares.items())
        why = (f"the leading verdict needs {MIN_AGREEMENT:.0%} of the weight" if shares[lead] < MIN_AGREEMENT
               else f"{lead} is no more common among them than in the collection ({base:.0%})")
        return OutcomePrediction(None, shares[lead], mass, base, bandwidth, shares, rates, n_known,
                                 f"No prediction: the similar runs ended {split} (weight of {mass:.1f} effective "
                                 f"neighbours), and {why}.")
    base_text = f"{base:.0%} of the collection's {n_known} runs with a verdict" if base is not None else \
        "no run of the collection has that verdict"
    return OutcomePrediction(lead, shares[lead], mass, base, bandwidth, shares, rates, n_known,
                             f"Likely outcome: {lead} ({shares[lead]:.0%} of the weight of {mass:.1f} effective "
                             f"neighbours; base rate {base_text}).")
