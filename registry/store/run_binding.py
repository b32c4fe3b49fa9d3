"""What binding needs to know about a run: its framework and algorithm, each with where it came from."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from registry.core.hparams import flatten, restore_value
from registry.db.models import Run
from registry.dictionary.binding import AliasIndex, Binding, BindingContext, split_framework
from registry.dictionary.config_semantics import algorithm_from_config


def declared_binding_info(framework: str | None, algorithm: str | None) -> dict[str, Any]:
    fw, version = split_framework(framework)
    info: dict[str, Any] = {}
    if fw:
        info.update(framework=fw, framework_from="declared")
        if version:
            info["framework_version"] = version
    if algorithm:
        info.update(algorithm=algorithm.lower(), algorithm_from="declared")
    return info


def resolve_framework(
    index: AliasIndex, keys: Any, params: Mapping[str, Any], declared: str | None, declared_algorithm: str | None,
    format_framework: str | None = None, format_algorithm: str | None = None,
    layout: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's framework and algorithm, each with where it came from (the run's ``binding_info``).

    Declared beats the input format's own hint, which beats detection from the keys; the
    algorithm used to pick per-algorithm aliases is declared, else named by the config, else detected.
    """
    info = declared_binding_info(declared, declared_algorithm)
    detection = index.detect(keys)
    if not info.get("framework") and format_framework:
        fw, version = split_framework(format_framework)
        info.update(framework=fw, framework_from="format")
        if version:
            info["framework_version"] = version
    if not info.get("framework") and detection.framework:
        info.update(framework=detection.framework, framework_from="detected")
    if detection.framework or detection.confidence:
        info["detection"] = {"framework": detection.framework, "confidence": detection.confidence,
                             "algorithm": detection.algorithm, "evidence": detection.evidence}
    if not info.get("algorithm"):
        from_config = algorithm_from_config(info.get("framework"), flatten(params or {}))
        if format_algorithm:
            info.update(algorithm=format_algorithm.lower(), algorithm_from="format")
        elif from_config:
            info.update(algorithm=from_config[0], algorithm_from=f"config: {from_config[1]}")
        elif detection.algorithm and detection.framework == info.get("framework"):
            info.update(algorithm=detection.algorithm, algorithm_from="detected")
    if layout:
        info["layout"] = dict(layout)
    return info


def binding_context(run: Run) -> BindingContext:
    """What binding needs to know about a run: framework, version, algorithm and flattened params."""
    info = dict(run.binding_info or {})
    params = {p.key: restore_value(p.value_type, p.num_value, p.text_value) for p in run.params}
    return BindingContext(
        framework=run.framework,
        framework_version=info.get("framework_version"),
        framework_from=info.get("framework_from"),
        algorithm=info.get("algorithm") or (run.algorithm.lower() if run.algorithm else None),
        algorithm_from=info.get("algorithm_from"),
        params=params,
    )


def record_binding_warnings(run: Run, bindings: Iterable[Binding]) -> None:
    """Keep the config-vs-key warnings of newly bound series on the run (shown with it)."""
    new = [w for b in bindings for w in b.warnings]
    if not new:
        return
    info = dict(run.binding_info or {})
    info["warnings"] = list(dict.fromkeys(list(info.get("warnings", [])) + new))
    run.binding_info = info
