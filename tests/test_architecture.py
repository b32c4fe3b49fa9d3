"""The package's shape: layers that import only downwards, no import cycles, no borrowed private names.

The contracts live in pyproject.toml ([tool.importlinter]); `lint-imports` checks them in CI
too. The other checks read the source with `ast`.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "registry"
# A module above this many lines must say why at its top (a "Longer than" note in its docstring).
MAX_LINES = 500


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.relative_to(PACKAGE).parts)


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("import-linter is not installed (it is in the test extra)")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:]
    assert "BROKEN" not in out.stdout
    assert "0 broken" in out.stdout


def test_the_layers_are_folders() -> None:
    for layer in ("core", "db", "dictionary", "importers", "store", "analysis", "web", "cli"):
        assert (PACKAGE / layer / "__init__.py").is_file(), layer
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
        assert len(doc) > 40, f"registry/{layer}/__init__.py should say what the layer holds"


def test_no_module_imports_another_modules_private_names() -> None:
    offences = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("registry"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offences.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    assert offences == []


def test_big_modules_say_why() -> None:
    unexplained = []
    for path in modules():
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Longer than" not in doc:
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == []


def test_only_config_reads_the_environment() -> None:
    readers = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(str(path.relative_to(ROOT)))
    assert readers == []
