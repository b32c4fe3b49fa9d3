"""The run filter language: ``lr>1e-5 and algorithm=GRPO and not tag=smoke``.

Parsed with a grammar (never evaluated) and compiled to parameterised SQLAlchemy
expressions, so hostile input can only ever be a syntax error or a value.

Fields:
- run columns: ``name project algorithm framework task status verdict code_version id``;
- ``tag`` (the run has that tag);
- ``score.NAME`` (a final score of the outcome);
- ``metric.NAME.STAT`` with STAT one of first, last, min, max, mean, count, nan_count
  (NAME a canonical metric name or a raw key);
- ``label.NAME`` (a series of the run whose templated key captured that label:
  ``label.data_source=openai/gsm8k``, ``label.reward_func_name~format``);
- anything else is a hyperparameter (dotted keys as flattened: ``optim.lr``), also
  reachable as ``param.KEY``.
Operators: ``= != < <= > >= ~`` (``~`` is "contains"), and ``FIELD in (a, b)``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from lark import Lark, Token, Transformer, Tree, UnexpectedInput, v_args
from sqlalchemy import ColumnElement, and_, exists, func, not_, or_, select, true

from registry.core.errors import FilterSyntaxError, InputError
from registry.core.run_fields import ORDERABLE_FIELDS
from registry.db.schema import metric_definitions, outcome_scores, run_params, run_tags, runs, series

MAX_FILTER_LENGTH = 2000
MAX_FILTER_DEPTH = 20  # nested not / and / or / parentheses; real filters use 2-4

GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> negation
         | atom
?atom: comparison
     | membership
     | "(" or_expr ")"
comparison: FIELD OP value
membership: FIELD _IN "(" value ("," value)* ")"
?value: SIGNED_NUMBER -> number
      | ESCAPED_STRING -> string
      | SINGLE_STRING -> string
      | WORD -> word

_AND.3: /and\b/i
_OR.3: /or\b/i
_NOT.3: /not\b/i
_IN.3: /in\b/i
OP: "<=" | ">=" | "!=" | "==" | "=" | "<" | ">" | "~"
FIELD.1: /[A-Za-z_][A-Za-z0-9_.\/\-]*/
WORD: /[A-Za-z0-9_.\/\-:+]+/
SINGLE_STRING: /'[^']*'/

%import common.SIGNED_NUMBER
%import common.ESCAPED_STRING
%import common.WS
%ignore WS
"""

RUN_COLUMNS = {
    "id": runs.c.id, "name": runs.c.name, "project": runs.c.project, "algorithm": runs.c.algorithm,
    "framework": runs.c.framework, "task": runs.c.task, "status": runs.c.status, "verdict": runs.c.verdict,
    "code_version": runs.c.code_version,
}
ORDERABLE = {name: runs.c[name] for name in ORDERABLE_FIELDS}
SERIES_STATS = {
    "first": series.c.first_value, "last": series.c.last_value, "min": series.c.min_value, "max": series.c.max_value,
    "count": series.c.count, "nan_count": series.c.nan_count,
}
COMPARATORS = {
    "=": lambda c, v: c == v, "==": lambda c, v: c == v, "!=": lambda c, v: c != v,
    "<": lambda c, v: c < v, "<=": lambda c, v: c <= v, ">": lambda c, v: c > v, ">=": lambda c, v: c >= v,
}


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", maybe_placeholders=False)


class _Value:
    """A literal with what kind it is: numbers compare numerically, words and strings as text."""

    def __init__(self, raw: str, kind: str):
        self.kind = kind
        if kind == "number":
            self.value: Any = float(raw)
        elif kind == "string":
            self.value = raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw[1:-1]
        else:
            low = raw.lower()
            if low in ("true", "false"):
                self.kind, self.value = "bool", low == "true"
            elif low in ("null", "none"):
                self.kind, self.value = "null", None
            else:
                self.value = raw


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _text_compare(column: Any, op: str, value: _Value, case_insensitive: bool = False) -> ColumnElement:
    if value.kind == "null":
        if op in ("=", "=="):
            return column.is_(None)
        if op == "!=":
            return column.is_not(None)
        raise ValueError(f"operator {op} does not apply to null")
    text = str(value.value).lower() if value.kind == "bool" else str(value.value)
    if value.kind == "number" and text.endswith(".0"):
        text = text[:-2]
    col = func.lower(column) if case_insensitive else column
    if case_insensitive:
        text = text.lower()
    if op == "~":
        return col.like(f"%{_escape_like(text)}%", escape="\\")
    return COMPARATORS[op](col, text)


