"""Objects own their state: no class spread over several files (`tests/structure.py` measures).

For each package of ``PACKAGES``: no class inherits from a class defined in another file (but
interfaces, errors, enums and named tuples), no attribute is assigned from more than one module,
and no module writes an attribute of another module's object through a name other than ``self``.
The plain records of ``structure.RECORDS`` (a ledger record's fields, its state going through the
transition table) are the one exception.  To hold another package to the same rules, add it here.
"""

from __future__ import annotations

import pathlib

import pytest

from tests import structure

PACKAGES = ["sidecar.core.ledger"]


@pytest.fixture(scope="module")
def tree() -> structure.Tree:
    return structure.Tree()


@pytest.mark.parametrize("package", PACKAGES)
def test_no_class_inherits_across_files(tree: structure.Tree, package: str) -> None:
    assert structure.cross_file_inheritance(tree, [package]) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_attribute_is_assigned_from_two_modules(tree: structure.Tree, package: str) -> None:
    assert structure.shared_attributes(tree, [package], structure.RECORDS) == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_sets_another_modules_object(tree: structure.Tree, package: str) -> None:
    assert structure.foreign_writes(tree, [package], structure.RECORDS) == []


def test_the_measures_see_a_tower(tmp_path: pathlib.Path) -> None:
    """The checks can fail: a two-file mixin tower and a write from outside are both found."""
    package = tmp_path / "sidecar" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "sidecar" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(
        "class Base:\n    def __init__(self):\n        self.count = 0\n"
        "class Error(Exception):\n    pass\n"
    )
    (package / "top.py").write_text(
        "from sidecar.pkg.base import Base, Error\n"
        "class Top(Base):\n    def bump(self):\n        self.count += 1\n"
        "class Failure(Error):\n    pass\n"
    )
    (package / "other.py").write_text("def poke(part):\n    part.count = 2\n")
    tree = structure.Tree(tmp_path)
    assert structure.cross_file_inheritance(tree, ["sidecar.pkg"]) == [
        "sidecar.pkg.top.Top <- sidecar.pkg.base.Base"
    ]
    assert structure.shared_attributes(tree, ["sidecar.pkg"]) == {
        "sidecar.pkg.top.Top.count": ["sidecar.pkg.base", "sidecar.pkg.other", "sidecar.pkg.top"]
    }
    assert structure.foreign_writes(tree, ["sidecar.pkg"]) == ["sidecar.pkg.other:2 part.count"]
