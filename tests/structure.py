"""Who owns an object's state, read from the source (AST only, nothing imported).

The one ownership checker, run by ``tests/unit/test_structure.py`` over ``PACKAGES``:

``cross_file_inheritance``
    classes that inherit from a class defined in another file of ``sidecar`` -- the mixin tower
    that spreads one object over several files.  Interfaces and the error tree may cross files:
    a base whose ancestry reaches ``Protocol``, ``Generic``, an exception, an enum,
    ``NamedTuple`` or ``TypedDict`` is not counted.

``shared_attributes``
    attributes written from more than one module.  A write is an assignment (``x.a = ...``,
    ``x.a += ...``, ``x.a: T = ...``) or a change of the container it holds (``x.a[k] = ...``,
    ``del x.a[k]``, ``x.a.append(...)``, ``.add``, ``.pop``, ``.clear``, ``.update``, ...).  An
    attribute belongs to the class whose methods write it through ``self`` or that declares it
    (a dataclass field, ``__slots__``); a write through any other name (``self.part.a = ...``,
    ``obj.a.pop(...)``) counts for every class of the packages that has an attribute of that
    name that the writing module defines or imports (every class having it when none does) --
    the write reaches into another object.

``foreign_writes``
    writes through a name other than ``self`` of an attribute that no class of the writing module
    has and that is not a field of plain data (a dataclass): one object setting another's state.

``self_stubs``
    ``TYPE_CHECKING`` stubs in a class body (a part calling its siblings through ``self``) and
    ``lambda: self.x`` (a collaborator reached before it exists).

``RECORDS`` names the one exemption: the ledger's record, whose fields go through the
transition table (``sidecar.core.ledger.machine``) by design.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).parents[1]
#: What the checker runs over (dotted names under ``sidecar``).
PACKAGES = ("sidecar.core", "sidecar.engines", "sidecar.kafka", "sidecar.service.daemon")
# Bases (by their last dotted component) that make a class an interface, an error or a value kind.
INTERFACE_ROOTS = frozenset(
    {
        "Protocol",
        "Generic",
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
#: Plain record classes whose fields their owners set by design (see ``shared_attributes``).
RECORDS: dict[str, set[str]] = {"sidecar.core.ledger.machine": {"LedgerRecord"}}
#: Attributes of objects outside the package that are set as their API: a trio cancel scope's
#: deadline, the fields of a ``logging.LogRecord`` a logging filter rewrites, and the schema text
#: of a schema registry client's ``RegisteredSchema``, completed in place.
FOREIGN_API_ATTRIBUTES = frozenset(
    {"deadline", "msg", "args", "levelno", "levelname", "__dict__", "schema_str"}
)
#: Known debt, listed so that it cannot grow: the transactional DLQ writer extends the plain one.
KNOWN_INHERITANCE = ("sidecar.kafka.dlq.txn.DlqWriter <- sidecar.kafka.dlq.writer.PlainDlqWriter",)
#: Methods that change the container they are called on.
MUTATORS = frozenset(
    {
        "add",
        "append",
        "appendleft",
        "clear",
        "discard",
        "extend",
        "extendleft",
        "insert",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "reverse",
        "setdefault",
        "sort",
        "update",
    }
)
_CONTAINERS = frozenset(
    {"dict", "list", "set", "deque", "OrderedDict", "defaultdict", "Counter", "bytearray"}
)


@dataclass
class _Class:
    module: str
    name: str
    node: ast.ClassDef
    bases: list[str] = field(default_factory=list)  # dotted names as written
    is_dataclass: bool = False
    declared: set[str] = field(default_factory=set)  # dataclass fields and __slots__
    containers: set[str] = field(default_factory=set)  # attributes that hold a container
    final: set[str] = field(default_factory=set)  # ``self.a: Final = ...``: set once, in __init__


@dataclass
class _Module:
    name: str
    path: pathlib.Path
    tree: ast.Module
    classes: dict[str, _Class] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module.Name" or module


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


def _root_name(node: ast.expr | None) -> str:
    """``dict`` of ``dict[str, int]``, ``collections.deque()``, ``field(default_factory=list)``."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return ""
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "default_factory":
                return _root_name(kw.value)
        return _root_name(node.func)
    if isinstance(node, (ast.Dict, ast.DictComp)):
        return "dict"
    if isinstance(node, (ast.List, ast.ListComp)):
        return "list"
    if isinstance(node, (ast.Set, ast.SetComp)):
        return "set"
    dotted = _dotted(node)
    return "" if dotted is None else dotted.rpartition(".")[2]


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if _root_name(target) == "dataclass":
            return True
    return False


