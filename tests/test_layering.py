"""Imports flow one way: cli -> analysis/render -> planners -> dump -> errors (AST check)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kvcanary_cli"

#: layer -> package modules (prefixes) it may import.
ALLOWED = {
    "errors": set(),
    "dump": {"errors", "dump"},
    "planners": {"errors", "dump", "planners"},
    "analysis": {"errors", "dump", "planners", "analysis"},
    "render": {"render", "analysis.model", ""},  # "" = the package root, for __version__
    "capture": {"dump", "errors"},
    "cli": {"errors", "dump", "planners", "analysis", "render", ""},
    "__main__": {"cli"},
    "__init__": set(),
}


def layer_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def package_imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if name == "kvcanary_cli" or name.startswith("kvcanary_cli."):
                found.append((name.removeprefix("kvcanary_cli").lstrip("."), node.lineno))
            if name.split(".")[0] == "triton":
                found.append(("<triton>", node.lineno))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    layer = layer_of(path)
    allowed = ALLOWED[layer]
    for target, line in package_imports(path):
        if target == "<triton>":
            assert path.name == "triton_runtime.py", f"{path.name}:{line} imports triton"
            continue
        ok = any(target == a or target.startswith(a + ".") for a in allowed if a) or (
            "" in allowed and target == "")
        assert ok, f"{path.relative_to(PACKAGE)}:{line} ({layer}) imports kvcanary_cli.{target}"


def test_nothing_imports_the_cli() -> None:
    for path in MODULES:
        if path.name in ("cli.py", "__main__.py"):
            continue
        assert all(t != "cli" for t, _ in package_imports(path)), path


def test_every_module_has_a_docstring() -> None:
    for path in MODULES:
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no module docstring"
