"""A YAML loader with YAML 1.2 core-schema scalars.

YAML 1.1 (what PyYAML implements) reads ``3e-4`` as a string, ``010`` as 8, ``1:30`` as 90
and ``no`` / ``off`` as False, all of which corrupt a hyperparameter or a dictionary
range quietly. This loader reads decimal ints (and 0x/0o), floats with or without a dot
before the exponent, ``.inf`` / ``.nan``, and only true/false as booleans.
"""
from __future__ import annotations

import re

import yaml

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema numbers and booleans."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT, _BOOL)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
Yaml12Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$"), list("-+0123456789")
)
Yaml12Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _construct_int(loader: Yaml12Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    try:
        return int(text, 0) if text[:2].lower() in ("0x", "0o") else int(text, 10)
    except ValueError:
        raise yaml.constructor.ConstructorError(None, None, f"not an integer: {text!r}", node.start_mark)


def _construct_float(loader: Yaml12Loader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan")
    try:
        return float(text)
    except ValueError:
        raise yaml.constructor.ConstructorError(None, None, f"not a number: {text!r}", node.start_mark)


Yaml12Loader.add_constructor(_INT, _construct_int)
Yaml12Loader.add_constructor(_FLOAT, _construct_float)
