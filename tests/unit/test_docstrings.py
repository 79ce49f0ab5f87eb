"""Prose stays true: a docstring or comment that names a ``sidecar.`` module or attribute names one
that exists.

Names are resolved by importing them when the test runs (the longest importable module, then
attributes), so a module added or moved by any change is judged by the tree as it is.
"""

from __future__ import annotations

import ast
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
