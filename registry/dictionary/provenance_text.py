"""How a binding is told to people: where each semantic field came from, in one line or a few.

Used by ``rlreg show``, the run dashboard and the compare page.
"""
from __future__ import annotations

from typing import Any, Mapping


def describe_field_origin(origin: Mapping[str, Any] | None) -> str:
    """``from config: kl_loss_type=low_var_kl`` and the like, for show/dashboard/compare."""
    if not origin:
        return ""
    kind = origin.get("from")
    if kind == "config":
        return f"from config: {str(origin.get('param', '')).rsplit('.', 1)[-1]}={origin.get('config_value')}"
    if kind == "alias":
        version = f" {origin['framework_version']}" if origin.get("framework_version") else ""
        return f"{origin.get('framework')}{version} default"
    if kind == "guessed":
        return f"guessed from {origin.get('framework')}"
    if kind == "layout":
        return f"from the {origin.get('prefix')} prefix"
    if kind == "override":
        return "run override"
    return "definition default"


def describe_binding(provenance: Mapping[str, Any] | None) -> str:
    """One line on how a series was bound."""
    p = provenance or {}
    how = p.get("how")
    if how == "alias":
        text = f"alias {p.get('alias_key')}"
    elif how == "guessed" and not p.get("alias_key"):
        text = "GUESSED: several aliases of the detected framework match; definition defaults"
    elif how == "guessed":
        text = (f"GUESSED: {p.get('alias_key')} is a {', '.join(str(f) for f in p.get('guessed_from') or [])} key, "
                f"not one of this run's framework ({p.get('run_framework') or 'unknown'})")
    elif how == "canonical":
        text = "canonical name"
    elif how == "forced":
        text = "definition chosen by the user"
    elif how == "overridden":
        text = "several aliases match; the run's overrides decide"
    else:
        return "unmapped"
    if p.get("logger_prefix"):
        text += f" (logger prefix {p['logger_prefix']} stripped)"
    return text


_FIELD_LABELS = {"quantity": "quantity", "averaging": "averaging", "kl_estimator": "KL estimator",
                 "normalization_axis": "normalization axis", "logging_point": "logging point"}


def provenance_lines(provenance: Mapping[str, Any] | None) -> list[str]:
    """How a series was bound, then each semantic field not simply the framework's default.

    ``["alias kl (trl)", "KL estimator k3 from config: kl_loss_type=low_var_kl"]``; empty for
    series registered before provenance was recorded.
    """
    p = provenance or {}
    if not p:
        return []
    lines = [describe_binding(p)]
    for f, origin in (p.get("fields") or {}).items():
        if origin.get("from") in ("config", "override", "layout"):
            lines.append(f"{_FIELD_LABELS.get(f, f)} {describe_field_origin(origin)}")
    lines += list(p.get("notes") or [])
    return lines


def provenance_caption(provenance: Mapping[str, Any] | None) -> str:
    """The part of the provenance worth a caption: config, overrides, layout, a guess."""
    p = provenance or {}
    parts = []
    if p.get("how") == "guessed":
        parts.append(f"guessed from {', '.join(str(f) for f in p.get('guessed_from') or [])}")
    for f, origin in (p.get("fields") or {}).items():
        if origin.get("from") in ("config", "override", "layout"):
            parts.append(f"{_FIELD_LABELS.get(f, f)} {describe_field_origin(origin)}")
    return "; ".join(parts)


def binding_summary(info: Mapping[str, Any] | None) -> list[str]:
    """How a run's framework and algorithm were known, its layout, and its config warnings."""
    info = info or {}
    out = []
    origins = {"declared": "declared", "format": "named by the input format", "detected": "detected from the keys"}
    detection = info.get("detection") or {}
    if info.get("framework"):
        version = f" {info['framework_version']}" if info.get("framework_version") else ""
        line = f"framework: {info['framework']}{version} ({origins.get(info.get('framework_from'), 'unknown origin')}"
        if detection.get("evidence"):
            line += f"; {detection['evidence']}, confidence {detection.get('confidence')}"
        out.append(line + ")")
    else:
        out.append("framework: unknown: every alias binding of this run is a guess"
                   + (f" ({detection['evidence']})" if detection.get("evidence") else ""))
    if info.get("algorithm"):
        out.append(f"algorithm for aliases: {info['algorithm']} ({info.get('algorithm_from') or 'declared'})")
    for name, value in (info.get("layout") or {}).items():
        out.append(f"layout: {name}: {value}")
    for warning in info.get("warnings") or []:
        out.append(f"WARNING: {warning}")
    return out
