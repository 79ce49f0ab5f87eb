"""The engines' seams, read from their source (no import, no broker).

The ownership rules (no class over several files, each attribute written from one module, nothing
set on another object) are checked for the engines with the rest of the package, by the one
checker (`tests/structure.py`, run by ``tests/unit/test_structure.py``). Here: the interfaces
between the pipeline and an engine stay narrow.
"""

from __future__ import annotations

import ast

from tests import structure

TREE = structure.Tree()
INTERFACES = TREE.modules["sidecar.engines.interfaces"]


def members(name: str) -> list[str]:
    """The methods and properties a protocol of ``sidecar.engines.interfaces`` declares."""
    node = INTERFACES.classes[name].node
    out = []
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(stmt.name)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.append(stmt.target.id)
    return out


def test_the_pipeline_and_an_adapter_talk_through_narrow_interfaces() -> None:
    # One protocol each way (and the adapter's read-only view), at most 8 members each.
    sizes = {name: len(members(name)) for name in ("Outlet", "StateAdapter", "StateView")}
    assert all(1 <= n <= 8 for n in sizes.values()), sizes
