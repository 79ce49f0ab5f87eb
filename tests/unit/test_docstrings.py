"""Prose stays true: a docstring or comment that names a ``sidecar.`` module or attribute names one
that exists.

Names are resolved by importing them when the test runs (the longest importable module, then
attributes), so a module added or moved by any change is judged by the tree as it is.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import pathlib
import pkgutil
import re
import tokenize
from collections.abc import Iterator

import pytest

import sidecar
from sidecar.core import outcome

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = ROOT / "sidecar"
# A dotted name starting at the package (not part of a path, a file name or a longer word).
DOTTED = re.compile(r"(?<![\w\-/.$])sidecar(?:\.[A-Za-z_]\w*)+\*?")
# The sidecar's own error-class labels (``__dlq.errors.exception.class.name``): names, not code.
LABELS = {
    value
    for value in vars(outcome).values()
    if isinstance(value, str) and value.startswith("sidecar.")
}
LABELS |= {
    match[0]
    for path in PACKAGE.rglob("*.py")
    if not path.is_symlink()
    for match in re.finditer(r"(?<=[\"'])sidecar\.[A-Z]\w*(?=[\"'])", path.read_text())
}
LABEL_PATTERNS = [re.compile(r"sidecar\.HttpStatus\w*")]


def _prose(path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every string statement (docstrings) of a module."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value


def _line(start: int, text: str, index: int) -> int:
    return start + text.count("\n", 0, index)


def _resolves(dotted: str) -> bool:
    if dotted.endswith("*"):  # a family of modules, e.g. sidecar.ops.dlq.*: one must exist
        parent, _, prefix = dotted[:-1].rpartition(".")
        package = importlib.import_module(parent)
        return any(info.name.startswith(prefix) for info in pkgutil.iter_modules(package.__path__))
    parts = dotted.split(".")
    obj: object = None
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        rest = parts[end:]
        break
    else:
        return False
    for name in rest:
        try:
            obj = getattr(obj, name)
        except AttributeError:
            # An instance attribute of a class: declared in its annotations or slots.
            return isinstance(obj, type) and any(
                name in getattr(klass, "__annotations__", {})
                or name in getattr(klass, "__slots__", ())
                for klass in obj.__mro__
            )
    return True


def _mentions() -> list[tuple[str, int, str]]:
    found = []
    paths = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "bench").rglob("*.py"),
    ]
    for path in sorted(paths):
        for line, text in _prose(path):
            for match in DOTTED.finditer(text):
                name = match.group(0)
                if name in LABELS or any(p.fullmatch(name) for p in LABEL_PATTERNS):
                    continue
                found.append((str(path.relative_to(ROOT)), _line(line, text, match.start()), name))
    return found


def test_the_package_s_prose_names_something() -> None:
    assert len(_mentions()) > 50  # the scan finds what it is meant to judge
    assert sidecar.__name__ == "sidecar"


@pytest.mark.parametrize(
    "dotted", ["sidecar.dlq", "sidecar.core.ledger.Nope", "sidecar.ops.nope_*"]
)
def test_a_stale_name_does_not_resolve(dotted: str) -> None:
    assert not _resolves(dotted)


@pytest.mark.parametrize(
    "dotted",
    ["sidecar.core.ledger.PartitionLedger.answer", "sidecar.PartitionLedger", "sidecar.ops.dlq.*"],
)
def test_a_live_name_resolves(dotted: str) -> None:
    assert _resolves(dotted)


def test_every_sidecar_name_in_docstrings_and_comments_exists() -> None:
    stale = [f"{path}:{line}: {name}" for path, line, name in _mentions() if not _resolves(name)]
    assert stale == [], "\n".join(stale)


# -- backticked `module.Class.member` and `Class.member` names -----------------------------------

# A backticked dotted name (``x`` and :class:`x` included), optionally called: `a.b.c` or `a.b()`.
BACKTICKED = re.compile(r"`~?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
DOCS = ROOT / "docs"


def _members(node: ast.ClassDef) -> set[str]:
    """What a class defines: methods, class attributes and annotations, and ``self.x`` it assigns."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


