"""The records a partition's ledger holds, and the order they may go in (sans-IO).

Owns `Holdings`, a part of `sidecar.core.ledger.partition.PartitionLedger`: it decides nothing
about a record's life; the ledger asks it to hold, queue, back off and remove records.

Imports the standard library, `sidecar.core` and the ledger's values and machine only.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque

from sidecar.core.commitstate import CommitState
from sidecar.core.ledger.machine import LedgerRecord
from sidecar.core.ledger.values import LedgerConfig, RecordState
from sidecar.core.ordering import Ordering

# Sentinel queue key: the record is not ordered against any other (NONE mode, or a null key).
_UNORDERED = object()
_PARTITION = object()  # the queue key of every record in PARTITION mode
_AVAILABLE = RecordState.AVAILABLE


class Holdings:
    """The records held by one partition's ledger and their queues.

    A part of `sidecar.core.ledger.partition.PartitionLedger`, built in its constructor:
    the records not done, in offset order; the heaps of offsets that may be handed out now (suspects of
    the isolation pass apart, see `sidecar.core.ledger.horizon`) and of those backing off until a retry
    time; the key queues (KEY / PARTITION ordering: only a queue's head may be in flight); the bytes
    held; and what the restored state says about offsets not fetched again yet.  It decides nothing
    about a record's life: the ledger asks it to hold, queue, back off and remove records.
    """

    def __init__(
        self, config: LedgerConfig, start_offset: int, restored: CommitState | None
    ) -> None:
        self.ordering = config.ordering
        # Not-done records in offset order (they are added in offset order); OrderedDict because
        # its front stays O(1) under deletions, which a plain dict's iteration does not.
        self.records: OrderedDict[int, LedgerRecord] = OrderedDict()
        self.ready: list[int] = []  # heap of offsets that may be acquired now
        self.suspects_ready: list[int] = []  # heap of suspect offsets that may be isolated
        self.backoff: list[tuple[int, int]] = []  # heap of (not_before_ms, offset)
        # KEY / PARTITION order: not-done offsets per key; only the head may be in flight.
        self.queues: dict[object, deque[int]] = {}
        self.last_added = start_offset - 1
        self.n_fetched = 0  # records added, restored-done ones included (the next one's seq)
        self.held_bytes = 0  # sum of the sizes of the records held (not done)

        # What the restored state says about offsets not yet re-fetched.
        self.restored_done: list[tuple[int, int]] = []
        self.restored_index = 0
        self.restored_counts: dict[int, int] = {}
        if restored is not None:
            for range_start, end in restored.done:
                start = max(range_start, start_offset)
                if start < end:
                    self.restored_done.append((start, end))
            self.restored_counts = {o: c for o, c in restored.counts.items() if o >= start_offset}
        self.restored_top = max(
            [e - 1 for _, e in self.restored_done] + list(self.restored_counts) + [-1]
        )

    def committable_offset(self) -> int:
        """The lowest offset that is not done: the offset to commit (next offset to read)."""
        if self.records:
            return next(iter(self.records))
        following = self.last_added + 1
        ranges = self.restored_done
        i = self.restored_index
        while i < len(ranges) and ranges[i][1] <= following:
            i += 1
        if i < len(ranges) and ranges[i][0] <= following:
            return ranges[i][1]
        return following

    def fetched(self, offset: int) -> int:
        """``offset`` was fetched (above the last one added): its fetch sequence number."""
        self.last_added = offset
        seq = self.n_fetched
        self.n_fetched = seq + 1
        return seq

    def in_restored_done(self, offset: int) -> bool:
        """The restored state says ``offset`` is done (offsets asked in increasing order)."""
        ranges = self.restored_done
        i = self.restored_index
        while i < len(ranges) and ranges[i][1] <= offset:
            i += 1
        self.restored_index = i
        return i < len(ranges) and ranges[i][0] <= offset

    def restored_count(self, offset: int) -> int:
        """The delivery count the restored state gives ``offset`` (taken: asked once)."""
        return self.restored_counts.pop(offset, 0) if self.restored_counts else 0

    def restored_counts_from(self, following: int) -> dict[int, int]:
        """The restored counts of offsets not fetched yet (``following`` and above)."""
        if self.restored_counts:
            self.restored_counts = {o: c for o, c in self.restored_counts.items() if o >= following}
        return self.restored_counts

    def queue_key(self, key: bytes | None) -> object:
        """What orders a record with ``key`` against the others (``_UNORDERED``: nothing)."""
        ordering = self.ordering
        if ordering is Ordering.KEY:
            return _UNORDERED if key is None else key
        if ordering is Ordering.PARTITION:
            return _PARTITION
        return _UNORDERED

    def hold(self, record: LedgerRecord) -> bool:
        """Hold a record just fetched; True if it may go now (not behind another of its key)."""
        offset = record.offset
        self.records[offset] = record
        self.held_bytes += record.size
        queue_key = record.queue_key
        if queue_key is _UNORDERED:
            return True
        queue = self.queues.get(queue_key)
        if queue is None:
            self.queues[queue_key] = deque((offset,))
            return True
        queue.append(offset)
        return False

    def queue(self, record: LedgerRecord) -> None:
        """The record may be handed out now (isolated, for a suspect)."""
        record.queued = True
        heapq.heappush(self.suspects_ready if record.suspect else self.ready, record.offset)

    def back_off(self, record: LedgerRecord) -> None:
        """The record may go again at its ``not_before_ms``."""
        heapq.heappush(self.backoff, (record.not_before_ms, record.offset))

    def backing_off(self, offset: int, not_before: int) -> LedgerRecord | None:
        """The record a backoff entry stands for, while that entry is still its own (a record
        handed out, queued or backed off again since leaves a stale entry behind)."""
        record = self.records.get(offset)
        if (
            record is not None
            and record.state is _AVAILABLE
            and not record.queued
            and record.not_before_ms == not_before
        ):
            return record
        return None

    def release_backoffs(self, now: int) -> None:
        """Queue every record whose retry time has come."""
        backoff = self.backoff
        while backoff and backoff[0][0] <= now:
            not_before, offset = heapq.heappop(backoff)
            record = self.backing_off(offset, not_before)
            if record is not None:
                self.queue(record)

    def next_backoff_ms(self) -> int | None:
        """The earliest retry time of a record backing off (dropping stale entries), or None."""
        backoff = self.backoff
        while backoff:
            not_before, offset = backoff[0]
            if self.backing_off(offset, not_before) is not None:
                return not_before
            heapq.heappop(backoff)
        return None

    def next_suspect(self) -> LedgerRecord | None:
        """The lowest suspect that may be isolated now (dropping stale heap entries)."""
        heap = self.suspects_ready
        while heap:
            record = self.records.get(heap[0])
            if record is not None and record.queued and record.suspect:
                return record
            heapq.heappop(heap)
        return None

    def take_suspect(self) -> LedgerRecord | None:
        """Take the lowest suspect that may be isolated now off its heap, or None."""
        record = self.next_suspect()
        if record is not None:
            heapq.heappop(self.suspects_ready)
            record.queued = False
        return record

    def first_ready(self) -> int | None:
        """The lowest offset that may be handed out now (dropping stale heap entries), or None."""
        ready = self.ready
        while ready:
            top = self.records.get(ready[0])
            if top is not None and top.queued:
                return ready[0]
            heapq.heappop(ready)
        return None

    def remove(self, record: LedgerRecord) -> LedgerRecord | None:
        """The record is done: drop it; the next of its key, which may go now, or None."""
        del self.records[record.offset]
        self.held_bytes -= record.size
        record.item = None
        queue_key = record.queue_key
        if queue_key is _UNORDERED:
            return None
        queue = self.queues[queue_key]
        # Only a queue's head is ever acquired or archived, so the done record is the head.
        queue.popleft()
        if queue:
            return self.records[queue[0]]
        del self.queues[queue_key]
        return None

    def drop_queued(self) -> None:
        """Revoke: nothing may be handed out any more."""
        self.ready.clear()
        self.suspects_ready.clear()
        self.backoff.clear()
