"""The engines' structure, read from their source (no import, no broker): objects own their state.

Checked over ``sidecar/engines`` and the module that wires them (``sidecar/service/daemon.py``):

- no class inherits from a class of the package defined in another file, except interfaces
  (``typing.Protocol``), the error tree and enums: a class split over files through base classes
  is one object whose parts cannot be read alone;
- no attribute of an object is assigned from more than one module: ``self.x = ...`` in a class and
  its bases, and, for plain data (a dataclass of the package), ``obj.x = ...`` from outside it;
- nothing is set on another object that is not plain data (``pool.after_round = ...``): whoever
  builds an object gives it its collaborators;
- no ``TYPE_CHECKING`` stubs in a class body (a part calling its siblings through ``self``), and no
  ``lambda: self.x`` (a collaborator reached before it exists).

The checks are on the syntax tree: a name is resolved through the module's imports, so a base
class or a dataclass is found wherever in ``sidecar`` it is defined.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sidecar"
SCANNED = [*sorted((PACKAGE / "engines").rglob("*.py")), PACKAGE / "service" / "daemon.py"]

# Bases a class may take from another file: interfaces, the error tree, enums, generics.
ALLOWED_BASE_NAMES = {
    "Protocol",
    "Generic",
    "Enum",
    "IntEnum",
    "StrEnum",
    "NamedTuple",
    "TypedDict",
}
# Attributes of objects outside the package that are set as their API (a trio cancel scope's).
FOREIGN_API_ATTRIBUTES = {"deadline"}


@dataclass
class ClassInfo:
    module: str
    name: str
    bases: list[ast.expr]
    node: ast.ClassDef
    is_dataclass: bool
    fields: set[str] = field(default_factory=set)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> dotted name of what it names (``from a.b import C`` -> ``a.b.C``)."""
    out: dict[str, str] = {}
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = alias.name
    return out


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


@dataclass
class Package:
    classes: dict[str, ClassInfo] = field(default_factory=dict)  # dotted name -> class
    imports: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> its imports
    trees: dict[str, ast.Module] = field(default_factory=dict)
    scanned: list[str] = field(default_factory=lambda: [module_name(p) for p in SCANNED])

    @classmethod
    def read(cls) -> Package:
        pkg = cls()
        for path in sorted(PACKAGE.rglob("*.py")):
            module = module_name(path)
            tree = ast.parse(path.read_text(), str(path))
            pkg.trees[module] = tree
            pkg.imports[module] = _imports(tree, module)
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    info = ClassInfo(module, node.name, node.bases, node, _is_dataclass(node))
                    if info.is_dataclass:
                        info.fields = {
                            s.target.id
                            for s in node.body
                            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                        }
                    pkg.classes[f"{module}.{node.name}"] = info
        return pkg

    def resolve(self, module: str, expr: ast.expr) -> str | None:
        """The dotted name a base-class expression names, when it can be read off the source."""
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        if isinstance(expr, ast.Name):
            if f"{module}.{expr.id}" in self.classes:
                return f"{module}.{expr.id}"
            return self.imports[module].get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute):
            inner = self.resolve(module, expr.value)
            return None if inner is None else f"{inner}.{expr.attr}"
        return None

    def _canonical(self, dotted: str) -> str:
        """A name re-exported by a package's ``__init__`` points at its definition when it can."""
        if dotted in self.classes:
            return dotted
        module, _, name = dotted.rpartition(".")
        seen = 0
        while module in self.imports and seen < 5:
            target = self.imports[module].get(name)
            if target is None:
                break
            if target in self.classes:
                return target
            module, _, name = target.rpartition(".")
            seen += 1
        return dotted

    def base_classes(self, info: ClassInfo) -> list[tuple[str, ClassInfo | None]]:
        out = []
        for base in info.bases:
            dotted = self.resolve(info.module, base)
            if dotted is None:
                continue
            dotted = self._canonical(dotted)
            out.append((dotted, self.classes.get(dotted)))
        return out

    def is_interface_or_error(self, dotted: str, info: ClassInfo | None, depth: int = 0) -> bool:
        name = dotted.rsplit(".", 1)[-1]
        if name in ALLOWED_BASE_NAMES or name.endswith(("Error", "Exception", "Warning")):
            return True
        if info is None or depth > 10:
            return dotted.startswith(("builtins.", "enum.", "typing."))
        return any(self.is_interface_or_error(d, i, depth + 1) for d, i in self.base_classes(info))

    def lineage(self, info: ClassInfo) -> list[ClassInfo]:
        """The class and its bases defined in the package (depth first)."""
        out, todo = [], [info]
        while todo:
            current = todo.pop()
            if current in out:
                continue
            out.append(current)
            todo.extend(i for _d, i in self.base_classes(current) if i is not None)
        return out


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        else:
            flat.append(t)
    return flat


def self_assignments(info: ClassInfo) -> set[str]:
    """Attributes a class's methods assign on ``self``."""
    out = set()
    for node in ast.walk(info.node):
        for t in _targets(node):
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                out.add(t.attr)
    return out


def cross_file_inheritance(pkg: Package) -> list[str]:
    out = []
    for module in pkg.scanned:
        for info in (c for c in pkg.classes.values() if c.module == module):
            for dotted, base in pkg.base_classes(info):
                if base is None or base.module == info.module:
                    continue
                if pkg.is_interface_or_error(dotted, base):
                    continue
                out.append(f"{module}.{info.name}({base.name} from {base.module})")
    return out