class _Index:
    """The package's modules (by their last name) and classes (by name), read from the sources."""

    def __init__(self) -> None:
        self.modules: dict[str, list[dict[str, ast.ClassDef | None]]] = {}
        self.classes: dict[str, list[tuple[set[str], list[str]]]] = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            if path.is_symlink():
                continue
            tree = ast.parse(path.read_text())
            names = path.with_suffix("").relative_to(ROOT).parts
            short = names[-2] if names[-1] == "__init__" else names[-1]
            top: dict[str, ast.ClassDef | None] = {}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    top[node.name] = node
                    bases = [b.id if isinstance(b, ast.Name) else "" for b in node.bases]
                    bases += [b.attr for b in node.bases if isinstance(b, ast.Attribute)]
                    self.classes.setdefault(node.name, []).append((_members(node), bases))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    top[node.name] = None
                elif isinstance(node, ast.ImportFrom):
                    top.update({alias.asname or alias.name: None for alias in node.names})
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    top.update({t.id: None for t in targets if isinstance(t, ast.Name)})
            self.modules.setdefault(short, []).append(top)

    def has_member(self, klass: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
        for members, bases in self.classes.get(klass, []):
            if member in members:
                return True
            if any(
                base not in seen and self.has_member(base, member, seen | {klass}) for base in bases
            ):
                return True
        return False

    def judge(self, dotted: str) -> bool | None:
        """True or False for a name of the checked forms; None for any other dotted text."""
        parts = dotted.split(".")
        if parts[0] == "sidecar":
            return None  # judged by _resolves
        if parts[0] in self.classes and parts[0][0].isupper():
            # `Class.member`: a class of ours and something it (or a base of ours) defines.
            return len(parts) == 2 and self.has_member(parts[0], parts[1])
        if parts[0] in self.modules and len(parts) >= 3 and parts[1][:1].isupper():
            # `module.Class.member`: a module of ours defining that class, and the member.
            return any(
                parts[1] in top and self.has_member(parts[1], parts[2])
                for top in self.modules[parts[0]]
            )
        return None


@functools.cache
def _index() -> _Index:
    return _Index()


def _backticked() -> list[tuple[str, int, str]]:
    found = []
    paths = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "bench").rglob("*.py"),
    ]
    for path in sorted(p for p in paths if not p.is_symlink()):
        for line, text in _prose(path):
            for match in BACKTICKED.finditer(text):
                found.append(
                    (str(path.relative_to(ROOT)), _line(line, text, match.start()), match[1])
                )
    # docs/benchmarks.md is the record of past runs: it names the code of the commit it measured.
    for path in sorted(p for p in DOCS.glob("*.md") if p.name != "benchmarks.md"):
        text = path.read_text()
        for match in BACKTICKED.finditer(text):
            found.append((str(path.relative_to(ROOT)), _line(1, text, match.start()), match[1]))
    return found


# In docs, ``sidecar.kafka.*`` and ``sidecar.config.*`` are also Helm values keys: a name of those
# two is judged as code only when it names a class.
_CODE_ONLY = re.compile(r"sidecar\.(core|engines|ops|service|telemetry|injector|http)\b|.*\.[A-Z]")


def _stale_backticked() -> list[str]:
    index = _index()
    stale = []
    for path, line, name in _backticked():
        if path.startswith("docs/") and name.startswith("sidecar.") and not _CODE_ONLY.match(name):
            continue
        if name.startswith("sidecar."):
            labelled = name in LABELS or any(p.fullmatch(name) for p in LABEL_PATTERNS)
            if not labelled and not _resolves(name):
                stale.append(f"{path}:{line}: {name}")
        elif index.judge(name) is False:
            stale.append(f"{path}:{line}: {name}")
    return stale


@pytest.mark.parametrize(
    ("dotted", "verdict"),
    [
        ("PartitionLedger.answer", True),
        ("PartitionLedger.changes", True),  # assigned in __init__
        ("PartitionLedger.nope", False),
        ("pipeline.Pipeline.run", True),
        ("pipeline.Pipeline.nope", False),
        ("machine.PartitionLedger.answer", False),  # the class lives elsewhere
        ("app.max.in.flight", None),  # a configuration key, not a name of ours
    ],
)
def test_backticked_names_are_judged(dotted: str, verdict: bool | None) -> None:
    assert _index().judge(dotted) is verdict


def test_every_backticked_class_member_name_exists() -> None:
    assert len(_backticked()) > 100  # the scan finds what it is meant to judge
    stale = _stale_backticked()
    assert stale == [], "\n".join(stale)
