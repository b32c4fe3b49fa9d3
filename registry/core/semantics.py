"""The vocabulary of metric semantics, and the rule for when two series are comparable.

A series' effective semantics are its definition's fields, overridden by the framework
alias it was logged under (verl's ``actor/kl_loss`` is k3 by default, CleanRL's
``losses/old_approx_kl`` is k1), overridden again by the run itself.
"""
from __future__ import annotations

from typing import Any, Mapping

LAYERS = ("objective", "constraint", "diagnostic")

QUANTITIES = (
    "reward", "return", "advantage", "value", "kl", "clip_fraction", "entropy",
    "loss", "length", "std", "grad_norm", "learning_rate", "explained_variance",
    "ratio", "rate", "coefficient", "count", "throughput", "time", "other",
)
AVERAGING = ("token", "sequence", "episode", "batch", "group", "none")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "full", "n/a")
NORMALIZATION_AXES = ("none", "batch", "group", "minibatch")
LOGGING_POINTS = (
    "rollout",
    "before_grad_accumulation",
    "after_grad_accumulation",
    "after_optimizer_step",
    "eval",
)

# Fields that decide whether two curves measure the same thing. ``sign`` is included
# because SB3 logs entropy as a negative loss: it is normalised away by the alias scale,
# so after scaling the canonical view is comparable, but the raw values are not.
SEMANTIC_FIELDS = ("quantity", "averaging", "kl_estimator", "normalization_axis", "logging_point")

ENUMS: dict[str, tuple[str, ...]] = {
    "layer": LAYERS,
    "quantity": QUANTITIES,
    "averaging": AVERAGING,
    "kl_estimator": KL_ESTIMATORS,
    "normalization_axis": NORMALIZATION_AXES,
    "logging_point": LOGGING_POINTS,
}

FIELD_LABELS = {
    "quantity": "quantity",
    "averaging": "averaging",
    "kl_estimator": "KL estimator",
    "normalization_axis": "normalization axis",
    "logging_point": "logging point",
}


def check_enum(field: str, value: Any) -> None:
    """Raise ValueError when ``value`` is not a legal value of the enum ``field``."""
    allowed = ENUMS.get(field)
    if allowed is not None and value is not None and value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}; got {value!r}")


def effective_semantics(definition: Mapping[str, Any], *overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Definition fields, overridden left to right by alias and run-level overrides."""
    result = {f: definition.get(f) for f in SEMANTIC_FIELDS}
    for layer in overrides:
        for f in SEMANTIC_FIELDS:
            if layer and layer.get(f) is not None:
                result[f] = layer[f]
    return result


def semantic_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Human-readable list of the semantic fields on which two series disagree."""
    out = []
    for f in SEMANTIC_FIELDS:
        va, vb = a.get(f), b.get(f)
        if va != vb:
            out.append(f"{FIELD_LABELS[f]}: {va or 'unspecified'} vs {vb or 'unspecified'}")
    return out
