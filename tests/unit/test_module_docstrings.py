"""Module docstrings say what the module owns and what it must not import, in ten lines or fewer.

A story told once (the record's path) lives in docs/architecture.md; drawings, invariants and
reasons live beside the code they describe (a class's or a function's docstring, a comment).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = ROOT / "sidecar"
MAX_LINES = 10


def _modules() -> list[pathlib.Path]:
    # demo/data holds links to the example app and config, shipped as files, not modules of ours.
    return sorted(
        path for path in PACKAGE.rglob("*.py") if not path.is_symlink() and path.is_file()
    )


def _docstring_lines(path: pathlib.Path) -> int:
    """The lines the module docstring spans in the source (quotes included); 0 when it has none."""
    body = ast.parse(path.read_text()).body
    if not body:
        return 0
    first = body[0]
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return 0
    assert first.end_lineno is not None
    return first.end_lineno - first.lineno + 1


def test_the_scan_finds_the_package() -> None:
    assert len(_modules()) > 100


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_docstring_is_short(path: pathlib.Path) -> None:
    lines = _docstring_lines(path)
    assert lines > 0, "a module says what it owns"
    assert lines <= MAX_LINES, f"{lines} lines: keep what it owns and must not import"
