"""The state every part of a partition's ledger reads, and the steps they share (sans-IO).

`_LedgerBase` holds the records of one partition that are not done, the heaps and queues that
order them, the counters behind the metadata size checks, and the horizon's marks; the parts of
`sidecar.core.ledger.PartitionLedger` build on it, one module each::

    _LedgerBase            here: the records held; a record made ready, archived, or done
    └── _Horizon           horizon: crash accounting (the horizon, suspects, the isolation pass)
        └── _CommitMetadata    metadata: the state to commit, its size, commit points
            └── _FlowControl       flow: pause / resume, the next deadline
                └── _Archive           archive: the DLQ side of archiving
                    └── PartitionLedger    partition: intake, hand-outs, answers, revoke

A record's state changes only through `sidecar.core.ledger.machine.enter`.

Imports the standard library, `sidecar.core` and the ledger's values and machine only.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque

from sidecar.core.commitstate import MAX_OFFSET, CommitState
from sidecar.core.ledger.machine import Event, _Record, enter
from sidecar.core.ledger.values import CrashAccounting, LedgerConfig, RecordState
from sidecar.core.outcome import COUNT_EXHAUSTED, ArchiveReason, ErrorInfo

# Sentinel queue key: the record is not ordered against any other (NONE mode, or a null key).
_UNORDERED = object()
_PARTITION = object()  # the queue key of every record in PARTITION mode
_AVAILABLE = RecordState.AVAILABLE
_DEAD_LETTER = Event.DEAD_LETTER


class _LedgerBase:
    """See the module docstring; `PartitionLedger` is the class to use."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start_offset: int,
        config: LedgerConfig | None = None,
        restored: CommitState | None = None,
        *,
        epoch: int = 0,
    ) -> None:
        """The state of a partition assigned at ``start_offset``, the committed offset.

        ``restored`` is the state decoded from its metadata.  ``epoch`` distinguishes attempt ids
        of successive assignments of the same partition (the caller passes a counter), so an
        answer from before a rebalance can never match an attempt made after it.
        """
        if not 0 <= start_offset <= MAX_OFFSET:
            raise ValueError(f"start_offset out of range: {start_offset}")
        self.topic = topic
        self.partition = partition
        self.config = config if config is not None else LedgerConfig()
        self.epoch = epoch
        self._start_offset = start_offset
        self._id_prefix = f"{topic}/{partition}/"
        self._id_epoch = f"/{epoch}."

        # Not-done records in offset order (they are added in offset order); OrderedDict because
        # its front stays O(1) under deletions, which a plain dict's iteration does not.
        self._records: OrderedDict[int, _Record] = OrderedDict()
        # Live attempts in lock-deadline order: the lock duration is constant and now_ms never
        # decreases, so insertion order is deadline order; renew moves an entry to the end.
        self._live: OrderedDict[str, _Record] = OrderedDict()
        self._ready: list[int] = []  # heap of offsets that may be acquired now
        self._backoff: list[tuple[int, int]] = []  # heap of (not_before_ms, offset)
        # KEY / PARTITION order: not-done offsets per key; only the head may be in flight.
        self._queues: dict[object, deque[int]] = {}
        self._archive: deque[int] = deque()
        self._next_seq = 0
        self._last_added = start_offset - 1
        self._max_done = start_offset - 1
        # Highest offset that ever had a delivery count: commit_state() stops scanning past it
        # (and past _max_done), so a deep buffer of untouched records costs nothing per commit.
        self._max_counted = start_offset - 1
        self._now = 0
        self._revoked = False
        self._paused = False
        self._held_bytes = 0  # sum of the sizes of the records held (not done)

        # What the restored state says about offsets not yet re-fetched.
        self._restored_done: list[tuple[int, int]] = []
        self._restored_index = 0
        self._restored_counts: dict[int, int] = {}
        if restored is not None:
            for range_start, end in restored.done:
                start = max(range_start, start_offset)
                if start < end:
                    self._restored_done.append((start, end))
            self._restored_counts = {o: c for o, c in restored.counts.items() if o >= start_offset}

        # Horizon mode (see sidecar.core.ledger.horizon).  Every offset handed out in this assignment is
        # at most _confirmed; _issued is the highest horizon put in a commit point.
        self._horizon = self.config.crash_accounting is CrashAccounting.HORIZON
        self._window = self.config.window
        restored_horizon = (
            restored.horizon if restored is not None and restored.horizon is not None else None
        )
        if not self._horizon or restored_horizon is None or restored_horizon < start_offset:
            restored_horizon = start_offset - 1  # no suspects: counts as stored (version 1)
        self._suspect_top = restored_horizon
        self._confirmed = restored_horizon
        self._issued = restored_horizon
        self._handed_top = start_offset - 1
        self._held_at = -1
        self._suspects_ready: list[int] = []  # heap of suspect offsets that may be isolated
        self._isolating: _Record | None = None
        self._n_suspects = 0
        self._suspects_total = 0
        self._isolated_total = 0
        self._final: CommitState | None = None  # horizon mode: the state revoke() returned
        self._points = 0  # commit points made
        # The isolated attempt's outcome (or its take-back) is not committed before a point made
        # after it is confirmed: until then nothing goes out (a death would charge it again).
        self._unflushed_after: int | None = None

        self._acknowledged_total = 0
        self._archived_total = 0
        self._attempts_total = 0
        self._n_archiving = 0

        # Metadata size tracking (see sidecar.core.ledger.metadata): O(1) counters give a structural bound of
        # the payload; an exact measurement is cached per version.
        self._n_fetched = 0  # records added, restored-done ones included
        self._n_count_runs = 0  # runs of held records with equal counts (exact, see _recount)
        self._held_seqs: set[int] = set()
        self._n_ranges = 0  # done ranges above the base (exact, see _count_done_run)
        self._max_done_seq = -1
        self._restored_top = max(
            [e - 1 for _, e in self._restored_done] + list(self._restored_counts) + [-1]
        )
        self._version = 0
        # Bumped by every call that may change what a scheduler turn gets from this ledger
        # (expire, acquire, to_archive, flow control, horizon_wanted, the next deadline): see
        # `changes`.
        self._changes = 0
        self._measured_version = -1
        self._measured_chars = 0
        self._measured_raw = 0
        self._measure()  # a restored state may start near the budget

    def _measure(self) -> None:
        """Measure the state to commit against its budget (`sidecar.core.ledger.metadata` does:
        nothing is measured at this level); ``__init__`` ends with it."""

    @property
    def changes(self) -> int:
        """A counter bumped by every call that changes the ledger's state (intake, hand-outs,
        answers, expiry, DLQ outcomes, commit points and their confirmation, revoke).

        Between two equal readings, and before ``next_deadline_ms``, every query returns what it
        returned before: a scheduler may skip a partition whose counter has not moved.
        """
        return self._changes

    def _tick(self, now_ms: int) -> int:
        # A clock that steps back must not reorder lock deadlines (see _live).
        if now_ms > self._now:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._now = now_ms
        return self._now

    def committable_offset(self) -> int:
        """The lowest offset that is not done: the offset to commit (next offset to read)."""
        if self._records:
            return next(iter(self._records))
        following = self._last_added + 1
        ranges = self._restored_done
        i = self._restored_index
        while i < len(ranges) and ranges[i][1] <= following:
            i += 1
        if i < len(ranges) and ranges[i][0] <= following:
            return ranges[i][1]
        return following

    def _make_ready(self, record: _Record) -> None:
        if record.delivery_count >= self.config.delivery_count_limit:
            # Restored at the limit: the last attempt's outcome was lost in a crash or a
            # rebalance.  Archiving now is what bounds a poison pill that kills the pod.
            self._start_archiving(
                record,
                ArchiveReason.DELIVERY_COUNT_EXCEEDED,
                ErrorInfo(
                    COUNT_EXHAUSTED,
                    f"delivery count {record.delivery_count} reached the limit "
                    f"{self.config.delivery_count_limit} before a restart or rebalance",
                    None,
                ),
            )
            return
        record.queued = True
        heapq.heappush(self._suspects_ready if record.suspect else self._ready, record.offset)

    def _start_archiving(
        self, record: _Record, reason: ArchiveReason, error: ErrorInfo | None
    ) -> None:
        enter(record, _DEAD_LETTER)
        if record.suspect:
            self._clear_suspect(record)  # restored at the limit: no delivery, DLQ now
        record.reason = reason
        record.error = error
        record.handed_out = False
        self._n_archiving += 1
        self._archive.append(record.offset)

    def _clear_suspect(self, record: _Record) -> None:
        record.suspect = False
        self._n_suspects -= 1
        if self._isolating is record:
            self._isolating = None
            self._isolated_total += 1
            self._unflushed_after = self._points

    def _next_suspect(self) -> _Record | None:
        """The lowest suspect that may be isolated now (dropping stale heap entries)."""
        heap = self._suspects_ready
        while heap:
            record = self._records.get(heap[0])
            if record is not None and record.queued and record.suspect:
                return record
            heapq.heappop(heap)
        return None

    def _backing_off(self, offset: int, not_before: int) -> _Record | None:
        """The record a backoff entry stands for, while that entry is still its own (a record
        handed out, queued or backed off again since leaves a stale entry behind)."""
        record = self._records.get(offset)
        if (
            record is not None
            and record.state is _AVAILABLE
            and not record.queued
            and record.not_before_ms == not_before
        ):
            return record
        return None

    def _release_backoffs(self, now: int) -> None:
        backoff = self._backoff
        while backoff and backoff[0][0] <= now:
            not_before, offset = heapq.heappop(backoff)
            record = self._backing_off(offset, not_before)
            if record is not None:
                record.queued = True
                heapq.heappush(self._suspects_ready if record.suspect else self._ready, offset)

    def _finish(self, record: _Record) -> None:
        offset = record.offset
        seq = record.seq
        records = self._records
        front_seq = next(iter(records.values())).seq
        del records[offset]
        self._held_seqs.discard(seq)
        self._held_bytes -= record.size
        record.item = None
        count = record.delivery_count
        if count:
            # _recount(offset, count, 0), inlined: this is the hot path.
            neighbour = records.get(offset - 1)
            left = neighbour.delivery_count if neighbour is not None else 0
            neighbour = records.get(offset + 1)
            right = neighbour.delivery_count if neighbour is not None else 0
            self._n_count_runs -= 1 - (left == count) - (right == count)
        if offset > self._max_done:  # noqa: PLR1730 (hot path)
            self._max_done = offset
        self._count_done_run(seq, front_seq, seq > self._max_done_seq)
        queue_key = record.queue_key
        if queue_key is _UNORDERED:
            return
        queue = self._queues[queue_key]
        # Only a queue's head is ever acquired or archived, so the done record is the head.
        queue.popleft()
        if queue:
            self._make_ready(self._records[queue[0]])
        else:
            del self._queues[queue_key]

    def _recount(self, offset: int, before: int, after: int) -> None:
        """Keep ``_n_count_runs`` exact when the delivery count at ``offset`` changes.

        Count runs are maximal runs of consecutive offsets with the same count (the codec's
        counts section), so only the neighbours ``offset - 1`` and ``offset + 1`` matter.
        """
        if before == after:
            return
        records = self._records
        neighbour = records.get(offset - 1)
        left = neighbour.delivery_count if neighbour is not None else 0
        neighbour = records.get(offset + 1)
        right = neighbour.delivery_count if neighbour is not None else 0
        delta = 0
        if before:
            delta -= 1 - (left == before) - (right == before)
        if after:
            delta += 1 - (left == after) - (right == after)
        self._n_count_runs += delta

    def _count_done_run(self, seq: int, front_seq: int, extends: bool) -> None:
        """Keep ``_n_ranges`` (the done ranges commit_state emits) exact as ``seq`` becomes done.

        Ranges are maximal runs, in fetch order, of done records between the lowest held record
        (``front_seq``, before ``seq`` left) and the highest done one; every record fetched above
        the front is either held or done, so the neighbours ``seq - 1`` and ``seq + 1`` decide.
        """
        held = self._held_seqs
        top = self._max_done_seq
        if not held:
            self._n_ranges = 0  # everything fetched is done: the base moved past it all
        elif seq == front_seq:
            # The base moves up past the run that followed it, if there was one.
            if seq + 1 <= top and seq + 1 not in held:
                self._n_ranges -= 1
        else:
            left = seq - 1 > front_seq and seq - 1 <= top and seq - 1 not in held
            right = not extends and seq + 1 <= top and seq + 1 not in held
            self._n_ranges += 1 - left - right
        if extends:
            self._max_done_seq = seq
