"""The per-partition delivery ledger (sans-IO): record states, delivery counts, what to commit.

One `PartitionLedger` per assigned partition, built of parts (one module each; drawn in its
docstring). The record's lifecycle is drawn in `RecordState`'s docstring, the ledger's errors in
`sidecar.core.errors.SidecarError`'s.

Must not import trio, confluent_kafka, HTTP code or anything that performs I/O, and never reads
a clock: callers pass ``now_ms``.  Import the public names from here.
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
