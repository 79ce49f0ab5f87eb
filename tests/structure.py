"""Who owns an object's state, read from the source (AST only, nothing imported).

Two measures, over a list of packages (dotted names under ``sidecar``):

``cross_file_inheritance``
    classes that inherit from a class defined in another file of ``sidecar`` -- the mixin tower
    that spreads one object over several files.  Interfaces and the error tree may cross files:
    a base whose ancestry reaches ``Protocol``, an exception, an enum, ``NamedTuple`` or
    ``TypedDict`` is not counted.

``shared_attributes``
    attributes assigned (``x.a = ...``, ``x.a += ...``, ``x.a: T = ...``) from more than one module.
    An attribute belongs to the class whose methods assign it through ``self`` (with its in-package
    ancestors: an inherited attribute assigned in a subclass's file counts for both files), and a
    write through any other name (``self.part.a = ...``, ``obj.a = ...``) counts for every class of
    the packages that has an attribute of that name -- the write reaches into another object.
    ``records`` names plain record classes (``{"module": {"Class", ...}}``) whose fields their
    owners set by design; their fields are left out (`record_fields` lists them).

Used by ``tests/unit/test_structure.py``; extend its ``PACKAGES`` to hold another package to the
same rules.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).parents[1]
# Bases (by their last dotted component) that make a class an interface, an error or a value kind.
INTERFACE_ROOTS = frozenset(
    {
        "Protocol",
        "BaseException",
        "Exception",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "IntFlag",
        "NamedTuple",
        "TypedDict",
    }
)


@dataclass
class _Class:
    module: str
    name: str
    node: ast.ClassDef
    bases: list[str] = field(default_factory=list)  # dotted names as written


@dataclass
class _Module:
    name: str
    path: pathlib.Path
    tree: ast.Module
    classes: dict[str, _Class] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module.Name" or module


#: Plain record classes whose fields their owners set by design (see ``shared_attributes``).
RECORDS: dict[str, set[str]] = {"sidecar.core.ledger.machine": {"LedgerRecord"}}


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    if isinstance(node, ast.Subscript):  # Generic[T], Protocol[T]
        return _dotted(node.value)
    return None


class Tree:
    """Every module of ``sidecar`` parsed once: classes, their bases, imports."""

    def __init__(self, root: pathlib.Path = ROOT) -> None:
        self.modules: dict[str, _Module] = {}
        for path in sorted((root / "sidecar").rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            module = _Module(_module_name(path, root), path, tree)
            package = module.name if path.name == "__init__.py" else module.name.rpartition(".")[0]
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        anchor = package.split(".")
                        anchor = anchor[: len(anchor) - node.level + 1]
                        base = ".".join([*anchor, base] if base else anchor)
                    for alias in node.names:
                        module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        module.imports[alias.asname or alias.name.split(".")[0]] = (
                            alias.name if alias.asname else alias.name.split(".")[0]
                        )
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    bases = [d for d in (_dotted(b) for b in node.bases) if d is not None]
                    module.classes[node.name] = _Class(module.name, node.name, node, bases)
            self.modules[module.name] = module

    def in_packages(self, packages: Iterable[str]) -> Iterator[_Module]:
        prefixes = tuple(packages)
        for name, module in self.modules.items():
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                yield module

    def resolve(self, module: _Module, dotted: str) -> _Class | str:
        """The class a base names: an in-package class, or its dotted name outside the package."""
        head, _, rest = dotted.partition(".")
        if not rest and head in module.classes:
            return module.classes[head]
        target = module.imports.get(head)
        if target is None:
            return dotted
        full = f"{target}.{rest}" if rest else target
        owner, _, name = full.rpartition(".")
        found = self.modules.get(owner)
        if found is not None and name in found.classes:
            return found.classes[name]
        return full

    def ancestors(self, klass: _Class) -> Iterator[_Class | str]:
        """The bases of ``klass``, transitively (in-package classes, then outside names)."""
        seen: set[tuple[str, str]] = set()
        stack: list[_Class | str] = [klass]
        while stack:
            current = stack.pop()
            if isinstance(current, str):
                yield current
                continue
            key = (current.module, current.name)
            if key in seen:
                continue
            seen.add(key)
            if current is not klass:
                yield current
            module = self.modules[current.module]
            stack.extend(self.resolve(module, base) for base in current.bases)

    def is_interface(self, klass: _Class) -> bool:
        """Its ancestry reaches a Protocol, an exception, an enum, a NamedTuple or a TypedDict."""
        for ancestor in [klass, *self.ancestors(klass)]:
            last = (ancestor if isinstance(ancestor, str) else ancestor.name).rpartition(".")[2]
            if last in INTERFACE_ROOTS or last.endswith(("Error", "Exception", "Warning")):
                return True
        return False


def cross_file_inheritance(tree: Tree, packages: Iterable[str]) -> list[str]:
    """``module.Class <- other_module.Base`` for every class of ``packages`` inheriting across files."""
    found = []
    for module in tree.in_packages(packages):
        for klass in module.classes.values():
            for base in klass.bases:
                target = tree.resolve(module, base)
                if (
                    isinstance(target, _Class)
                    and target.module != module.name
                    and not tree.is_interface(target)
                ):
                    found.append(f"{module.name}.{klass.name} <- {target.module}.{target.name}")
    return found


def _assigned(node: ast.AST) -> Iterator[ast.Attribute]:
    """The attribute targets an assignment statement writes."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Attribute):
            yield target


