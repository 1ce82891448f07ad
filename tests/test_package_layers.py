"""The package is layered: its import graph -- every ``import`` / ``from ... import`` of a sparsedp
module, at module level or inside a function -- has no cycle, so no module imports one that
(directly or through others) imports it back: no module imports upward."""

import ast
from pathlib import Path

import networkx as nx

import sparsedp

ROOT = Path(sparsedp.__file__).resolve().parent


def _module(f: Path) -> str:
    parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Edges ``a -> b``: module ``a`` imports module ``b`` somewhere (function bodies included);
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module, else ``pkg``."""
    files = {_module(f): f for f in ROOT.rglob("*.py")}
    G = nx.DiGraph()
    for mod, f in files.items():
        G.add_node(mod)
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    dest = sub if sub in files else target
                    if dest in files and dest != mod:
                        G.add_edge(mod, dest)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in files and alias.name != mod:
                        G.add_edge(mod, alias.name)
    G.remove_node("sparsedp")  # the top-level package re-exports everything; nothing below imports it
    return G


def test_the_graph_is_read():
    G = import_graph()
    assert G.has_edge("sparsedp.mechanism", "sparsedp.measure")  # a module-level import
    assert G.number_of_nodes() > 100 and G.number_of_edges() > 300


def test_no_module_imports_upward():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == []
