"""No module of gsched imports itself through others (the contracts in pyproject.toml check the
direction between parts; this checks every module, across the three top-level packages)."""

from __future__ import annotations

import grimp
import networkx as nx


def test_no_module_imports_itself_through_other_modules() -> None:
    graph = grimp.build_graph("scheduler", "policies", "agents")
    g = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] in ("scheduler", "policies", "agents"):
                g.add_edge(module, imported)
    # A package's __init__ importing its own modules is not a circle of the code's parts.
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], f"import circles: {circles}"