def _param_condition(key: str, op: str, value: _Value) -> ColumnElement:
    base = [run_params.c.run_id == runs.c.id, run_params.c.key == key]
    if value.kind in ("number", "bool") and op != "~":
        num = float(value.value)
        cond = COMPARATORS[op](run_params.c.num_value, num)
        if op == "!=":
            # "lr != 1e-4" should hold for runs without an lr as well; say so explicitly.
            return not_(exists(select(run_params.c.run_id).where(*base, run_params.c.num_value == num)))
        return exists(select(run_params.c.run_id).where(*base, cond))
    if op in ("<", "<=", ">", ">="):
        raise ValueError(f"operator {op} needs a number, got {value.value!r}")
    if op == "!=":
        return not_(exists(select(run_params.c.run_id).where(*base, _text_compare(run_params.c.text_value, "=", value))))
    return exists(select(run_params.c.run_id).where(*base, _text_compare(run_params.c.text_value, op, value)))


def _metric_condition(field: str, op: str, value: _Value) -> ColumnElement:
    name, _, column = _metric_stat_column(field)
    if value.kind != "number" or op == "~":
        raise ValueError(f"{field} compares with a number")
    return exists(select(series.c.id).where(series.c.run_id == runs.c.id, _series_named(name),
                                          COMPARATORS[op](column, value.value)))


def _label_condition(name: str, op: str, value: _Value) -> ColumnElement:
    """The run has a series whose templated key captured ``name`` with that value
    (``label.data_source=openai/gsm8k``, ``label.reward_func_name~format``)."""
    if not name or op in ("<", "<=", ">", ">="):
        raise ValueError("label.NAME takes =, != or ~")
    column = series.c.labels[name].as_string()
    has = exists(select(series.c.id).where(
        series.c.run_id == runs.c.id, _text_compare(column, "~" if op == "~" else "=", value)))
    return not_(has) if op == "!=" else has


def _metric_stat_column(field: str) -> tuple[str, str, Any]:
    """(name, stat, column expression) of a ``metric.NAME.STAT`` field."""
    _, rest = field.split(".", 1)
    name, _, stat = rest.rpartition(".")
    if not name or stat not in SERIES_STATS and stat != "mean":
        raise ValueError(f"write metric fields as metric.NAME.STAT with STAT one of "
                         f"{', '.join([*SERIES_STATS, 'mean'])}")
    if stat == "mean":
        return name, stat, series.c.finite_sum / func.nullif(series.c.count - series.c.nan_count - series.c.inf_count, 0)
    return name, stat, SERIES_STATS[stat]


def _series_named(name: str) -> ColumnElement:
    return or_(
        series.c.key == name,
        series.c.definition_id.in_(select(metric_definitions.c.id).where(metric_definitions.c.name == name)),
    )


def sort_keys(field: str) -> list[Any]:
    """ORDER BY expressions for a run column, ``param.KEY`` or ``metric.NAME.STAT``.

    Hyperparameters sort numbers numerically and text alphabetically (numbers first);
    runs without the key or metric sort last either way.
    """
    if field in ORDERABLE:
        return [ORDERABLE[field]]
    try:
        if field.startswith("param."):
            key = field[6:]
            base = select(run_params.c.num_value).where(run_params.c.run_id == runs.c.id, run_params.c.key == key)
            text = select(run_params.c.text_value).where(run_params.c.run_id == runs.c.id, run_params.c.key == key)
            return [base.scalar_subquery(), text.scalar_subquery()]
        if field.startswith("metric."):
            name, _, column = _metric_stat_column(field)
            sub = (select(column).where(series.c.run_id == runs.c.id, _series_named(name))
                   .order_by(series.c.count.desc()).limit(1))
            return [sub.scalar_subquery()]
    except ValueError as exc:
        raise InputError(str(exc)) from None
    raise InputError(f"cannot sort by {field!r}; choose from {', '.join(ORDERABLE)}, param.KEY or metric.NAME.STAT")


def _comparison(field: str, op: str, value: _Value) -> ColumnElement:
    lowered = field.lower()
    if lowered in RUN_COLUMNS:
        if op in ("<", "<=", ">", ">="):
            raise ValueError(f"{field} is text: use =, != or ~")
        return _text_compare(RUN_COLUMNS[lowered], op, value, case_insensitive=True)
    if lowered == "tag":
        if op not in ("=", "==", "!=", "~"):
            raise ValueError("tag takes =, != or ~")
        has = exists(select(run_tags.c.run_id).where(
            run_tags.c.run_id == runs.c.id, _text_compare(run_tags.c.tag, "~" if op == "~" else "=", value)))
        return not_(has) if op == "!=" else has
    if lowered.startswith("score."):
        if value.kind != "number" or op == "~":
            raise ValueError(f"{field} compares with a number")
        return exists(select(outcome_scores.c.run_id).where(
            outcome_scores.c.run_id == runs.c.id, outcome_scores.c.name == field[6:],
            COMPARATORS[op](outcome_scores.c.value, value.value)))
    if lowered.startswith("metric."):
        return _metric_condition(field, op, value)
    if lowered.startswith("label."):
        return _label_condition(field[6:], op, value)
    key = field[6:] if lowered.startswith("param.") else field
    return _param_condition(key, op, value)


