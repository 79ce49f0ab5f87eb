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


def test_the_engine_interface_is_small() -> None:
    # What the daemon, the local API and the metrics may do with an engine.
    assert len(members("Engine")) <= 10, members("Engine")


def _pass_through(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method whose body (past its docstring) only hands the call on to a part of ``self``."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
        return False
    value = body[0].value
    if isinstance(value, ast.Await):
        value = value.value
    if isinstance(value, ast.Call):
        value = value.func
    return (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Attribute)
        and isinstance(value.value.value, ast.Name)
        and value.value.value.id == "self"
    )


def test_the_pipeline_has_no_pass_through_methods() -> None:
    pipeline = TREE.modules["sidecar.engines.pipeline"].classes["Pipeline"].node
    methods = [s for s in pipeline.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) >= 10
    # Its face: a public method does something of its own, not just hand the call to a part.
    assert [m.name for m in methods if _pass_through(m) and not m.name.startswith("_")] == []


def private_calls(packages: tuple[str, ...] = ("sidecar.engines",)) -> list[str]:
    """``x._method`` where ``x`` is not ``self`` and the code is not in a class defining
    ``_method``: a caller reaching another object's private method (e.g. a request object calling
    back its owner's)."""
    defined: dict[str, set[str]] = {}  # private method -> the classes defining it
    for m in TREE.in_packages(packages):
        for k in m.classes.values():
            for s in k.node.body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    s.name.startswith("_") and not s.name.startswith("__")
                ):
                    defined.setdefault(s.name, set()).add(f"{m.name}.{k.name}")
    found = []
    for module in TREE.in_packages(packages):
        scopes: list[tuple[str | None, ast.AST]] = [(None, module.tree)]
        while scopes:
            klass, node = scopes.pop()
            for child in ast.iter_child_nodes(node):
                inner = f"{module.name}.{child.name}" if isinstance(child, ast.ClassDef) else klass
                scopes.append((inner, child))
                if (
                    isinstance(child, ast.Attribute)
                    and child.attr in defined
                    and klass not in defined[child.attr]
                    and not (
                        isinstance(child.value, ast.Name) and child.value.id in ("self", "cls")
                    )
                ):
                    found.append(f"{module.name}:{child.lineno} {ast.unparse(child)}")
    return sorted(found)


def test_the_private_method_check_sees_a_callback() -> None:
    sample = ast.parse(
        "class Owner:\n    def _answered(self): ...\n"
        "class Request:\n    def answered(self):\n        self.owner._answered()\n"
    )
    module = structure._Module("sidecar.engines._sample", TREE.modules["sidecar"].path, sample)
    for node in sample.body:
        assert isinstance(node, ast.ClassDef)
        module.classes[node.name] = structure._read_class(module.name, node)
    TREE.modules[module.name] = module
    try:
        assert private_calls() == ["sidecar.engines._sample:5 self.owner._answered"]
    finally:
        del TREE.modules[module.name]


def test_no_caller_reaches_a_private_method_of_another_object() -> None:
    assert private_calls() == []
