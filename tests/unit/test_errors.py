"""One root for the sidecar's errors, as drawn in `sidecar.core.errors.SidecarError`'s docstring."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

from sidecar.config import ConfigError
from sidecar.core.errors import CommitFailed, DlqError, KafkaClientError, SidecarError
from sidecar.core.ledger import ExpiredAttempt, LedgerError, UnknownAttempt
from sidecar.core.wire import WireError
from sidecar.http.appclient import AppClientError, AppNotReachable, AppRequestFailed
from sidecar.kafka.dlq import DlqFatalError, DlqStartupError, DlqTxnAbortable, DlqTxnStuck
from sidecar.kafka.share import ShareGroupLimitUnsafe, ShareGroupsUnavailable
from sidecar.kafka.source import SourceError


def _errors_doc() -> str:
    """`SidecarError`'s docstring, read from the source (a compiled module keeps none)."""
    source = pathlib.Path(__file__).parents[2] / "sidecar" / "core" / "errors.py"
    (root,) = (
        node
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.ClassDef) and node.name == "SidecarError"
    )
    return ast.get_docstring(root) or ""


@pytest.mark.parametrize(
    ("error", "parent"),
    [
        (ConfigError, SidecarError),
        (WireError, SidecarError),
        (WireError, ValueError),  # still a ValueError for callers that catch that
        (LedgerError, SidecarError),
        (UnknownAttempt, LedgerError),
        (ExpiredAttempt, LedgerError),
        (AppClientError, SidecarError),
        (AppNotReachable, AppClientError),
        (AppRequestFailed, AppClientError),
        (KafkaClientError, SidecarError),
        (SourceError, KafkaClientError),
        (ShareGroupsUnavailable, SourceError),
        (ShareGroupLimitUnsafe, SourceError),
        (CommitFailed, KafkaClientError),
        (DlqError, SidecarError),
        (DlqStartupError, DlqError),
        (DlqFatalError, DlqError),
        (DlqTxnAbortable, DlqError),
        (DlqTxnStuck, DlqTxnAbortable),
    ],
)
def test_the_hierarchy_is_as_drawn(error: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(error, parent)


def test_the_drawing_names_every_class() -> None:
    drawing = _errors_doc()
    for name in [
        "ConfigError",
        "WireError",
        "LedgerError",
        "AppNotReachable",
        "AppRequestFailed",
        "SourceError",
        "ShareGroupsUnavailable",
        "ShareGroupLimitUnsafe",
        "CommitFailed",
        "DlqStartupError",
        "DlqFatalError",
        "DlqTxnAbortable",
        "DlqTxnStuck",
    ]:
        assert name in drawing, name


# -- the drawing against the package ---------------------------------------------------------

_TREE_LINE = re.compile(
    r"^(?P<indent>[ │├└─]*?)(?P<name>[A-Z]\w*) \.* .*?(?P<module>sidecar(?:\.\w+)+)\s*$"
)


def _drawn() -> dict[str, tuple[str | None, str]]:
    """Each class in `SidecarError`'s drawing: its parent in the drawing, and its module."""
    doc = _errors_doc()
    block = doc.split("::\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    drawn: dict[str, tuple[str | None, str]] = {}
    stack: list[str] = []
    for line in block.splitlines():
        match = _TREE_LINE.match(line.removeprefix("    "))
        assert match, f"a drawing line that does not read as 'name .... what  module': {line!r}"
        depth = len(match["indent"]) // 4
        del stack[depth:]
        assert len(stack) == depth, f"{match['name']} is indented past its parent"
        drawn[match["name"]] = (stack[-1] if stack else None, match["module"])
        stack.append(match["name"])
    return drawn


def _package_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class the package defines (its private signals included)."""
    import sidecar

    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(sidecar.__path__, "sidecar."):
        if info.name.endswith(".__main__") or ".demo.data" in info.name:
            continue  # __main__ runs the CLI; demo.data is the example app, copied out, not run
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
            ):
                assert obj.__name__ not in found, f"two exception classes named {obj.__name__}"
                found[obj.__name__] = obj
    return found


def test_the_drawing_is_the_package_s_error_tree() -> None:
    drawn = _drawn()
    classes = _package_exceptions()
    public = {name: cls for name, cls in classes.items() if name not in _signals(classes)}
    assert sorted(set(public) - set(drawn)) == [], "errors the drawing lacks"
    assert sorted(set(drawn) - set(public)) == [], "drawn errors the package no longer has"
    for name, (parent, module) in drawn.items():
        cls = public[name]
        assert cls.__module__ == module, f"{name} is defined in {cls.__module__}, drawn in {module}"
        ours = [base for base in cls.__bases__ if base.__module__.startswith("sidecar.")]
        if parent is None:
            assert cls is SidecarError
        else:
            assert [base.__name__ for base in ours] == [parent], f"{name}'s parent"


def _signals(classes: dict[str, type[BaseException]]) -> set[str]:
    """Control-flow signals: private ones, and the public ones the docstring names as signals."""
    doc = _errors_doc()
    named = doc[doc.index("Control-flow signals") : doc.index("Where third-party exceptions")]
    return {n for n in classes if n.startswith("_") or f"``{n}``" in named}


def test_control_flow_signals_stay_outside_the_tree_and_are_named() -> None:
    doc = _errors_doc()
    classes = _package_exceptions()
    for name in _signals(classes):
        assert not issubclass(classes[name], SidecarError), name
        assert f"``{name}``" in doc, f"{name} is not named among the control-flow signals"
