"""The package's layers: a module never imports from a higher layer, and no two modules import
each other (directly or round a longer loop). Imports inside functions count too: a lazy import is
still a dependency.

Layers, lowest first (README, "How it is built"):
core < memory < speed < runtime < search < configs < diagnosis < ui < commands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"
LAYERS = ["core", "memory", "speed", "runtime", "search", "configs", "diagnosis", "ui", "commands"]
# top-level modules: the public callback sits with diagnosis; the CLI dispatches to commands
TOP_LEVEL = {"advisor": -1, "advisor.integrations": LAYERS.index("diagnosis"),
             "advisor.cli": len(LAYERS), "advisor.__main__": len(LAYERS) + 1}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    parts = module.split(".")
    assert parts[1] in LAYERS, f"{module} is in no layer: put it under one of {LAYERS}"
    return LAYERS.index(parts[1])


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")
            if "templates" not in p.parts}  # export templates are written out, not imported


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The advisor modules ``path`` imports (``from advisor.x import y`` counts y when it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if not name.startswith("advisor"):
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


GRAPH = {m: imports_of(p, set(modules())) - {m} for m, p in modules().items()}


def test_every_module_sits_in_a_layer():
    for m in GRAPH:
        layer_of(m)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_a_higher_layer(module):
    mine = layer_of(module)
    higher = sorted(t for t in GRAPH[module]
                    if layer_of(t) > mine and not module.startswith(t + ".") and t != "advisor")
    assert not higher, f"{module} (layer {LAYERS[mine] if mine >= 0 else 'top'}) imports higher: {higher}"


def test_no_import_cycle():
    # package __init__ modules re-export their children; an edge parent → child is not a loop
    edges = {m: {t for t in ts if not t.startswith(m + ".") and not m.startswith(t + ".")}
             for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " → ".join(cycle))
            if not state.get(t):
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m)
