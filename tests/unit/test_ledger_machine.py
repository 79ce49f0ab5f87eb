"""The ledger's state machine: one table, one function that applies it, nothing else changes state."""

from __future__ import annotations

import ast
import pathlib

import pytest

from sidecar.core.ledger import TRANSITIONS, Event, IllegalTransition, RecordState
from sidecar.core.ledger.machine import LedgerRecord, enter

LEDGER = pathlib.Path(__file__).parents[2] / "sidecar" / "core" / "ledger"


@pytest.mark.parametrize("state", list(RecordState))
@pytest.mark.parametrize("event", list(Event))
def test_enter_applies_the_table_or_refuses_and_changes_nothing(
    state: RecordState, event: Event
) -> None:
    record = LedgerRecord(7, b"k", None, 0, None, 0, 0)
    record.state = state
    if (state, event) in TRANSITIONS:
        enter(record, event)
        assert record.state is TRANSITIONS[state, event]
    else:
        with pytest.raises(IllegalTransition):
            enter(record, event)
        assert record.state is state


def test_done_states_have_no_way_out() -> None:
    done = {RecordState.ACKNOWLEDGED, RecordState.ARCHIVED}
    assert not [key for key in TRANSITIONS if key[0] in done]
    # Every state is reachable from AVAILABLE.
    reached = {RecordState.AVAILABLE}
    while True:
        more = {after for (before, _), after in TRANSITIONS.items() if before in reached}
        if more <= reached:
            break
        reached |= more
    assert reached == set(RecordState)


def test_only_the_machine_assigns_a_record_state() -> None:
    offenders = []
    for path in sorted(LEDGER.glob("*.py")):
        tree = ast.parse(path.read_text())
        # AnswerResult's constructor stores the state it reports: a value, not a record's state.
        reported = [
            n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AnswerResult"
        ]
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 0)
            if any(r.lineno <= line <= (r.end_lineno or r.lineno) for r in reported):
                continue
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state":
                        offenders.append(f"{path.name}:{node.lineno}")
    # The machine's enter, and LedgerRecord's constructor (every record starts AVAILABLE).
    assert offenders == [f"machine.py:{n}" for n in _machine_assignments()]


def _machine_assignments() -> list[int]:
    source = (LEDGER / "machine.py").read_text().splitlines()
    return [
        i
        for i, line in enumerate(source, 1)
        if line.strip().startswith(("record.state =", "self.state ="))
    ]


def test_the_hot_path_values_compare_hash_and_print_like_dataclasses() -> None:
    from sidecar.core.ledger import AnswerResult, ArchiveReason, Attempt

    attempt = Attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
    same = Attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
    assert attempt == same
    assert hash(attempt) == hash(same)
    assert attempt != Attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "other")
    assert attempt != ("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
    assert repr(attempt) == (
        "Attempt(topic='t', partition=1, offset=2, attempt_id='t/1/2/0.0', delivery_count=3, "
        "lock_deadline_ms=4, key=b'k', item='item')"
    )
    result = AnswerResult("id", 2, None, RecordState.ARCHIVING, 5, reason=ArchiveReason.REJECTED)
    assert result == AnswerResult(
        "id", 2, None, RecordState.ARCHIVING, 5, None, None, ArchiveReason.REJECTED
    )
    assert result != AnswerResult("id", 2, None, RecordState.ARCHIVING, 5)
    assert result.retry_at_ms is None
    assert result.reason is ArchiveReason.REJECTED


def test_the_hot_path_values_are_immutable() -> None:
    """Every attribute of Attempt and AnswerResult is a ``Final`` set in ``__init__`` from its own
    parameter, in ``_FIELDS`` order (mypy --strict refuses an assignment); compiled, the
    attributes are also read-only at run time."""
    from sidecar.core import compiled
    from sidecar.core.ledger import AnswerResult, Attempt

    tree = ast.parse((LEDGER / "values.py").read_text())
    for cls in (Attempt, AnswerResult):
        (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        (init,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        params = [arg.arg for arg in init.args.args[1:]]
        assert params == list(cls._FIELDS)
        finals = []
        for node in init.body:
            assert isinstance(node, ast.AnnAssign), ast.unparse(node)
            assert ast.unparse(node.annotation) == "Final", ast.unparse(node)
            assert isinstance(node.target, ast.Attribute)
            assert ast.unparse(node.value) == node.target.attr  # type: ignore[arg-type]
            finals.append(node.target.attr)
        assert finals == params
    if compiled():
        attempt = Attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
        with pytest.raises(AttributeError):
            attempt.offset = 9  # type: ignore[misc]