def attributes_from_several_modules(pkg: Package) -> list[str]:
    out = []
    dataclass_fields: dict[str, set[str]] = defaultdict(set)  # field -> dataclasses having it
    for dotted, info in pkg.classes.items():
        for f in info.fields:
            dataclass_fields[f].add(dotted)
    for module in pkg.scanned:
        for info in (c for c in pkg.classes.values() if c.module == module):
            where: dict[str, set[str]] = defaultdict(set)
            for part in pkg.lineage(info):
                for attr in self_assignments(part):
                    where[attr].add(part.module)
            out += [
                f"{module}.{info.name}.{attr} from {sorted(mods)}"
                for attr, mods in sorted(where.items())
                if len(mods) > 1
            ]
    # Plain data changed from outside: each field from one module.
    foreign: dict[str, set[str]] = defaultdict(set)
    for module, attr, _line in foreign_assignments(pkg):
        if attr in dataclass_fields:
            foreign[attr].add(module)
    for attr, mods in sorted(foreign.items()):
        if len(mods) > 1:
            owners = sorted(d.rsplit(".", 1)[-1] for d in dataclass_fields[attr])
            out.append(f"{'/'.join(owners)}.{attr} set from {sorted(mods)}")
    return out


def foreign_assignments(pkg: Package) -> list[tuple[str, str, int]]:
    """(module, attribute, line) of every ``x.attr = ...`` where ``x`` is not ``self``."""
    out = []
    for module in pkg.scanned:
        for node in ast.walk(pkg.trees[module]):
            for t in _targets(node):
                if not isinstance(t, ast.Attribute):
                    continue
                if isinstance(t.value, ast.Name) and t.value.id == "self":
                    continue
                out.append((module, t.attr, t.lineno))
    return out


def set_on_other_objects(pkg: Package) -> list[str]:
    data_fields = {f for c in pkg.classes.values() if c.is_dataclass for f in c.fields}
    return [
        f"{module}:{line} .{attr} = ..."
        for module, attr, line in foreign_assignments(pkg)
        if attr not in data_fields and attr not in FOREIGN_API_ATTRIBUTES
    ]


def self_stubs(pkg: Package) -> list[str]:
    out = []
    for module in pkg.scanned:
        for info in (c for c in pkg.classes.values() if c.module == module):
            for stmt in info.node.body:
                if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                    out.append(f"{module}.{info.name}:{stmt.lineno}")
        for node in ast.walk(pkg.trees[module]):
            if (
                isinstance(node, ast.Lambda)
                and not node.args.args
                and isinstance(node.body, ast.Attribute)
                and isinstance(node.body.value, ast.Name)
                and node.body.value.id == "self"
            ):
                out.append(f"{module}:{node.lineno} lambda: self.{node.body.attr}")
    return out


PKG = Package.read()


def test_the_scan_sees_the_engines() -> None:
    # The checks below would pass on nothing: make sure they read what they should.
    names = {c.name for c in PKG.classes.values() if c.module.startswith("sidecar.engines")}
    assert {"Pipeline", "ConsumerGroupEngine", "ShareGroupEngine", "Slot"} <= names
    assert len(PKG.scanned) >= 15


def test_no_class_inherits_from_a_class_in_another_file() -> None:
    assert cross_file_inheritance(PKG) == []


def test_no_attribute_is_assigned_from_more_than_one_module() -> None:
    assert attributes_from_several_modules(PKG) == []


def test_nothing_is_set_on_another_object_after_construction() -> None:
    assert set_on_other_objects(PKG) == []


def test_no_self_stubs_or_late_lambdas() -> None:
    assert self_stubs(PKG) == []


def test_the_checks_catch_what_they_are_for() -> None:
    # A mixin split over two files, a stub, a foreign assignment and a late lambda, read from text.
    sample = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from sidecar.engines.pipeline import Pipeline\n"
        "class Part(Pipeline):\n"
        "    if TYPE_CHECKING:\n"
        "        def other(self) -> None: ...\n"
        "    def go(self, pool):\n"
        "        self.config = 1\n"
        "        pool.after_round = self.go\n"
        "        return lambda: self.state\n"
    )
    pkg = Package(dict(PKG.classes), dict(PKG.imports), dict(PKG.trees))
    module = "sidecar.engines._sample"
    pkg.trees[module] = sample
    pkg.imports[module] = _imports(sample, module)
    node = sample.body[2]
    assert isinstance(node, ast.ClassDef)
    pkg.classes[f"{module}.Part"] = ClassInfo(module, "Part", node.bases, node, False)
    pkg.scanned = [module]
    assert cross_file_inheritance(pkg) == [f"{module}.Part(Pipeline from sidecar.engines.pipeline)"]
    assert any(".config from" in v for v in attributes_from_several_modules(pkg))
    assert set_on_other_objects(pkg) == [f"{module}:8 .after_round = ..."]
    assert self_stubs(pkg) == [f"{module}.Part:4", f"{module}:9 lambda: self.state"]


def test_the_pipeline_and_an_adapter_talk_through_narrow_interfaces() -> None:
    # One protocol each way (and the adapter's read-only view), at most 8 members each.
    info = PKG.classes["sidecar.engines.interfaces.Outlet"]
    sizes = {}
    for name in ("Outlet", "StateAdapter", "StateView"):
        node = PKG.classes[f"sidecar.engines.interfaces.{name}"].node
        sizes[name] = sum(
            isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign)) for s in node.body
        )
    assert info.module == "sidecar.engines.interfaces"
    assert all(1 <= n <= 8 for n in sizes.values()), sizes