def _is_frozen(node: ast.ClassDef) -> bool:
    return any(
        isinstance(d, ast.Call)
        and any(
            kw.arg == "frozen" and isinstance(kw.value, ast.Constant) and kw.value.value
            for kw in d.keywords
        )
        for d in node.decorator_list
    )


def _read_class(module: str, node: ast.ClassDef) -> _Class:
    bases = [d for d in (_dotted(b) for b in node.bases) if d is not None]
    klass = _Class(module, node.name, node, bases, _is_dataclass(node))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if klass.is_dataclass:
                klass.declared.add(stmt.target.id)
            if _root_name(stmt.annotation) in _CONTAINERS:
                klass.containers.add(stmt.target.id)
        elif (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets)
            and isinstance(stmt.value, (ast.Tuple, ast.List))
        ):
            klass.declared.update(
                e.value
                for e in stmt.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    if _is_frozen(node):
        klass.final |= klass.declared
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            kind = _root_name(sub.value) or (
                _root_name(sub.annotation) if isinstance(sub, ast.AnnAssign) else ""
            )
            if (
                isinstance(sub, ast.AnnAssign)
                and isinstance(sub.target, ast.Attribute)
                and _is_self(sub.target)
                and _root_name(sub.annotation) == "Final"
            ):
                klass.final.add(sub.target.attr)
            for t in targets:
                if _is_self(t) and kind in _CONTAINERS:
                    assert isinstance(t, ast.Attribute)
                    klass.containers.add(t.attr)
    return klass


def _is_self(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


class Tree:
    """Every module of ``sidecar`` parsed once: classes, their bases and attributes, imports."""

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
                    module.classes[node.name] = _read_class(module.name, node)
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
        for _ in range(5):  # a name re-exported by a package's __init__: follow it
            owner, _, name = full.rpartition(".")
            found = self.modules.get(owner)
            if found is None:
                return full
            if name in found.classes:
                return found.classes[name]
            nxt = found.imports.get(name)
            if nxt is None:
                return full
            full = nxt
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


def cross_file_inheritance(tree: Tree, packages: Iterable[str] = PACKAGES) -> list[str]:
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


@dataclass(frozen=True)
class Write:
    """One write of an attribute: ``x.attr = ...`` (``mutation`` False) or a change of the
    container ``x.attr`` holds (``mutation`` True: ``x.attr[k] = ...``, ``x.attr.pop()``)."""

    target: ast.Attribute
    mutation: bool

    @property
    def through_self(self) -> bool:
        return _is_self(self.target)


def _container_target(node: ast.expr) -> ast.Attribute | None:
    """``x.a`` of ``x.a[k]`` (and of ``x.a[k][j]``)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node if isinstance(node, ast.Attribute) else None


def writes(node: ast.AST) -> Iterator[Write]:
    """The attribute writes one syntax node makes (not its children)."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MUTATORS
        and isinstance(node.func.value, (ast.Attribute, ast.Subscript))
    ):
        inner = _container_target(node.func.value)
        if inner is not None:
            yield Write(inner, True)
        return
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        elif isinstance(target, ast.Attribute):
            if isinstance(node, ast.Delete):
                yield Write(target, True)
            else:
                yield Write(target, False)
        elif isinstance(target, ast.Subscript):
            inner = _container_target(target)
            if inner is not None:
                yield Write(inner, True)


def _self_writes(klass: _Class) -> set[str]:
    return {w.target.attr for n in ast.walk(klass.node) for w in writes(n) if w.through_self}


def _attributes(klass: _Class) -> set[str]:
    return _self_writes(klass) | klass.declared


def _exempt_fields(tree: Tree) -> set[str]:
    """The fields of the plain records ``RECORDS`` names."""
    names: set[str] = set()
    for module_name, class_names in RECORDS.items():
        module = tree.modules.get(module_name)
        if module is None:
            continue
        for class_name in class_names:
            names |= _attributes(module.classes[class_name])
    return names


def shared_attributes(tree: Tree, packages: Iterable[str] = PACKAGES) -> dict[str, list[str]]:
    """``"module.Class.attr"`` -> the modules writing it, for each one written from several."""
    packages = list(packages)
    skip = FOREIGN_API_ATTRIBUTES
    record_classes = {(m, c) for m, names in RECORDS.items() for c in names}
    classes = [k for m in tree.in_packages(packages) for k in m.classes.values()]
    # An object is an instance of a class no other class extends: a base's attributes are counted
    # once, with the classes built on it.
    extended = {
        (a.module, a.name) for k in classes for a in tree.ancestors(k) if isinstance(a, _Class)
    }
    classes = [k for k in classes if (k.module, k.name) not in extended]
    writers: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    owned_by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)
    containers_by_name: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for klass in classes:
        key = (klass.module, klass.name)
        family = [klass] + [a for a in tree.ancestors(klass) if isinstance(a, _Class)]
        attrs: set[str] = set()
        for member in family:
            attrs |= member.declared
            for attr in _self_writes(member):
                writers[key][attr].add(member.module)
                attrs.add(attr)
            for attr in member.containers:
                containers_by_name[attr].add(key)
        for attr in attrs:
            writers[key].setdefault(attr, set())
            if not any(attr in m.final for m in family):  # Final: no write reaches it
                owned_by_name[attr].append(key)
    imported = {m.name: _imported_classes(tree, m) for m in tree.in_packages(packages)}
    # Writes through another name reach into the objects that have such an attribute (a
    # container's mutation: those whose attribute of that name holds a container).
    for module in tree.in_packages(packages):
        for node in ast.walk(module.tree):
            for w in writes(node):
                if w.through_self or w.target.attr in skip:
                    continue
                attr = w.target.attr
                for owner in _nearest(module, owned_by_name.get(attr, []), imported[module.name]):
                    if isinstance(node, ast.Call) and owner not in containers_by_name[attr]:
                        continue  # a method of the same name on an object that is no container
                    writers[owner][attr].add(module.name)
    out: dict[str, list[str]] = {}
    for (module_name, class_name), attrs_ in writers.items():
        if (module_name, class_name) in record_classes:
            continue  # its fields go through the transition table by design
        for attr, modules in attrs_.items():
            if len(modules) > 1:
                out[f"{module_name}.{class_name}.{attr}"] = sorted(modules)
    return dict(sorted(out.items()))


