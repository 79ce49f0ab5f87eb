"""The per-partition delivery ledger (sans-IO): record states, delivery counts, what to commit.

One :class:`PartitionLedger` per assigned partition tracks the records fetched from it through the
lifecycle of docs/guarantees.md (a KIP-932 share group, run by the sidecar itself)::

    AVAILABLE --acquire (delivery_count += 1)--> ACQUIRED --accept--> ACKNOWLEDGED        (done)
        ^                                          |
        +---- release / lock timeout (backoff) <---+  (while delivery_count < limit)
                                                   |
            reject, or release / timeout at the limit --> ARCHIVING --dlq_written--> ARCHIVED (done)

Inputs are method calls (``add``, ``acquire``, ``answer``, ``not_attempted``, ``expire``,
``dlq_written``, ``dlq_failed``, ``dlq_withheld`` (the DLQ circuit breaker), ``revoke``, and in
horizon mode ``isolate`` and ``committed``);
outputs are small frozen values (:class:`Attempt`, :class:`AnswerResult`, :class:`ArchiveRequest`,
:class:`CommitPoint`, :class:`IsolationCharge`, :class:`HorizonStatus`,
:class:`~sidecar.core.commitstate.CommitState`).  An illegal call raises a :class:`LedgerError` and
leaves the ledger unchanged.  The committable offset, the state to commit and the horizon to commit
are derived from the records held, never stored.

The ledger is one object, :class:`PartitionLedger`, built of parts that each own their state
(one module each, built by the ledger's constructor and given what they need there)::

    machine     the state machines: the record's (state, event) -> state table and ``enter``,
                which alone changes a record's state and refuses what the table lacks; the
                isolation pass's (phase, event) -> phase table and ``enter_pass``, the same way
    values      states, modes, ``LedgerConfig``, the frozen values returned, the errors
    partition   ``PartitionLedger``: intake, hand-outs, answers (``outcome.decide``), revoke;
                the calls that touch several parts
    attempts    ``Attempts``: the attempts in flight, their ids, their lock-deadline order
    holdings    ``Holdings``: the records held, their heaps and key queues, the restored state
    horizon     ``Horizon``: crash accounting: the horizon, suspects, the isolation pass (docs/guarantees.md)
    metadata    ``CommitMetadata``: the state to commit, its size bound, commit points
    flow        ``FlowControl``: pause / resume, the next deadline
    archive     ``Archive``: the DLQ side of archiving: to_archive, dlq_written / failed / withheld

Must not import trio, confluent_kafka, HTTP code or anything that performs I/O, and never reads
a clock: callers pass ``now_ms``.  Import the public names from here.

Error hierarchy (under `sidecar.core.errors.SidecarError`)::

    LedgerError
    ├── UnknownAttempt      an attempt id this ledger never issued
    ├── ExpiredAttempt      lock expired, attempt superseded, already answered, or partition revoked
    ├── IllegalTransition   e.g. dlq_written for a record that is not being archived
    └── LedgerClosed        the partition was revoked
"""

from __future__ import annotations

from sidecar.core.ledger.machine import TRANSITIONS, Event
from sidecar.core.ledger.partition import PartitionLedger
from sidecar.core.ledger.values import *  # noqa: F403 (its __all__, re-exported below)
from sidecar.core.ledger.values import __all__ as _values_all
from sidecar.core.ordering import Ordering
from sidecar.core.outcome import Ack, ArchiveReason, ErrorInfo

__all__ = [
    "TRANSITIONS",
    "Ack",
    "ArchiveReason",
    "ErrorInfo",
    "Event",
    "Ordering",
    "PartitionLedger",
]
__all__.extend(_values_all)  # the states, modes, config, returned values and errors
