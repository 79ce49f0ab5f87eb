"""The record state machine: every state change of a ledger record is made here (sans-IO).

Like h11's ``_state.py``: the record's transitions are one table, :data:`TRANSITIONS`, applied by
:func:`enter` alone (the table drawn in its docstring); the isolation pass's moves are the second
table, :data:`ISOLATION`, applied by :func:`enter_pass` alone.  An event a table lacks raises
:class:`IllegalTransition` and leaves the record (or the pass) unchanged.

Imports the standard library, `sidecar.core.outcome` and the ledger's values only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.core.ledger.values import IllegalTransition, IsolationPhase, RecordState
from sidecar.core.outcome import ArchiveReason, ErrorInfo

__all__ = ["ISOLATION", "TRANSITIONS", "Event", "IsolationPass", "PassEvent", "enter", "enter_pass"]


class Event(enum.IntEnum):
    """What happens to a record (an int enum: :func:`enter` indexes its rules with it)."""

    ACQUIRE = 0
    ACCEPT = 1
    RELEASE = 2
    DEAD_LETTER = 3
    NOT_ATTEMPTED = 4
    FENCE = 5
    DLQ_WRITTEN = 6
    DLQ_WITHHELD = 7


_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVING = RecordState.ARCHIVING

#: Every transition a record may make; :func:`enter` refuses the rest.
TRANSITIONS: Mapping[tuple[RecordState, Event], RecordState] = MappingProxyType(
    {
        (_AVAILABLE, Event.ACQUIRE): _ACQUIRED,
        (_AVAILABLE, Event.DEAD_LETTER): _ARCHIVING,
        (_ACQUIRED, Event.ACCEPT): RecordState.ACKNOWLEDGED,
        (_ACQUIRED, Event.RELEASE): _AVAILABLE,
        (_ACQUIRED, Event.DEAD_LETTER): _ARCHIVING,
        (_ACQUIRED, Event.NOT_ATTEMPTED): _AVAILABLE,
        (_ACQUIRED, Event.FENCE): _AVAILABLE,
        (_ARCHIVING, Event.DLQ_WRITTEN): RecordState.ARCHIVED,
        (_ARCHIVING, Event.DLQ_WITHHELD): _AVAILABLE,
    }
)


_Rule = tuple[tuple[RecordState, ...], RecordState]


def _compile() -> tuple[_Rule, ...]:
    """Per event (at its index), the states it applies to and the one state it leads to.

    :func:`enter` reads this, not the table: an enum's hash is a Python-level call, indexing a
    tuple with an int enum and testing a few states by identity are not.
    """
    rules: list[_Rule] = []
    for event in Event:
        assert event == len(rules), "Event values are their indexes"
        sources = tuple(state for state, on in TRANSITIONS if on is event)
        targets = {TRANSITIONS[state, event] for state in sources}
        assert len(targets) == 1, f"{event.name} leads to one state"
        rules.append((sources, targets.pop()))
    return tuple(rules)


_RULES = _compile()


def enter(record: LedgerRecord, event: Event, _rules: tuple[_Rule, ...] = _RULES) -> None:
    """Move ``record`` to the state :data:`TRANSITIONS` gives for its state and ``event``.

    Raises :class:`IllegalTransition`, the record unchanged, when the table has no such entry.
    (``_rules`` is bound once: a local is read faster than a global on the hot path.)

    Like h11's ``_state.py``: the transitions are one table, :data:`TRANSITIONS`, of
    ``(state, event) -> state``, and one function, :func:`enter`, applies it.  An event the table
    lacks for the record's state raises :class:`IllegalTransition` and leaves the record unchanged;
    nothing else assigns ``LedgerRecord.state``.  docs/guarantees.md's lifecycle, as the table holds it::

        state       event          next state     made by (sidecar.core.ledger.*)
        AVAILABLE   ACQUIRE        ACQUIRED       acquire; committed (an isolated hand-out)
        AVAILABLE   DEAD_LETTER    ARCHIVING      restored at the limit (add, or next of its key)
        ACQUIRED    ACCEPT         ACKNOWLEDGED   answer: accept                               done
        ACQUIRED    RELEASE        AVAILABLE      answer: release, or expire, below the limit
        ACQUIRED    DEAD_LETTER    ARCHIVING      answer: reject; a release or expiry at the limit
        ACQUIRED    NOT_ATTEMPTED  AVAILABLE      not_attempted: the request was never sent
        ACQUIRED    FENCE          AVAILABLE      revoke: the attempt's answer is lost
        ARCHIVING   DLQ_WRITTEN    ARCHIVED       dlq_written                                  done
        ARCHIVING   DLQ_WITHHELD   AVAILABLE      dlq_withheld (the DLQ circuit breaker)

    Which answer leads to which event is `sidecar.core.outcome.decide`'s verdict: ``Accept`` ->
    ACCEPT, ``Redeliver`` -> RELEASE, ``DeadLetter`` -> DEAD_LETTER, ``KeepLock`` (a renew) -> none.
    What a transition costs besides the state (counts, heaps, the horizon) is the caller's, in the
    module that owns it.
    """
    sources, target = _rules[event]
    if record.state not in sources:
        raise IllegalTransition(
            f"{event.name} does not apply to offset {record.offset} ({record.state.name})"
        )
    record.state = target


class LedgerRecord:
    """One record held by a ledger, from its fetch until it is done.

    Its ``state`` changes only through :func:`enter`; each other field is documented where the
    ledger sets it.
    """

    __slots__ = (
        "attempt_id",
        "counted_after",
        "delivery_count",
        "error",
        "handed_out",
        "item",
        "key",
        "lock_deadline_ms",
        "not_before_ms",
        "offset",
        "pending",
        "queue_key",
        "queued",
        "reason",
        "seq",
        "size",
        "state",
        "suspect",
        "tier_delay_ms",
    )

    def __init__(
        self,
        offset: int,
        key: bytes | None,
        item: object,
        count: int,
        queue_key: object,
        seq: int,
        size: int,
    ) -> None:
        self.offset = offset
        self.size = size  # bytes held against the byte budget (see add)
        self.seq = seq  # how many records were fetched before this one
        self.key = key
        self.item = item
        self.state = RecordState.AVAILABLE
        self.delivery_count = count
        self.attempt_id: str | None = None
        self.lock_deadline_ms = 0
        self.not_before_ms = 0
        self.reason: ArchiveReason | None = None
        self.error: ErrorInfo | None = None
        self.queue_key = queue_key
        self.queued = False  # in the ready heap (the suspects' heap for a suspect)
        self.handed_out = False  # ARCHIVING and returned by to_archive()
        # Horizon mode: an attempt in flight that delivery_count does not include yet (charged
        # when its outcome is known), and "may have been delivered before a death, not settled".
        self.pending = False
        self.suspect = False
        self.tier_delay_ms = 0  # reason RETRY_TIER: the release's delay
        # Horizon mode: the commit points made when its count was last raised (-1: stored, as a
        # count fetched or restored is); it is redelivered once a point made after that is
        # confirmed (see `sidecar.core.ledger.horizon.Horizon.hold_for_count`).
        self.counted_after = -1


# -- the isolation pass -----------------------------------------------------------------------


class PassEvent(enum.Enum):
    """What happens to a partition's isolation pass (see :data:`ISOLATION`)."""

    CHARGE = "charge"
    HAND_OUT = "hand_out"
    SETTLE = "settle"
    TAKE_BACK = "take_back"
    FENCE = "fence"
    FLUSH = "flush"
    UNCHARGE = "uncharge"


