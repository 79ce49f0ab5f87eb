"""`PartitionLedger`: the delivery state of one assigned partition (sans-IO).

This module holds the record lifecycle (SPEC §2): intake (``add``), hand-outs (``acquire``), the
application's answers (``answer``, ``not_attempted``), lock expiry (``expire``) and ``revoke``.
What an answer does is `sidecar.core.outcome.decide`'s verdict; the state change it makes is
`sidecar.core.ledger.machine`'s table.  The class's other parts are one module each (see
`sidecar.core.ledger.base`): crash accounting in ``horizon``, commit metadata in ``metadata``,
flow control in ``flow``, the DLQ side in ``archive``.

Must not import trio, confluent_kafka, HTTP code or anything that performs I/O, and never reads a
clock: callers pass ``now_ms`` (a monotonic clock in milliseconds).  It is the hot path, so every
operation is O(log n) or amortised O(1); only ``commit_state`` and the metadata size check walk
the records held (bounded by ``max_buffered_records``).
"""

from __future__ import annotations

import heapq
from collections import deque

from sidecar.core.commitstate import MAX_OFFSET, CommitState
from sidecar.core.ledger.archive import _Archive
from sidecar.core.ledger.base import _PARTITION, _UNORDERED
from sidecar.core.ledger.machine import Event, _Record, enter
from sidecar.core.ledger.metadata import _MAX_ENTRY_CHARS, _PAUSE_FILL
from sidecar.core.ledger.values import (
    AnswerResult,
    Attempt,
    ExpiredAttempt,
    LedgerClosed,
    LedgerError,
    LedgerStats,
    RecordState,
    UnknownAttempt,
)
from sidecar.core.ordering import Ordering
from sidecar.core.outcome import (
    LOCK_TIMEOUT,
    Accept,
    Ack,
    ArchiveReason,
    DeadLetter,
    ErrorInfo,
    KeepLock,
    Redeliver,
    Verdict,
    decide,
)

__all__ = ["PartitionLedger"]

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVING = RecordState.ARCHIVING
_ACKNOWLEDGED = RecordState.ACKNOWLEDGED
_RELEASE = Ack.RELEASE
_REJECTED = ArchiveReason.REJECTED
_ACQUIRE = Event.ACQUIRE
_ACCEPT = Event.ACCEPT
_RELEASE_EVENT = Event.RELEASE
_MASK64 = (1 << 64) - 1


def _jitter_rand(offset: int, delivery_count: int) -> float:
    """A deterministic value in [0, 1) per (offset, attempt): splitmix64 finaliser.

    The ledger has no random source (it must be reproducible); mixing the offset spreads the
    retries of records released together, which is all jitter is for.
    """
    x = (offset * 0x9E3779B97F4A7C15 + delivery_count) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


