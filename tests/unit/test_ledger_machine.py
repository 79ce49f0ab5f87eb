"""The ledger's state machine: one table, one function that applies it, nothing else changes state."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

from sidecar.core.ledger import TRANSITIONS, Event, IllegalTransition, RecordState
from sidecar.core.ledger.machine import _Record, enter

LEDGER = pathlib.Path(__file__).parents[2] / "sidecar" / "core" / "ledger"


@pytest.mark.parametrize("state", list(RecordState))
@pytest.mark.parametrize("event", list(Event))
def test_enter_applies_the_table_or_refuses_and_changes_nothing(
    state: RecordState, event: Event
) -> None:
    record = _Record(7, b"k", None, 0, None, 0, 0)
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
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state":
                        offenders.append(f"{path.name}:{node.lineno}")
    # The machine's enter, and _Record's constructor (every record starts AVAILABLE).
    assert offenders == [f"machine.py:{n}" for n in _machine_assignments()]


def _machine_assignments() -> list[int]:
    source = (LEDGER / "machine.py").read_text().splitlines()
    return [
        i
        for i, line in enumerate(source, 1)
        if line.strip().startswith(("record.state =", "self.state ="))
    ]


def test_the_fast_builders_make_the_same_frozen_values() -> None:
    from sidecar.core.ledger import AnswerResult, ArchiveReason, Attempt
    from sidecar.core.ledger.values import _attempt, _result

    attempt = _attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
    expected = Attempt("t", 1, 2, "t/1/2/0.0", 3, 4, b"k", "item")
    assert type(attempt) is Attempt
    assert attempt == expected
    assert hash(attempt) == hash(expected)
    result = _result("id", 2, None, RecordState.ARCHIVING, 5, reason=ArchiveReason.REJECTED)
    assert type(result) is AnswerResult
    assert result == AnswerResult(
        "id", 2, None, RecordState.ARCHIVING, 5, reason=ArchiveReason.REJECTED
    )
    for value in (attempt, result):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.offset = 9  # type: ignore[misc]
