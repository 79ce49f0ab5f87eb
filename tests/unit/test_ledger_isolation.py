"""The isolation pass's table (`sidecar.core.ledger.machine.ISOLATION`): one table, one function
that applies it (``enter_pass``), an illegal move refused with the pass unchanged, and nothing else
in the package assigns a pass's phase, the record it isolates or the point its outcome waits for."""

from __future__ import annotations

import ast
import pathlib

import pytest

from sidecar.core.ledger import IllegalTransition, IsolationPhase
from sidecar.core.ledger.machine import (
    ISOLATION,
    IsolationPass,
    LedgerRecord,
    PassEvent,
    enter_pass,
)

SIDECAR = pathlib.Path(__file__).parents[2] / "sidecar"
PASS_FIELDS = {"phase", "isolating", "unflushed_after"}
STORED = {
    IsolationPhase.NONE,
    IsolationPhase.CHARGED,
    IsolationPhase.IN_FLIGHT,
    IsolationPhase.SETTLING,
}


def _record(offset: int = 7) -> LedgerRecord:
    return LedgerRecord(offset, b"k", None, 1, None, 0, 0)


def _pass(phase: IsolationPhase, unflushed_after: int | None = None) -> IsolationPass:
    """A pass in ``phase``, reached through the table (never by assignment)."""
    isolation = IsolationPass()
    record = _record()
    if phase is IsolationPhase.SETTLING or unflushed_after is not None:
        enter_pass(isolation, PassEvent.CHARGE, record)
        enter_pass(isolation, PassEvent.HAND_OUT)
        enter_pass(isolation, PassEvent.SETTLE, points=unflushed_after or 0)
    if phase in (IsolationPhase.CHARGED, IsolationPhase.IN_FLIGHT):
        enter_pass(isolation, PassEvent.CHARGE, record)
    if phase is IsolationPhase.IN_FLIGHT:
        enter_pass(isolation, PassEvent.HAND_OUT)
    assert isolation.phase is phase
    return isolation


def _fields(isolation: IsolationPass) -> tuple[object, ...]:
    return (isolation.phase, isolation.isolating, isolation.unflushed_after)


def test_the_table_is_the_one_drawn_in_the_machine_docstring() -> None:
    n, c, f, s = (
        IsolationPhase.NONE,
        IsolationPhase.CHARGED,
        IsolationPhase.IN_FLIGHT,
        IsolationPhase.SETTLING,
    )
    assert dict(ISOLATION) == {
        (n, PassEvent.CHARGE): c,
        (s, PassEvent.CHARGE): c,
        (c, PassEvent.HAND_OUT): f,
        (c, PassEvent.FLUSH): c,
        (c, PassEvent.UNCHARGE): n,
        (f, PassEvent.SETTLE): s,
        (f, PassEvent.TAKE_BACK): s,
        (f, PassEvent.FENCE): c,
        (s, PassEvent.FLUSH): n,
    }
    # READY and WAITING are told apart by the suspects, never stored.
    assert {phase for key in ISOLATION for phase in (key[0], ISOLATION[key])} == STORED


@pytest.mark.parametrize("phase", sorted(STORED, key=lambda p: p.value))
@pytest.mark.parametrize("event", list(PassEvent))
def test_enter_pass_applies_the_table_or_refuses_and_changes_nothing(
    phase: IsolationPhase, event: PassEvent
) -> None:
    isolation = _pass(phase)
    before = _fields(isolation)
    record = _record(9)
    if (phase, event) in ISOLATION:
        enter_pass(isolation, event, record, points=3)
        assert isolation.phase is ISOLATION[phase, event]
        if event is PassEvent.CHARGE:
            assert isolation.isolating is record
        if event in (PassEvent.SETTLE, PassEvent.TAKE_BACK):
            assert (isolation.isolating, isolation.unflushed_after) == (None, 3)
        if event in (PassEvent.FLUSH,):
            assert isolation.unflushed_after is None
        # Charged or in flight exactly when a record is isolated.
        in_pass = isolation.phase in (IsolationPhase.CHARGED, IsolationPhase.IN_FLIGHT)
        assert (isolation.isolating is not None) == in_pass
    else:
        with pytest.raises(IllegalTransition):
            enter_pass(isolation, event, record, points=3)
        assert _fields(isolation) == before


def test_nothing_goes_out_while_an_earlier_outcome_waits_for_its_commit() -> None:
    isolation = _pass(IsolationPhase.SETTLING, unflushed_after=4)
    enter_pass(isolation, PassEvent.CHARGE, _record(8))  # the next one charged meanwhile
    before = _fields(isolation)
    with pytest.raises(IllegalTransition):
        enter_pass(isolation, PassEvent.HAND_OUT)
    assert _fields(isolation) == before
    enter_pass(isolation, PassEvent.FLUSH)  # its commit is confirmed
    enter_pass(isolation, PassEvent.HAND_OUT)
    assert isolation.phase is IsolationPhase.IN_FLIGHT


def test_an_uncharge_while_an_outcome_waits_leaves_the_pass_settling() -> None:
    isolation = _pass(IsolationPhase.SETTLING, unflushed_after=4)
    enter_pass(isolation, PassEvent.CHARGE, _record(8))
    enter_pass(isolation, PassEvent.UNCHARGE)
    assert _fields(isolation) == (IsolationPhase.SETTLING, None, 4)


def test_a_charge_needs_its_record() -> None:
    isolation = IsolationPass()
    with pytest.raises(IllegalTransition):
        enter_pass(isolation, PassEvent.CHARGE)
    assert _fields(isolation) == (IsolationPhase.NONE, None, None)


def test_only_enter_pass_assigns_the_pass() -> None:
    """Every write of a pass's fields, anywhere in the package, is in ``enter_pass`` or the
    pass's constructor."""
    allowed = {"enter_pass", "__init__"}
    offenders = []
    for path in sorted(SIDECAR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in PASS_FIELDS:
                        where = f"{path.relative_to(SIDECAR)}:{function.name}"
                        if not (path.name == "machine.py" and function.name in allowed):
                            offenders.append(f"{where}:{node.lineno}")
    assert offenders == []


def test_a_pass_starts_with_nothing_isolated() -> None:
    """``IsolationPass`` is the machine's, and a new one is between isolations, nothing waiting."""
    assert IsolationPass.__module__ == "sidecar.core.ledger.machine"
    assert _fields(IsolationPass()) == (IsolationPhase.NONE, None, None)
