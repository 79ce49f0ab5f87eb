"""Objects own their state: the one ownership checker (`tests/structure.py`) over its packages.

Over ``structure.PACKAGES`` (``sidecar/core``, ``sidecar/engines``, ``sidecar/kafka`` and the
daemon that wires the engines): no class inherits from a class defined in another file (but
interfaces, errors, enums and named tuples), no attribute is written -- assigned, or its container
changed -- from more than one module, no module writes into another module's object, and no
class stubs its siblings. ``structure.RECORDS`` is the one exemption; ``KNOWN_INHERITANCE`` the
debt that may shrink, not grow.
"""

from __future__ import annotations

import pathlib

import pytest

from tests import structure


@pytest.fixture(scope="module")
def tree() -> structure.Tree:
    return structure.Tree()


def _known(name: str) -> bool:
    return any(name.startswith(k.split(" <- ")[0] + ".") for k in structure.KNOWN_INHERITANCE)


def test_the_scan_sees_the_packages(tree: structure.Tree) -> None:
    # The checks below would pass on nothing: make sure they read what they should.
    names = {k.name for m in tree.in_packages(structure.PACKAGES) for k in m.classes.values()}
    assert {"PartitionLedger", "Pipeline", "ConsumerGroupEngine", "PartitionState"} <= names
    assert {"KafkaSource", "ShareGroupEngine"} <= names
    assert "sidecar.service.daemon" in {m.name for m in tree.in_packages(structure.PACKAGES)}


def test_no_class_inherits_across_files(tree: structure.Tree) -> None:
    found = structure.cross_file_inheritance(tree)
    assert sorted(found) == sorted(structure.KNOWN_INHERITANCE)


def test_no_attribute_is_written_from_two_modules(tree: structure.Tree) -> None:
    shared = structure.shared_attributes(tree)
    assert {k: v for k, v in shared.items() if not _known(k)} == {}


def test_no_module_writes_into_another_modules_object(tree: structure.Tree) -> None:
    assert structure.foreign_writes(tree) == []


def test_no_self_stubs_or_late_lambdas(tree: structure.Tree) -> None:
    assert structure.self_stubs(tree) == []


def test_the_measures_see_a_tower(tmp_path: pathlib.Path) -> None:
    """The checks can fail: a mixin tower, writes and container changes from outside, a stub."""
    package = tmp_path / "sidecar" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "sidecar" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(
        "from dataclasses import dataclass, field\n"
        "class Base:\n    def __init__(self):\n        self.count = 0\n"
        "class Error(Exception):\n    pass\n"
        "@dataclass\nclass State:\n    live: dict[str, int] = field(default_factory=dict)\n"
        "    def track(self, k):\n        self.live[k] = 1\n"
    )
    (package / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from sidecar.pkg.base import Base, Error, State\n"
        "class Top(Base):\n    if TYPE_CHECKING:\n        def other(self) -> None: ...\n"
        "    def bump(self):\n        self.count += 1\n"
        "        return lambda: self.count\n"
        "class Failure(Error):\n    pass\n"
        "def forget(state: State):\n    state.live.pop('a', None)\n"
    )
    (package / "other.py").write_text(
        "from sidecar.pkg.base import State\n"
        "def poke(part):\n    part.count = 2\n"
        "def drop(state: State):\n    del state.live['a']\n"
        "def close(pool):\n    pool.items.clear()\n    pool.after_round = None\n"
    )
    tree = structure.Tree(tmp_path)
    packages = ["sidecar.pkg"]
    assert structure.cross_file_inheritance(tree, packages) == [
        "sidecar.pkg.top.Top <- sidecar.pkg.base.Base"
    ]
    assert structure.shared_attributes(tree, packages) == {
        "sidecar.pkg.base.State.live": ["sidecar.pkg.base", "sidecar.pkg.other", "sidecar.pkg.top"],
        "sidecar.pkg.top.Top.count": ["sidecar.pkg.base", "sidecar.pkg.other", "sidecar.pkg.top"],
    }
    assert structure.foreign_writes(tree, packages) == [
        "sidecar.pkg.other:3 part.count",
        "sidecar.pkg.other:8 pool.after_round",
    ]
    assert structure.self_stubs(tree, packages) == [
        "sidecar.pkg.top.Top:4",
        "sidecar.pkg.top:8 lambda: self.count",
    ]
