"""Template filters and globals: how numbers, values and query strings are shown on pages."""
from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlencode

from flask import Flask, request
from markupsafe import Markup
from registry.web.security import session_user

def format_number(value: Any, digits: int = 4) -> str:
    """Numbers for tables: 4 significant digits, thousands separators for big whole numbers."""
    if value is None:
        return "\u2014"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if 1e4 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        text = f"{value:.{digits}g}"
        if "e" in text:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}e{int(exponent)}"
        return text
    return str(value)


def show_value(value: Any) -> str:
    """A definition field's value in the edit history: compact JSON for structures, "unset" for None."""
    if value is None:
        return "unset"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return format_number(value, 6) if isinstance(value, (int, float)) else str(value)


def breakable(text: str) -> Markup:
    """Escaped text that may wrap after underscores and dots (long hyperparameter names in headers)."""
    out = Markup.escape(text)
    return out.replace("_", Markup("_<wbr>")).replace(".", Markup(".<wbr>"))


def modify_query(**changes: Any) -> str:
    """The current URL with some query parameters replaced (None removes one); lists repeat a key."""
    args = request.args.to_dict(flat=False)
    for key, value in changes.items():
        if value is None or value == "":
            args.pop(key, None)
        elif isinstance(value, (list, tuple)):
            args[key] = [str(v) for v in value]
        else:
            args[key] = [str(value)]
    query = urlencode([(k, v) for k, vs in args.items() for v in vs])
    return request.path + ("?" + query if query else "")


def register_template_helpers(app: Flask) -> None:
    app.jinja_env.globals["session_user"] = session_user
    app.jinja_env.filters["num"] = format_number
    app.jinja_env.filters["show"] = show_value
    app.jinja_env.filters["breakable"] = breakable
    app.jinja_env.globals["modify_query"] = modify_query
    app.jinja_env.trim_blocks = True
    app.jinja_env.lstrip_blocks = True

    @app.template_filter("when")
    def _when(value: Any) -> str:
        if not value:
            return "\u2014"
        text = value.isoformat() if hasattr(value, "isoformat") else str(value)
        return text.replace("T", " ")[:16]

    @app.template_filter("query")
    def _query(params: dict[str, Any]) -> str:
        items = [(k, v) for k, vals in params.items() for v in (vals if isinstance(vals, (list, tuple)) else [vals])
                 if v is not None and v != ""]
        return urlencode(items)