@v_args(inline=True)
class _Compiler(Transformer):
    def number(self, tok: Token) -> _Value:
        return _Value(str(tok), "number")

    def string(self, tok: Token) -> _Value:
        return _Value(str(tok), "string")

    def word(self, tok: Token) -> _Value:
        return _Value(str(tok), "word")

    def comparison(self, field: Token, op: Token, value: _Value) -> ColumnElement:
        return _comparison(str(field), str(op), value)

    def membership(self, field: Token, *values: _Value) -> ColumnElement:
        return or_(*(_comparison(str(field), "=", v) for v in values))

    def negation(self, expr: ColumnElement) -> ColumnElement:
        return not_(expr)

    def and_expr(self, *exprs: ColumnElement) -> ColumnElement:
        return and_(*exprs)

    def or_expr(self, *exprs: ColumnElement) -> ColumnElement:
        return or_(*exprs)


def quote_string(text: str) -> str:
    """``text`` as the inside of a double-quoted filter string (``task="..."``)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def compile_filter(expression: str) -> ColumnElement:
    """A WHERE clause over ``runs`` for a filter expression; FilterSyntaxError when malformed."""
    if not expression or not expression.strip():
        return true()
    if len(expression) > MAX_FILTER_LENGTH:
        raise FilterSyntaxError(f"longer than {MAX_FILTER_LENGTH} characters", expression[:60] + "...")
    try:
        tree = _parser().parse(expression)
    except UnexpectedInput as exc:
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or [])
        hint = f"; expected {', '.join(_token_names(expected))}" if expected else ""
        raise FilterSyntaxError(f"unexpected input{hint}", expression, exc.column) from None
    if _depth(tree) > MAX_FILTER_DEPTH:
        raise FilterSyntaxError(f"nested more than {MAX_FILTER_DEPTH} levels deep (not, and, or, parentheses)",
                                expression[:60] + ("..." if len(expression) > 60 else ""))
    try:
        return _Compiler().transform(tree)
    except Exception as exc:  # lark wraps transformer errors in VisitError
        cause = getattr(exc, "orig_exc", exc)
        if isinstance(cause, ValueError):
            raise FilterSyntaxError(str(cause), expression) from None
        raise


def hyperparameter_fields(expression: str) -> list[str]:
    """The hyperparameter keys a (valid) filter expression refers to, in order of appearance."""
    if not expression or not expression.strip():
        return []
    keys = []
    for token in _parser().parse(expression).scan_values(lambda t: isinstance(t, Token) and t.type == "FIELD"):
        lowered = str(token).lower()
        if lowered in RUN_COLUMNS or lowered == "tag" or lowered.startswith(("score.", "metric.", "label.")):
            continue
        keys.append(str(token)[6:] if lowered.startswith("param.") else str(token))
    return list(dict.fromkeys(keys))


# Short names people type for hyperparameters, and the keys trainers write them as.
_PARAM_SYNONYMS = {"lr": ("learning_rate",), "learning_rate": ("lr",), "ent_coef": ("ent_coef",),
                   "clip": ("clip_range", "clip_coef", "clip_ratio"), "epochs": ("n_epochs", "ppo_epochs")}


def suggest_params(key: str, known: list[str], limit: int = 3) -> list[str]:
    """Known hyperparameter keys close to ``key``: same last component, a common synonym, or spelling."""
    import difflib

    last = key.rsplit(".", 1)[-1].lower()
    wanted = {last, *_PARAM_SYNONYMS.get(last, ())}
    exact = [k for k in known if k.rsplit(".", 1)[-1].lower() in wanted]
    close = difflib.get_close_matches(key, known, n=limit, cutoff=0.6)
    return list(dict.fromkeys(exact + close))[:limit]


def _depth(tree: Tree) -> int:
    """The nesting depth of a parse tree, walked without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))
    return deepest


_TOKEN_NAMES = {
    "FIELD": "a field name", "OP": "an operator (= != < <= > >= ~)", "SIGNED_NUMBER": "a number",
    "ESCAPED_STRING": "a quoted string", "WORD": "a value", "LPAR": "(", "RPAR": ")", "_AND": "and",
    "_OR": "or", "_NOT": "not", "_IN": "in", "COMMA": ",", "SINGLE_STRING": "a quoted string",
}


def _token_names(names: list[str]) -> list[str]:
    return list(dict.fromkeys(_TOKEN_NAMES.get(n, n) for n in names))


