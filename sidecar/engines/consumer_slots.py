"""The consumer-group engine's per-partition state and the values it derives from the configuration.

Owns what :mod:`sidecar.engines.consumer_group` keeps beside each partition's ledger (:class:`Slot`),
a DLQ record on its way into a transaction (:class:`TxnItem`), the horizon's window, the engine's
clock, and glibc's mmap threshold for large records. Plain data and pure functions; the engine
(:class:`~sidecar.engines.consumer_group.ConsumerGroupEngine`) is the only one that changes a slot.
Must not import the pipeline, either engine, or confluent-kafka.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from dataclasses import dataclass, field

import trio

from sidecar.config import AppMode, Config
from sidecar.core import ledger as L
from sidecar.core.deadletter import FailedRecord
from sidecar.engines.interfaces import Delivery
from sidecar.kafka.source import OffsetToCommit


def horizon_window(config: Config) -> int:
    """How far (in offsets) the committed horizon runs ahead of a partition's hand-outs.

    A commit is wanted when half of it is used, so the commit has half a window of hand-outs to
    land: with the poll thread's 100 ms timeout and a round trip, 64 offsets last ~370 ms at 1,000
    records/s over 6 partitions. The window is also how many never-delivered records an unclean
    stop leaves as suspects, each isolated alone (an app round trip and a commit) after a
    restart; so it follows what the app can take at once (twice its in-flight capacity, at least
    64), within `share.partition.max.record.locks` and `max.in.flight.records`.
    """
    d = config.delivery
    app = config.app
    capacity = app.max_in_flight * (app.batch_max_records if app.mode == AppMode.BATCH else 1)
    return max(2, min(d.partition_max_record_locks, d.max_in_flight_records, max(64, 2 * capacity)))


# glibc's mallopt parameter for the size from which allocations are mmapped.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Keep large records' memory returnable to the system (glibc only; True if set).

    glibc raises its mmap threshold after every large free (up to 32 MiB), so once a 1 MiB record
    has been freed the next ones come from heap arenas, which keep their peak size: measured with
    the bench's 1 MiB backlog, peak RSS 157-165 MB against 139-141 MB with the threshold fixed at
    its initial 128 KiB (records below it are unaffected). `MALLOC_MMAP_THRESHOLD_` in the
    environment takes precedence.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES))


def now_ms() -> int:
    # The ledger wants a clock that never goes backwards.
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True, eq=False)
class Slot:
    """One partition's ledger plus what the engine keeps beside it."""

    ledger: L.PartitionLedger
    last_commit: tuple[int, str] | None = None
    # The live deliveries of this partition, by ledger attempt id (expiry and revoke find them).
    live: dict[str, Delivery[SlotRef]] = field(default_factory=dict)
    dlq_writes: int = 0  # DLQ writes in progress for this partition
    revoking: bool = False  # no new acquisitions: the partition is being handed over
    # Transactional mode: the ledger counts records of a DLQ transaction that has not committed
    # (yet) as done, so its state must not be committed outside that transaction.
    txn_uncommitted: bool = False
    # Horizon mode: an isolation pass is under way (logged at its start and end).
    in_pass: bool = False
    # Horizon mode: the restored state has suspects to come (up to this offset); None once every
    # fetched record is past it and the pass is over, so steady state checks nothing per turn.
    suspect_top: int | None = None
    # Offsets the DLQ circuit breaker held on their way to the DLQ (ARCHIVING, not written):
    # AVAILABLE again once it is half-open or closed (`release_held`).
    held: list[int] = field(default_factory=list)
    # The scheduler's memory of its last look (`sidecar.engines.consumer_scheduler`): the
    # ledger's `changes` when a turn found nothing to do in it (-1: look again), and then its
    # next lock deadline and next deadline (None: none); and what flow control last decided on.
    quiet_at: int = -1
    quiet_lock_due: int | None = None
    quiet_due: int | None = None
    flow_seen: tuple[int, int, bool, bool] | None = None


# A consumer-group delivery's `ref`: its partition and its ledger attempt.
SlotRef = tuple[Slot, L.Attempt]

# One partition's commit: what goes to the broker, and (horizon mode) the ledger's commit point.
PendingCommit = tuple[Slot, OffsetToCommit, "L.CommitPoint | None"]


@dataclass(slots=True, eq=False)
class TxnItem:
    slot: Slot
    offset: int
    failed: FailedRecord
    dlq_topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    skipped: bool = False  # the partition went to another owner before the transaction


__all__ = [
    "PendingCommit",
    "Slot",
    "SlotRef",
    "TxnItem",
    "fix_mmap_threshold",
    "horizon_window",
    "now_ms",
]
