"""docs/architecture.md's module table lists every module under sidecar/, and only those."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = ROOT / "sidecar"
DOC = ROOT / "docs" / "architecture.md"
# A row of the table: | `core/errors.py` | what it owns |
ROW = re.compile(r"^\| `(?P<path>[\w/]+\.py)` \|", re.MULTILINE)


def _table() -> list[str]:
    text = DOC.read_text()
    return ROW.findall(text.split("## Every module", 1)[1])


def _modules() -> set[str]:
    # demo/data holds links to the example app, shipped as a file, not a module of ours.
    return {
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if not path.is_symlink()
    }


def test_the_table_is_read() -> None:
    assert len(_table()) > 100


def test_every_module_is_in_the_table() -> None:
    assert sorted(_modules() - set(_table())) == [], "modules docs/architecture.md lacks"


def test_the_table_names_only_modules_that_exist() -> None:
    assert sorted(set(_table()) - _modules()) == [], "rows for modules that do not exist"


def test_each_module_is_listed_once() -> None:
    rows = _table()
    assert sorted({row for row in rows if rows.count(row) > 1}) == []