class PartitionLedger(_Archive):
    """Delivery state of one assigned partition.  See `sidecar.core.ledger`.

    ``PartitionLedger(topic, partition, start_offset, config=None, restored=None, *, epoch=0)``:
    the constructor is `sidecar.core.ledger.base`'s (``_LedgerBase.__init__``), shared by every part.
    """

    def add(
        self, offset: int, key: bytes | None, item: object, now_ms: int, size_bytes: int = 0
    ) -> bool:
        """Take a fetched record.  Offsets must increase (gaps are fine).

        ``size_bytes`` is what holding it costs (``sidecar.core.budget.record_bytes``): counted in
        ``buffered_bytes`` until the record is done.  Returns False, keeping nothing, for an offset
        below the committed start offset, one not above the last added (a re-fetch), or one the
        restored state says is done.
        """
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        if offset <= self._last_added or offset < self._start_offset:
            return False
        if offset > MAX_OFFSET:
            raise ValueError(f"offset out of range: {offset}")
        if now_ms > self._now:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._now = now_ms
        self._last_added = offset
        self._version += 1
        self._changes += 1
        seq = self._n_fetched
        self._n_fetched = seq + 1
        if self._restored_done and self._in_restored_done(offset):
            self._max_done = offset
            front_seq = next(iter(self._records.values())).seq if self._records else seq
            self._count_done_run(seq, front_seq, extends=True)
            return False
        count = self._restored_counts.pop(offset, 0) if self._restored_counts else 0
        ordering = self.config.ordering
        if ordering is Ordering.KEY:
            queue_key: object = _UNORDERED if key is None else key
        elif ordering is Ordering.PARTITION:
            queue_key = _PARTITION
        else:
            queue_key = _UNORDERED
        record = _Record(offset, key, item, count, queue_key, seq, size_bytes)
        self._records[offset] = record
        self._held_bytes += size_bytes
        self._held_seqs.add(seq)
        if offset <= self._suspect_top:
            # Horizon mode: the previous owner may have handed it out and died.
            record.suspect = True
            self._n_suspects += 1
            self._suspects_total += 1
        if count:
            self._recount(offset, 0, count)
            self._max_counted = offset
        if queue_key is _UNORDERED:
            self._make_ready(record)
        else:
            queue = self._queues.get(queue_key)
            if queue is None:
                self._queues[queue_key] = deque((offset,))
                self._make_ready(record)
            else:
                queue.append(offset)
        return True

    def _in_restored_done(self, offset: int) -> bool:
        ranges = self._restored_done
        i = self._restored_index
        while i < len(ranges) and ranges[i][1] <= offset:
            i += 1
        self._restored_index = i
        return i < len(ranges) and ranges[i][0] <= offset

    def acquire(self, now_ms: int, max_n: int) -> list[Attempt]:
        """Hand out up to ``max_n`` records that may go now (ordering, backoff, lock limits)."""
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        now = self._tick(now_ms)
        if self._backoff:
            self._changes += 1  # a retry time may have come: the ready set may change
            self._release_backoffs(now)
        if (
            self._isolating is not None
            or self._unflushed_after is not None
            or (self._suspects_ready and self._next_suspect())
        ):
            return []  # the isolation pass goes first, and alone
        room = min(max_n, self.config.max_record_locks - len(self._live))
        ready = self._ready
        if room <= 0 or not ready:
            return []
        horizon = self._horizon
        confirmed = self._confirmed
        records = self._records
        live = self._live
        deadline = now + self.config.lock_duration_ms
        topic = self.topic
        partition = self.partition
        out: list[Attempt] = []
        append = out.append
        # Locals: this loop runs once per record handed out (the hot path).
        heappop = heapq.heappop
        get = records.get
        id_prefix = self._id_prefix
        id_epoch = self._id_epoch
        pause_chars = self.config.metadata_max_bytes * _PAUSE_FILL
        allowance = 0
        while ready and len(out) < room:
            offset = ready[0]
            record = get(offset)
            if record is None or not record.queued:
                heappop(ready)  # stale entry
                continue
            if horizon and offset > confirmed:
                # Beyond the committed horizon: held until its commit (the horizon fell behind).
                if offset > self._held_at:  # noqa: PLR1730 (hot path: no max() call)
                    self._held_at = offset
                break
            if allowance <= 0:
                # Near the metadata budget, a first attempt (a new count entry) may only go for
                # the lowest record (it frees the most); records already counted always may.
                estimate = self._metadata_estimate()
                if estimate > pause_chars:
                    if (
                        record.delivery_count == 0
                        and self._metadata_over(_PAUSE_FILL)
                        and offset != next(iter(records))
                    ):
                        break
                else:
                    # An acquisition adds at most _MAX_ENTRY_CHARS to either estimate: that many
                    # need no new estimate.
                    allowance = int(pause_chars - estimate) // _MAX_ENTRY_CHARS
            allowance -= 1
            enter(record, _ACQUIRE)
            self._version += 1
            heappop(ready)
            record.queued = False
            if horizon:
                # Not counted until its outcome is known: a death does not charge it.
                record.pending = True
                count = record.delivery_count + 1
                if offset > self._handed_top:  # noqa: PLR1730 (hot path: no max() call)
                    self._handed_top = offset
            else:
                count = record.delivery_count + 1
                record.delivery_count = count
                if offset > self._max_counted:  # noqa: PLR1730 (hot path: no max() call)
                    self._max_counted = offset
                # _recount(offset, count - 1, count), inlined: this is the hot path.
                neighbour = get(offset - 1)
                left = neighbour.delivery_count if neighbour is not None else 0
                neighbour = get(offset + 1)
                right = neighbour.delivery_count if neighbour is not None else 0
                runs = 1 - (left == count) - (right == count)
                if count > 1:
                    runs -= 1 - (left == count - 1) - (right == count - 1)
                self._n_count_runs += runs
            seq = self._next_seq
            self._next_seq = seq + 1
            attempt_id = f"{id_prefix}{offset}{id_epoch}{seq}"
            record.attempt_id = attempt_id
            record.lock_deadline_ms = deadline
            live[attempt_id] = record
            append(
                Attempt(
                    topic, partition, offset, attempt_id, count, deadline, record.key, record.item
                )
            )
        if out:
            self._attempts_total += len(out)
            self._version += 1
            self._changes += 1
        return out

    def answer(
        self,
        attempt_id: str,
        ack: Ack,
        now_ms: int,
        error: ErrorInfo | None = None,
        retry_after_ms: int | None = None,
    ) -> AnswerResult:
        """Apply the application's answer to a live attempt (``outcome.decide`` says what it does)."""
        record = self._live.get(attempt_id)
        if record is None:
            raise self._missing(attempt_id)
        now = self._now if now_ms < self._now else now_ms
        if now >= record.lock_deadline_ms:
            raise ExpiredAttempt(f"attempt {attempt_id}: lock expired at {record.lock_deadline_ms}")
        self._now = now
        self._version += 1
        self._changes += 1
        # The count with this attempt settled (horizon mode charges it only now, see _settle).
        count = record.delivery_count + record.pending
        if ack is _RELEASE:
            verdict = self._decide_release(record, count, retry_after_ms)
        else:  # no delay to compute: the hot path (an accept) skips the retry policy's arguments
            verdict = decide(ack, count, self.config.delivery_count_limit)
        verdict_type = verdict.__class__
        if verdict_type is Accept:
            enter(record, _ACCEPT)
            del self._live[attempt_id]
            record.attempt_id = None
            self._acknowledged_total += 1
            if record.pending:
                record.pending = False  # done: its count is never written again
            if record.suspect:
                self._clear_suspect(record)
            self._finish(record)
            return AnswerResult(attempt_id, record.offset, ack, _ACKNOWLEDGED, count)
        if verdict_type is KeepLock:
            record.lock_deadline_ms = now + self.config.lock_duration_ms
            self._live.move_to_end(attempt_id)
            return AnswerResult(
                attempt_id,
                record.offset,
                ack,
                _ACQUIRED,
                count,
                lock_deadline_ms=record.lock_deadline_ms,
            )
        return self._end_attempt(attempt_id, record, ack, verdict, now, error)

    def _end_attempt(
        self,
        attempt_id: str,
        record: _Record,
        ack: Ack | None,
        verdict: Verdict,
        now: int,
        error: ErrorInfo | None,
    ) -> AnswerResult:
        """A live attempt ends without an accept: dead-lettered or redelivered, as ``verdict`` says."""
        del self._live[attempt_id]
        record.attempt_id = None
        if record.pending or record.suspect:
            self._settle(record)
        if isinstance(verdict, DeadLetter):
            reason = verdict.reason
            if reason is _REJECTED:
                record.error = error  # the reject's own account, or none
            elif error is not None:
                record.error = error  # else the last release's account stays
            self._start_archiving(record, reason, record.error)
            return AnswerResult(
                attempt_id, record.offset, ack, _ARCHIVING, record.delivery_count, reason=reason
            )
        assert isinstance(verdict, Redeliver)
        if error is not None:
            record.error = error
        enter(record, _RELEASE_EVENT)
        record.not_before_ms = now + verdict.delay_ms
        if verdict.delay_ms <= 0:
            record.queued = True
            heapq.heappush(self._ready, record.offset)  # settled: never a suspect here
        else:
            heapq.heappush(self._backoff, (record.not_before_ms, record.offset))
        return AnswerResult(
            attempt_id,
            record.offset,
            ack,
            _AVAILABLE,
            record.delivery_count,
            retry_at_ms=record.not_before_ms,
        )

    def _decide_release(self, record: _Record, count: int, retry_after_ms: int | None) -> Verdict:
        """`outcome.decide` for a release (or a lock expiry) of the ``count``-th attempt."""
        return decide(
            _RELEASE,
            count,
            self.config.delivery_count_limit,
            retry=self.config.retry,
            rand=_jitter_rand(record.offset, count),
            retry_after_ms=retry_after_ms,
        )

    def not_attempted(self, attempt_id: str, now_ms: int, delay_ms: int = 0) -> AnswerResult:
        """The request could not be sent at all (connection refused): not an attempt.

        The delivery count goes back down and the record is AVAILABLE again after ``delay_ms``
        (the caller's own connection backoff; no delivery-count backoff applies).
        """
        record = self._live.get(attempt_id)
        if record is None:
            raise self._missing(attempt_id)
        now = max(self._now, now_ms)
        if now >= record.lock_deadline_ms:
            raise ExpiredAttempt(f"attempt {attempt_id}: lock expired at {record.lock_deadline_ms}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        enter(record, Event.NOT_ATTEMPTED)
        self._now = now
        self._version += 1
        self._changes += 1
        del self._live[attempt_id]
        record.attempt_id = None
        if record.pending:
            record.pending = False  # nothing was charged for it
        else:
            # Write-ahead, or an isolated attempt: take its charge back.  The next commit writes
            # the lower count again (a death before it leaves the charge: see the invariants).
            record.delivery_count -= 1
            self._recount(record.offset, record.delivery_count + 1, record.delivery_count)
            if self._isolating is record:
                self._isolating = None  # still a suspect: it goes again, alone
                self._unflushed_after = self._points  # once the take-back is committed
        self._attempts_total -= 1
        record.not_before_ms = now + delay_ms
        if delay_ms == 0:
            record.queued = True
            heapq.heappush(self._suspects_ready if record.suspect else self._ready, record.offset)
        else:
            heapq.heappush(self._backoff, (record.not_before_ms, record.offset))
        return AnswerResult(
            attempt_id,
            record.offset,
            None,
            _AVAILABLE,
            record.delivery_count,
            retry_at_ms=record.not_before_ms,
        )

    def expire(self, now_ms: int) -> list[AnswerResult]:
        """Release every ACQUIRED record whose lock deadline has passed (``ack=None``)."""
        now = self._tick(now_ms)
        live = self._live
        out: list[AnswerResult] = []
        while live:
            attempt_id, record = next(iter(live.items()))
            if record.lock_deadline_ms > now:
                break
            # A lock timeout is a release with no answer.
            verdict = self._decide_release(record, record.delivery_count + record.pending, None)
            error = ErrorInfo(
                LOCK_TIMEOUT,
                f"no answer within the lock duration of {self.config.lock_duration_ms} ms",
                None,
            )
            out.append(self._end_attempt(attempt_id, record, None, verdict, now, error))
        if out:
            self._version += 1
            self._changes += 1
        return out

    def _missing(self, attempt_id: str) -> LedgerError:
        """Tell an id we issued and retired (expired) from one we never issued (unknown)."""
        prefix = self._id_prefix
        if attempt_id.startswith(prefix):
            offset_text, sep, seq_text = attempt_id[len(prefix) :].partition(self._id_epoch)
            if (
                sep
                and offset_text.isdigit()
                and seq_text.isdigit()
                and int(seq_text) < self._next_seq
            ):
                return ExpiredAttempt(
                    f"attempt {attempt_id} is no longer live (lock expired, superseded, "
                    f"already answered or partition revoked)"
                )
        return UnknownAttempt(f"attempt {attempt_id} was not issued by {prefix}{self.epoch}")

    def revoke(self) -> CommitState:
        """The partition is revoked: fence every live attempt and return the state to commit.

        Write-ahead mode: in-flight attempts stay counted in the returned state (a crash or a
        rebalance costs at most the attempt in flight).  Horizon mode: they are not counted, and
        the state's horizon covers only what is unsettled (see `sidecar.core.ledger.horizon`: nothing in
        flight and no suspect left means no isolation pass for the next owner).  Their ids answer
        ExpiredAttempt from now on.
        """
        if self._horizon and not self._revoked:
            self._final = self._final_state()
        state = self.commit_state()
        if not self._revoked:
            self._revoked = True
            for record in self._live.values():
                enter(record, Event.FENCE)
                record.attempt_id = None
                record.pending = False
            self._live.clear()
            self._ready.clear()
            self._suspects_ready.clear()
            self._backoff.clear()
            self._archive.clear()
            self._version += 1
            self._changes += 1
        return state

    @property
    def in_flight(self) -> int:
        return len(self._live)

    @property
    def buffered(self) -> int:
        return len(self._records)

    @property
    def buffered_bytes(self) -> int:
        """The sizes (``add``'s ``size_bytes``) of the records held, in flight included."""
        return self._held_bytes

    @property
    def is_idle(self) -> bool:
        """Nothing held: every added record is done."""
        return not self._records

    @property
    def revoked(self) -> bool:
        return self._revoked

    def statistics(self) -> LedgerStats:
        acquired = len(self._live)
        return LedgerStats(
            topic=self.topic,
            partition=self.partition,
            available=len(self._records) - acquired - self._n_archiving,
            acquired=acquired,
            archiving=self._n_archiving,
            acknowledged_total=self._acknowledged_total,
            archived_total=self._archived_total,
            attempts_total=self._attempts_total,
            buffered=len(self._records),
            buffered_bytes=self._held_bytes,
            in_flight=acquired,
            paused=self._paused,
            committable_offset=self.committable_offset(),
            suspects=self._n_suspects,
            isolation_active=(
                self._isolating is not None
                or self._n_suspects > 0
                or self._unflushed_after is not None
            ),
        )