def _self_attributes(klass: _Class) -> dict[str, ast.Attribute]:
    out: dict[str, ast.Attribute] = {}
    for node in ast.walk(klass.node):
        for target in _assigned(node):
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                out.setdefault(target.attr, target)
    return out


def record_fields(tree: Tree, records: dict[str, set[str]]) -> set[str]:
    """The field names of the plain record classes ``records`` names (slots and ``self`` writes)."""
    names: set[str] = set()
    for module_name, class_names in records.items():
        module = tree.modules[module_name]
        for class_name in class_names:
            klass = module.classes[class_name]
            names.update(_self_attributes(klass))
            for node in klass.node.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
                ):
                    value = node.value
                    if isinstance(value, (ast.Tuple, ast.List)):
                        names.update(
                            e.value
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
    return names


def shared_attributes(
    tree: Tree, packages: Iterable[str], records: dict[str, set[str]] | None = None
) -> dict[str, list[str]]:
    """``"module.Class.attr"`` -> the modules assigning it, for each one assigned from several."""
    packages = list(packages)
    skip = record_fields(tree, records or {})
    record_classes = {(m, c) for m, names in (records or {}).items() for c in names}
    classes = [k for m in tree.in_packages(packages) for k in m.classes.values()]
    # An object is an instance of a class no other class extends: a base's attributes are counted
    # once, with the classes built on it.
    extended = {
        (a.module, a.name) for k in classes for a in tree.ancestors(k) if isinstance(a, _Class)
    }
    classes = [k for k in classes if (k.module, k.name) not in extended]
    # Which modules write each attribute of a class through self (its own or inherited methods).
    writers: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    owned_by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for klass in classes:
        if (klass.module, klass.name) in record_classes:
            continue
        family = [klass] + [a for a in tree.ancestors(klass) if isinstance(a, _Class)]
        for member in family:
            for attr in _self_attributes(member):
                writers[klass.module, klass.name][attr].add(member.module)
        for attr in writers[klass.module, klass.name]:
            owned_by_name[attr].append((klass.module, klass.name))
    # Writes through another name reach into the objects that have such an attribute.
    for module in tree.in_packages(packages):
        for node in ast.walk(module.tree):
            for target in _assigned(node):
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    continue
                if target.attr in skip:
                    continue
                for owner in owned_by_name.get(target.attr, ()):
                    writers[owner][target.attr].add(module.name)
    out: dict[str, list[str]] = {}
    for (module_name, class_name), attrs in writers.items():
        for attr, modules in attrs.items():
            if len(modules) > 1:
                out[f"{module_name}.{class_name}.{attr}"] = sorted(modules)
    return dict(sorted(out.items()))


def foreign_writes(
    tree: Tree, packages: Iterable[str], records: dict[str, set[str]] | None = None
) -> list[str]:
    """Writes through a name other than ``self`` (``part.a = ...``) of an attribute that no class
    of the writing module has: one object setting another's state from outside."""
    skip = record_fields(tree, records or {})
    found = []
    for module in tree.in_packages(packages):
        local = {a for k in module.classes.values() for a in _self_attributes(k)}
        for node in ast.walk(module.tree):
            for target in _assigned(node):
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    continue
                if target.attr in skip or target.attr in local:
                    continue
                found.append(f"{module.name}:{target.lineno} {ast.unparse(target)}")
    return found


def record_field_writers(tree: Tree, records: dict[str, set[str]]) -> dict[str, list[str]]:
    """``field`` -> the modules assigning it, for each field of the plain records ``records`` names
    that is assigned from several modules (the measure `shared_attributes` leaves out)."""
    fields = record_fields(tree, records)
    packages = {m.rpartition(".")[0] for m in records}
    writers: dict[str, set[str]] = defaultdict(set)
    for module in tree.in_packages(packages):
        for node in ast.walk(module.tree):
            for target in _assigned(node):
                through_self = isinstance(target.value, ast.Name) and target.value.id == "self"
                if target.attr in fields and (not through_self or module.name in records):
                    writers[target.attr].add(module.name)
    return {f: sorted(m) for f, m in sorted(writers.items()) if len(m) > 1}


def main() -> None:
    """Print both measures for the packages given (default: the ledger)."""
    import sys

    packages = sys.argv[1:] or ["sidecar.core.ledger"]
    tree = Tree()
    records = {m: c for m, c in RECORDS.items() if any(m.startswith(p) for p in packages)}
    crossing = cross_file_inheritance(tree, packages)
    shared = shared_attributes(tree, packages, records)
    print(f"classes inheriting across files: {len(crossing)}")
    for line in crossing:
        print("   ", line)
    print(f"attributes assigned from more than one module: {len(shared)}")
    print(
        f"    (the fields of {records} left out: {len(record_field_writers(tree, records))} of them are"
    )
    print("    assigned from more than one module)")
    for name, modules in shared.items():
        print(f"    {name}: {', '.join(modules)}")


if __name__ == "__main__":
    main()