def _imported_classes(tree: Tree, module: _Module) -> set[tuple[str, str]]:
    """The classes a module defines or imports by name."""
    out = {(module.name, c) for c in module.classes}
    for local in module.imports:
        found = tree.resolve(module, local)
        if isinstance(found, _Class):
            out.add((found.module, found.name))
    return out


def _nearest(
    module: _Module, owners: list[tuple[str, str]], known: set[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Of the classes having an attribute, those the writing module defines, else those it
    imports, else all: the objects a write through another name may reach."""
    here = [o for o in owners if o[0] == module.name]
    if here:
        return here
    return [o for o in owners if o in known] or owners


def foreign_writes(tree: Tree, packages: Iterable[str] = PACKAGES) -> list[str]:
    """Writes through a name other than ``self`` (``part.a = ...``, ``part.a.pop()``) of an
    attribute that no class of the writing module has and that is no field of plain data (a
    dataclass): one object setting another's state from outside."""
    packages = list(packages)
    plain = {
        f
        for m in tree.in_packages(packages)
        for k in m.classes.values()
        if k.is_dataclass
        for f in k.declared
    }
    containers = {
        a for m in tree.in_packages(packages) for k in m.classes.values() for a in k.containers
    }
    skip = _exempt_fields(tree) | FOREIGN_API_ATTRIBUTES | plain
    found = []
    for module in tree.in_packages(packages):
        local = {a for k in module.classes.values() for a in _attributes(k)}
        for node in ast.walk(module.tree):
            for w in writes(node):
                attr = w.target.attr
                if w.through_self or attr in skip or attr in local:
                    continue
                if isinstance(node, ast.Call) and attr not in containers:
                    continue  # a method call on an object, not a container's mutation
                found.append(f"{module.name}:{w.target.lineno} {ast.unparse(w.target)}")
    return found


def self_stubs(tree: Tree, packages: Iterable[str] = PACKAGES) -> list[str]:
    """``TYPE_CHECKING`` blocks in a class body and ``lambda: self.x``."""
    out = []
    for module in tree.in_packages(packages):
        for klass in module.classes.values():
            for stmt in klass.node.body:
                if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                    out.append(f"{module.name}.{klass.name}:{stmt.lineno}")
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Lambda)
                and not node.args.args
                and isinstance(node.body, ast.Attribute)
                and _is_self(node.body)
            ):
                out.append(f"{module.name}:{node.lineno} lambda: self.{node.body.attr}")
    return out


def main() -> None:
    """Print the measures for the packages given (default: ``PACKAGES``)."""
    import sys

    packages = sys.argv[1:] or list(PACKAGES)
    tree = Tree()
    for title, found in (
        ("classes inheriting across files", cross_file_inheritance(tree, packages)),
        ("attributes written from more than one module", shared_attributes(tree, packages)),
        ("writes into another module's object", foreign_writes(tree, packages)),
        ("self stubs and late lambdas", self_stubs(tree, packages)),
    ):
        print(f"{title}: {len(found)}")
        for line in found:
            print("   ", line if isinstance(found, list) else f"{line}: {', '.join(found[line])}")


if __name__ == "__main__":
    main()
