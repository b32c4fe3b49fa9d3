"""Checking the dictionary against pinned lists of the keys each framework logs.

A key list is a text file, one key per line, with ``# framework: NAME`` (and optionally
``# algorithm: NAME``) in its header comments; ``rlreg dictionary check-keys DIR`` (and the
test suite) bind every key as a run of that framework would and report the keys that bind to
no alias of their own framework. Keep the lists current from the frameworks' logging code and
the check fails as soon as a trainer logs a key the dictionary does not define.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from registry.dictionary.binding import AliasIndex, AmbiguousKeyError, BindingContext, normalize_framework
from registry.core.errors import InputError


@dataclass(frozen=True)
class KeyList:
    path: Path
    framework: str
    algorithm: str | None
    keys: tuple[str, ...]


def read_key_list(path: Path) -> KeyList:
    framework = algorithm = None
    keys = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if text.startswith("#"):
            name, _, value = text.lstrip("# ").partition(":")
            if name.strip() == "framework":
                framework = normalize_framework(value.strip())
            elif name.strip() == "algorithm":
                algorithm = value.strip() or None
        elif text:
            keys.append(text)
    if not framework:
        raise InputError("no '# framework: NAME' header", str(path))
    return KeyList(path, framework, algorithm, tuple(keys))


def unbound_keys(index: AliasIndex, key_list: KeyList) -> list[str]:
    """Keys of the list that no alias of their own framework defines (with why)."""
    ctx = BindingContext(framework=key_list.framework, framework_from="declared", algorithm=key_list.algorithm)
    missing = []
    for key in key_list.keys:
        try:
            binding = index.bind(key, ctx)
        except AmbiguousKeyError as exc:
            missing.append(f"{key}: {exc}")
            continue
        if binding.how != "alias":
            missing.append(f"{key}: " + ("unmapped" if not binding.mapped else f"bound only as {binding.how}"))
    return missing


def check_key_lists(index: AliasIndex, directory: Path) -> dict[str, list[str]]:
    """``{file name: [problems]}`` for every ``*.txt`` key list in ``directory``."""
    files = sorted(Path(directory).glob("*.txt"))
    if not files:
        raise InputError("no key lists (*.txt) found", str(directory))
    return {f.name: unbound_keys(index, read_key_list(f)) for f in files}