_NONE = IsolationPhase.NONE
_CHARGED = IsolationPhase.CHARGED
_IN_FLIGHT = IsolationPhase.IN_FLIGHT
_SETTLING = IsolationPhase.SETTLING

#: Every move the isolation pass may make; :func:`enter_pass` refuses the rest.
ISOLATION: Mapping[tuple[IsolationPhase, PassEvent], IsolationPhase] = MappingProxyType(
    {
        (_NONE, PassEvent.CHARGE): _CHARGED,
        (_SETTLING, PassEvent.CHARGE): _CHARGED,
        (_CHARGED, PassEvent.HAND_OUT): _IN_FLIGHT,
        (_CHARGED, PassEvent.FLUSH): _CHARGED,
        (_CHARGED, PassEvent.UNCHARGE): _NONE,
        (_IN_FLIGHT, PassEvent.SETTLE): _SETTLING,
        (_IN_FLIGHT, PassEvent.TAKE_BACK): _SETTLING,
        (_IN_FLIGHT, PassEvent.FENCE): _CHARGED,
        (_SETTLING, PassEvent.FLUSH): _NONE,
    }
)


class IsolationPass:
    """One partition's isolation pass: its phase (NONE, CHARGED, IN_FLIGHT or SETTLING), the record
    it isolates (CHARGED, IN_FLIGHT) and the number of commit points made when the isolated
    attempt's outcome (or its take-back) became known: a point made after it must be confirmed
    before anything else of the partition goes out (a death would charge the record again).

    Its attributes change only through :func:`enter_pass`.
    """

    __slots__ = ("isolating", "phase", "unflushed_after")

    def __init__(self) -> None:
        self.phase = IsolationPhase.NONE
        self.isolating: LedgerRecord | None = None
        self.unflushed_after: int | None = None


