"""Flask-WTF forms (every form carries a CSRF token).

The definition form has no author field: the logged-in user is recorded as the author.
"""
from __future__ import annotations

import math
from typing import Any

import yaml
from flask_wtf import FlaskForm
from wtforms import FloatField, IntegerField, SelectField, StringField, TextAreaField
from wtforms.validators import DataRequired, InputRequired, Length, NumberRange, Optional, ValidationError

from registry.core.semantics import AVERAGING, KL_ESTIMATORS, LAYERS, LOGGING_POINTS, NORMALIZATION_AXES, QUANTITIES


try:  # WTForms >= 3.3 deprecates (value, label) tuples
    from wtforms.fields.choices import SelectChoice
except ImportError:  # pragma: no cover - older WTForms
    SelectChoice = None


def choice(value: str, label: str) -> Any:
    return SelectChoice(value, label) if SelectChoice is not None else (value, label)


def choices_of(values: tuple[str, ...], blank: str | None = "unspecified") -> list[Any]:
    out = [choice("", blank)] if blank is not None else []
    return out + [choice(v, v) for v in values]


def format_task_ranges(task_ranges: dict[str, Any]) -> str:
    """``task: low .. high`` per line (an empty side means unbounded), ``  # source`` when known."""
    lines = []
    for task, r in sorted((task_ranges or {}).items()):
        low = "" if r.get("low") is None else repr(float(r["low"]))
        high = "" if r.get("high") is None else repr(float(r["high"]))
        lines.append(f"{task}: {low} .. {high}" + (f"  # {r['source']}" if r.get("source") else ""))
    return "\n".join(lines)


def parse_task_ranges(text: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for n, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line, _, source = line.partition(" # ")     # where the range comes from (kept with it)
        line, source = line.strip(), source.strip()
        task, sep, rest = line.rpartition(":")
        if not sep or not task.strip() or ".." not in rest:
            raise ValueError(f"line {n}: write 'task: low .. high' (leave a side empty for no bound)")
        low_text, high_text = (p.strip() for p in rest.split("..", 1))
        try:
            low = float(low_text) if low_text else None
            high = float(high_text) if high_text else None
        except ValueError:
            raise ValueError(f"line {n}: bounds must be numbers") from None
        if any(v is not None and not math.isfinite(v) for v in (low, high)):
            raise ValueError(f"line {n}: bounds must be finite numbers")
        out[task.strip()] = {"low": low, "high": high, **({"source": source} if source else {})}
    return out


def format_aliases(aliases: list[dict[str, Any]]) -> str:
    if not aliases:
        return ""
    clean = [{k: v for k, v in a.items() if v not in (None, "") or k in ("framework", "key")} for a in aliases]
    return yaml.safe_dump(clean, sort_keys=False, allow_unicode=True, width=100)


def parse_aliases(text: str) -> list[dict[str, Any]]:
    if not (text or "").strip():
        return []
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, list) or not all(isinstance(a, dict) for a in data):
        raise ValueError("aliases must be a YAML list of mappings (framework, key, ...)")
    return data


class DefinitionForm(FlaskForm):
    display_name = StringField("Display name", validators=[DataRequired(), Length(max=200)])
    layer = SelectField("Layer", choices=choices_of(LAYERS, None), validators=[InputRequired()])
    quantity = SelectField("Quantity", choices=choices_of(QUANTITIES, None), validators=[InputRequired()])
    description = TextAreaField("Description", validators=[Optional(), Length(max=20000)])
    formula = TextAreaField("Formula", validators=[Optional(), Length(max=20000)])
    unit = StringField("Unit", validators=[Optional(), Length(max=100)])
    higher_is_better = SelectField("Higher is better", choices=[choice("", "unspecified"), choice("true", "yes"),
                                                                   choice("false", "no")])
    averaging = SelectField("Averaging", choices=choices_of(AVERAGING))
    kl_estimator = SelectField("KL estimator", choices=choices_of(KL_ESTIMATORS))
    normalization_axis = SelectField("Normalization axis", choices=choices_of(NORMALIZATION_AXES))
    logging_point = SelectField("Logging point", choices=choices_of(LOGGING_POINTS))
    healthy_low = FloatField("Healthy range: low", validators=[Optional()])
    healthy_high = FloatField("Healthy range: high", validators=[Optional()])
    task_ranges = TextAreaField("Healthy range per task", validators=[Optional()],
                                description="One per line: task: low .. high (leave a side empty for no bound)")
    smoothing_window = IntegerField("Smoothing window (points)", validators=[InputRequired(), NumberRange(1, 100000)])
    aliases = TextAreaField("Aliases (YAML list)", validators=[Optional()],
                            description="framework, key, and optionally algorithm, kl_estimator, averaging, "
                                        "normalization_axis, logging_point, sign, aggregation, source, notes")
    note = StringField("Why this change", validators=[Optional(), Length(max=2000)])

    def validate_task_ranges(self, field: TextAreaField) -> None:
        try:
            parse_task_ranges(field.data or "")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def validate_aliases(self, field: TextAreaField) -> None:
        try:
            parse_aliases(field.data or "")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def validate_healthy_low(self, field: FloatField) -> None:
        if field.data is not None and not math.isfinite(field.data):
            raise ValidationError("must be a finite number")

    def validate_healthy_high(self, field: FloatField) -> None:
        if field.data is not None and not math.isfinite(field.data):
            raise ValidationError("must be a finite number")

    @classmethod
    def for_definition(cls, definition: dict[str, Any], **kwargs: Any) -> DefinitionForm:
        hib = definition.get("higher_is_better")
        return cls(
            display_name=definition.get("display_name"), layer=definition.get("layer"),
            quantity=definition.get("quantity"), description=definition.get("description"),
            formula=definition.get("formula"), unit=definition.get("unit"),
            higher_is_better="" if hib is None else ("true" if hib else "false"),
            averaging=definition.get("averaging") or "", kl_estimator=definition.get("kl_estimator") or "",
            normalization_axis=definition.get("normalization_axis") or "",
            logging_point=definition.get("logging_point") or "",
            healthy_low=(definition.get("healthy_range") or {}).get("low"),
            healthy_high=(definition.get("healthy_range") or {}).get("high"),
            task_ranges=format_task_ranges(definition.get("task_ranges") or {}),
            smoothing_window=definition.get("smoothing_window"),
            aliases=format_aliases(definition.get("aliases") or []),
            **kwargs,
        )

    def changes(self) -> dict[str, Any]:
        """The edit as ``update_definition`` changes (every editable field; unchanged ones are ignored there)."""
        hib = self.higher_is_better.data

        def text(field: Any) -> str:  # browsers send textarea line breaks as CRLF
            return (field.data or "").replace("\r\n", "\n")

        return {
            "display_name": self.display_name.data.strip(),
            "layer": self.layer.data,
            "quantity": self.quantity.data,
            "description": text(self.description),
            "formula": text(self.formula),
            "unit": self.unit.data or "",
            "higher_is_better": None if not hib else hib == "true",
            "averaging": self.averaging.data or None,
            "kl_estimator": self.kl_estimator.data or None,
            "normalization_axis": self.normalization_axis.data or None,
            "logging_point": self.logging_point.data or None,
            "healthy_range": {"low": self.healthy_low.data, "high": self.healthy_high.data},
            "task_ranges": parse_task_ranges(text(self.task_ranges)),
            "smoothing_window": self.smoothing_window.data,
            "aliases": parse_aliases(text(self.aliases)),
        }
