"""The consumer-group engine's partitions: their states, and the values it derives from the configuration.

Owns what :mod:`sidecar.engines.consumer.group` keeps beside each partition's ledger (:class:`PartitionState`),
the table of the partitions it owns (:class:`Partitions`: opening a state from the committed offset
and its metadata, fencing one, and the event a revoke waits on), a DLQ record on its way into a
transaction (:class:`TxnItem`), the horizon's window, the engine's clock, and glibc's mmap threshold
for large records. A state's fields are changed by the engine's parts, each field by one part (see
:class:`PartitionState`). Must not import the pipeline, either engine, or confluent-kafka.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import trio

from sidecar.config import AppMode, Config
from sidecar.core import ledger as L
from sidecar.core.commitstate import DEFAULT_MAX_ENTRIES, CommitStateError
from sidecar.core.commitstate import parse as parse_state
from sidecar.core.deadletter import FailedRecord
from sidecar.engines.interfaces import Delivery, Outlet, PartitionKey
from sidecar.kafka.source import AssignedPartition, OffsetToCommit

log = logging.getLogger("sidecar.engine")


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
    has been freed the next ones come from heap arenas, which keep their peak size; fixed at its
    initial 128 KiB, large records keep coming from mmap and their memory goes back (records below
    it are unaffected; the figures are in docs/benchmarks.md). `MALLOC_MMAP_THRESHOLD_` in the
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
class PartitionState:
    """One partition's ledger plus what the engine keeps beside it.

    Each field has one writer: `live` this class (`track`, `untrack`, `untrack_all`), `revoking`
    the engine, `dlq_writes` and `held` the archiver, `last_commit`, `txn_uncommitted` and
    `commit_quiet_at` the committer, `in_pass` and `suspect_top` (after construction) the isolation
    step, the `quiet_*` fields and `flow_seen` the scheduler.
    """

    ledger: L.PartitionLedger
    last_commit: tuple[int, str] | None = None
    # The ledger's `changes` when a commit point made for it equalled `last_commit`: until it
    # changes again, a periodic commit neither makes a point nor sends one for this partition.
    commit_quiet_at: int = -1
    # The live deliveries of this partition, by ledger attempt id (expiry and revoke find them).
    live: dict[str, Delivery[PartitionRef]] = field(default_factory=dict)
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
    # AVAILABLE again once it is half-open or closed (`Archiver.release_held`).
    held: list[int] = field(default_factory=list)
    # The scheduler's memory of its last look (`sidecar.engines.consumer.scheduler.Scheduler`): the
    # ledger's `changes` when a turn found nothing to do in it (-1: look again), and then its
    # next lock deadline and next deadline (None: none); and what flow control last decided on.
    quiet_at: int = -1
    quiet_lock_due: int | None = None
    quiet_due: int | None = None
    flow_seen: tuple[int, int, bool, bool] | None = None

    def track(self, attempt_id: str, delivery: Delivery[PartitionRef]) -> None:
        """A delivery of the ledger attempt `attempt_id` is live."""
        self.live[attempt_id] = delivery

    def untrack(self, attempt_id: str) -> Delivery[PartitionRef] | None:
        """The attempt is over (answered, expired, not sent): its delivery, if it was live."""
        return self.live.pop(attempt_id, None)

    def untrack_all(self) -> list[Delivery[PartitionRef]]:
        """The partition is fenced: every live delivery, forgotten."""
        out = list(self.live.values())
        self.live.clear()
        return out


class Partitions:
    """The partitions this engine owns, by partition: their states, and the ones assigned with no
    committed offset whose ledger starts at the first record fetched (`pending`).

    The engine's source callbacks open and forget states (`open`, `pop`); the committer forgets
    the partitions a failed DLQ transaction leaves unsafe to commit (`drop`); whoever sees a
    revoke's partition move (an answer, an expiry, a DLQ write done) says so (`progressed`), and
    the revoke waits for it (`wait_progress`).
    """

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        ledger_config: L.LedgerConfig,
        *,
        horizon: bool,
        max_buffered_records: int,
        tier_topics: Collection[str] = (),
    ) -> None:
        """`tier_topics`: the retry tier topics read with the source topics (their ledgers hold
        records until due: `PartitionLedger`'s `tier`)."""
        self._outlet = outlet
        self._ledger_config = ledger_config
        self._horizon = horizon
        self._tier_topics = frozenset(tier_topics)
        # Decoding bound: the default fits the default buffer; a larger buffer writes more.
        self._max_entries = max(DEFAULT_MAX_ENTRIES, 2 * max_buffered_records + 2)
        self.by_key: dict[PartitionKey, PartitionState] = {}
        self.pending: dict[PartitionKey, AssignedPartition] = {}
        self._epoch = 0
        # Something a revoke waits for finished (a DLQ write; horizon mode: an answer, an expiry).
        self._progress = trio.Event()

    def owned(self, state: PartitionState) -> bool:
        return self.by_key.get((state.ledger.topic, state.ledger.partition)) is state

    def open(self, key: PartitionKey, start_offset: int, metadata: str | None) -> PartitionState:
        """A ledger for the partition from `start_offset`, with the delivery state its commit
        metadata carries when that is usable (a warning when it is not)."""
        restored = None
        if metadata:
            try:
                restored = parse_state(metadata, max_entries=self._max_entries)
            except CommitStateError as exc:
                log.warning(
                    "commit metadata of %s[%d] is unusable (%s); delivering from the committed "
                    "offset %d without delivery state",
                    key[0],
                    key[1],
                    exc,
                    start_offset,
                )
            if restored is None:
                pass
            elif restored.base_offset != start_offset:
                log.warning(
                    "commit metadata of %s[%d] is for offset %d, not the committed %d; ignoring it",
                    key[0],
                    key[1],
                    restored.base_offset,
                    start_offset,
                )
                restored = None
        self._epoch += 1
        ledger = L.PartitionLedger(
            key[0],
            key[1],
            start_offset,
            self._ledger_config,
            restored=restored,
            epoch=self._epoch,
            tier=key[0] in self._tier_topics,
        )
        top = restored.horizon if self._horizon and restored is not None else None
        state = PartitionState(
            ledger, suspect_top=top if top is not None and top >= start_offset else None
        )
        self.by_key[key] = state
        return state

    def fence(self, state: PartitionState) -> None:
        """The partition is no longer ours: fence its ledger and its live deliveries."""
        state.ledger.revoke()
        for delivery in state.untrack_all():
            self._outlet.retire(delivery)

    def assigned_without_offset(self, assigned: AssignedPartition) -> None:
        """Assigned with no committed offset: its ledger opens at the first record fetched."""
        self.pending[(assigned.topic, assigned.partition)] = assigned

    def open_pending(self, key: PartitionKey, first_offset: int) -> PartitionState | None:
        """The first record fetched of a partition assigned with no committed offset opens its
        ledger there; None when the partition is not pending (fetched just before a revoke)."""
        if self.pending.pop(key, None) is None:
            return None
        return self.open(key, first_offset, None)

    def pop(self, key: PartitionKey) -> PartitionState | None:
        """Forget the partition (revoked, lost); its state, fenced, when it had one."""
        self.pending.pop(key, None)
        state = self.by_key.pop(key, None)
        if state is not None:
            self.fence(state)
        return state

    def drop(self, state: PartitionState) -> None:
        """Forget a partition whose state must not be committed (see the committer's
        `_txn_fatal`): the next owner reads its records again from the last commit."""
        if self.owned(state):
            self.pop((state.ledger.topic, state.ledger.partition))

    def progressed(self) -> None:
        self._progress.set()

    async def wait_progress(self) -> None:
        self._progress = trio.Event()
        await self._progress.wait()


# A consumer-group delivery's `ref`: its partition and its ledger attempt.
PartitionRef = tuple[PartitionState, L.Attempt]

# One partition's commit: what goes to the broker, and (horizon mode) the ledger's commit point.
PendingCommit = tuple[PartitionState, OffsetToCommit, "L.CommitPoint | None"]


@dataclass(slots=True, eq=False)
class TxnItem:
    state: PartitionState
    offset: int
    failed: FailedRecord
    dlq_topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    skipped: bool = False  # the partition went to another owner before the transaction
    record: object = None  # the DLQ record produced in the transaction (`DlqRecord`)


__all__ = [
    "PartitionRef",
    "PartitionState",
    "Partitions",
    "PendingCommit",
    "TxnItem",
    "fix_mmap_threshold",
    "horizon_window",
    "now_ms",
]