def enter_pass(
    isolation: IsolationPass,
    event: PassEvent,
    record: LedgerRecord | None = None,
    points: int = 0,
) -> None:
    """Move the pass to the phase :data:`ISOLATION` gives for its phase and ``event``.

    CHARGE takes the ``record`` charged; SETTLE and TAKE_BACK the commit points made so far
    (``points``): the outcome waits for a point made after them.  Raises
    :class:`IllegalTransition`, the pass unchanged, when the table has no such entry, on a HAND_OUT
    while an earlier outcome waits for its commit, or on a CHARGE without a record.

    The isolation pass (horizon mode, `sidecar.core.ledger.horizon`) is the second table,
    :data:`ISOLATION`, of ``(phase, event) -> phase``, applied by :func:`enter_pass` alone: nothing else
    assigns an :class:`IsolationPass`'s phase, the record it isolates or the commit point its outcome
    waits for, and an event the table lacks raises :class:`IllegalTransition`, the pass unchanged::

        phase       event       next phase   made by (sidecar.core.ledger.*)
        NONE        CHARGE      CHARGED      isolate: a suspect's count raised in memory
        SETTLING    CHARGE      CHARGED      isolate: the next one meanwhile (one commit carries both)
        CHARGED     HAND_OUT    IN_FLIGHT    committed: the point with its charge; nothing unflushed
        CHARGED     FLUSH       CHARGED      committed: the previous outcome is committed
        CHARGED     UNCHARGE    NONE         revoke: a charge never handed out goes back
        IN_FLIGHT   SETTLE      SETTLING     its outcome: an answer or a lock expiry
        IN_FLIGHT   TAKE_BACK   SETTLING     not_attempted: never sent, its charge taken back
        IN_FLIGHT   FENCE       CHARGED      revoke: the answer is lost, the charge stands
        SETTLING    FLUSH       NONE         committed: a point made after the outcome

    READY and WAITING are never stored: between two isolations (NONE) `Horizon.status` tells them
    apart by the suspects left (one ready now, or none).  A pass that would end (NONE) while an earlier
    outcome still waits for its commit is SETTLING (an UNCHARGE after a CHARGE made while SETTLING).
    """
    phase = isolation.phase
    target = ISOLATION.get((phase, event))
    if target is None:
        raise IllegalTransition(f"the isolation pass cannot {event.value} while {phase.value}")
    if event is PassEvent.HAND_OUT and isolation.unflushed_after is not None:
        raise IllegalTransition("an isolated outcome waits for its commit: nothing goes out")
    if event is PassEvent.CHARGE:
        if record is None:
            raise IllegalTransition("a charge needs the record charged")
        isolation.isolating = record
    elif event is PassEvent.SETTLE or event is PassEvent.TAKE_BACK:
        isolation.isolating = None
        isolation.unflushed_after = points
    elif event is PassEvent.FLUSH:
        isolation.unflushed_after = None
    elif event is PassEvent.UNCHARGE:
        isolation.isolating = None
        if isolation.unflushed_after is not None:
            target = _SETTLING  # the earlier outcome still waits for its commit
    isolation.phase = target
