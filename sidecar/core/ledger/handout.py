"""The hand-out of one partition's ledger: a record out as an attempt, and back with its outcome.

`HandOut` is a part of `sidecar.core.ledger.partition.PartitionLedger`, built in its constructor
with the parts it changes: ready records become attempts (`acquire`; an isolated suspect:
`isolated`, then `charged`), and an attempt ends with an answer other than an accept
(`answered`), a lock expiry (`expire`) or unsent (`not_attempted`): AVAILABLE again, or archived;
`finish` once it is done.  The ledger checks each call, keeps the clock and its counters.
Must not import trio or anything that performs I/O, and never reads a clock.
"""

from __future__ import annotations

import heapq

from sidecar.core.backoff import jitter_rand
from sidecar.core.ledger.archive import Archive
from sidecar.core.ledger.attempts import Attempts
from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.horizon import Horizon
from sidecar.core.ledger.machine import Event, LedgerRecord, enter
from sidecar.core.ledger.metadata import MAX_ENTRY_CHARS, PAUSE_FILL, CommitMetadata
from sidecar.core.ledger.values import (
    AnswerResult,
    Attempt,
    IsolationCharge,
    LedgerConfig,
    RecordState,
)
from sidecar.core.outcome import (
    COUNT_EXHAUSTED,
    LOCK_TIMEOUT,
    Ack,
    ArchiveReason,
    DeadLetter,
    ErrorInfo,
    KeepLock,
    Redeliver,
    Verdict,
    decide,
)

__all__ = ["HandOut"]

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVING = RecordState.ARCHIVING
_ACKNOWLEDGED = RecordState.ACKNOWLEDGED
_RELEASE = Ack.RELEASE
_REJECTED = ArchiveReason.REJECTED
_ACQUIRE = Event.ACQUIRE
_ACCEPT = Event.ACCEPT
_RELEASE_EVENT = Event.RELEASE


class HandOut:
    """Hand-outs of one partition's ledger (see the module docstring)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        config: LedgerConfig,
        attempts: Attempts,
        holdings: Holdings,
        horizon: Horizon,
        metadata: CommitMetadata,
        archive: Archive,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._config = config
        self._attempts = attempts
        self._live = attempts.live  # read here; only Attempts changes it
        self._holdings = holdings
        self._horizon = horizon
        self._metadata = metadata
        self._archive = archive

    def acquire(self, now: int, max_n: int, version: int) -> list[Attempt]:
        """Up to ``max_n`` ready records as attempts locked until ``now`` plus the lock duration.

        ``version`` is the ledger's state version (the metadata's measurement is reused within
        one); it goes up by one per record handed out, which the ledger adds once done.
        """
        holdings = self._holdings
        crash = self._horizon
        if crash.busy or (holdings.suspects_ready and holdings.next_suspect() is not None):
            return []  # the isolation pass goes first, and alone
        live = self._live
        config = self._config
        room = min(max_n, config.max_record_locks - len(live))
        # Holdings' ready heap: the one container of a part this module changes itself (the loop
        # pops what it hands out), because a call per record would cost the hot path.
        ready = holdings.ready
        if room <= 0 or not ready:
            return []
        horizon = crash.enabled
        confirmed = crash.confirmed
        metadata = self._metadata
        records = holdings.records
        deadline = now + config.lock_duration_ms
        topic = self._topic
        partition = self._partition
        out: list[Attempt] = []
        append = out.append
        # Locals: this loop runs once per record handed out (the hot path).
        heappop = heapq.heappop
        get = records.get
        attempts = self._attempts
        pause_chars = config.metadata_max_bytes * PAUSE_FILL
        allowance = 0
        # What the loop changes in the parts, added up and handed over before the metadata is
        # measured and at the end: the highest offset handed out (horizon) or counted
        # (write-ahead), and the change in count runs (write-ahead).
        top = -1
        runs = 0
        while ready and len(out) < room:
            offset = ready[0]
            record = get(offset)
            if record is None or not record.queued:
                heappop(ready)  # stale entry
                continue
            if horizon and offset > confirmed:
                # Beyond the committed horizon: held until its commit (the horizon fell behind).
                crash.held_beyond(offset)
                break
            if horizon and record.counted_after >= crash.stored_serial:
                # A redelivery: its count (raised by its last outcome) goes out once committed,
                # or a death would restore the count below the one the app saw last (a commit
                # is wanted now: see `horizon_wanted`). Its own raise, not the partition's
                # latest: a stream of other outcomes never holds it back for more than a commit.
                crash.hold_for_count(record.counted_after)
                break
            if allowance <= 0:
                if horizon:
                    crash.handed(top)
                else:
                    metadata.counted_runs(runs, top)
                    runs = 0
                # Near the metadata budget, a first attempt (a new count entry) may only go for
                # the lowest record (it frees the most); records already counted always may.
                estimate = metadata.estimate()
                if estimate > pause_chars:
                    if (
                        record.delivery_count == 0
                        and metadata.over(PAUSE_FILL, version)
                        and offset != next(iter(records))
                    ):
                        break
                else:
                    # An acquisition adds at most MAX_ENTRY_CHARS to either estimate: that many
                    # need no new estimate.
                    allowance = int(pause_chars - estimate) // MAX_ENTRY_CHARS
            allowance -= 1
            enter(record, _ACQUIRE)
            version += 1
            heappop(ready)
            record.queued = False
            if offset > top:  # noqa: PLR1730 (hot path: no max() call)
                top = offset
            if horizon:
                # Not counted until its outcome is known: a death does not charge it.
                record.pending = True
                count = record.delivery_count + 1
            else:
                count = record.delivery_count + 1
                record.delivery_count = count
                # CommitMetadata.recount(offset, count - 1, count), inlined: the hot path.
                neighbour = get(offset - 1)
                left = neighbour.delivery_count if neighbour is not None else 0
                neighbour = get(offset + 1)
                right = neighbour.delivery_count if neighbour is not None else 0
                runs += 1 - (left == count) - (right == count)
                if count > 1:
                    runs -= 1 - (left == count - 1) - (right == count - 1)
            attempt_id = attempts.issue(record, deadline)
            append(
                Attempt(
                    topic, partition, offset, attempt_id, count, deadline, record.key, record.item
                )
            )
        if horizon:
            crash.handed(top)
        else:
            metadata.counted_runs(runs, top)
        return out

    def isolated(self, record: LedgerRecord) -> IsolationCharge:
        """Charge the suspect ``record`` for its isolated delivery (horizon mode)."""
        count = record.delivery_count
        record.delivery_count = count + 1
        self._metadata.counted(record.offset, count, count + 1)
        self._horizon.charge(record)
        return IsolationCharge(self._topic, self._partition, record.offset, count + 1)

    def charged(self, record: LedgerRecord, now: int) -> Attempt:
        """The isolated ``record``'s charge is committed: its attempt, handed out now."""
        enter(record, _ACQUIRE)
        crash = self._horizon
        crash.hand_out(record)
        deadline = now + self._config.lock_duration_ms
        attempt_id = self._attempts.issue(record, deadline)
        crash.handed(record.offset)
        return Attempt(
            self._topic,
            self._partition,
            record.offset,
            attempt_id,
            record.delivery_count,
            deadline,
            record.key,
            record.item,
        )

    def not_attempted(
        self, attempt_id: str, record: LedgerRecord, now: int, delay_ms: int
    ) -> AnswerResult:
        """The attempt was never sent: back to AVAILABLE after ``delay_ms``, its charge taken back."""
        enter(record, Event.NOT_ATTEMPTED)
        attempts = self._attempts
        attempts.retire(attempt_id, record)
        attempts.not_sent()
        if record.pending:
            record.pending = False  # nothing was charged for it
        else:
            # Write-ahead, or an isolated attempt: take its charge back.  The next commit writes
            # the lower count again (a death before it leaves the charge: see the invariants).
            record.delivery_count -= 1
            self._metadata.recount(record.offset, record.delivery_count + 1, record.delivery_count)
            # An isolated attempt: still a suspect, it goes again, alone, once the take-back
            # is committed.
            self._horizon.take_back(record)
        record.not_before_ms = now + delay_ms
        if delay_ms == 0:
            self._holdings.queue(record)
        else:
            self._holdings.back_off(record)
        return AnswerResult(
            attempt_id,
            record.offset,
            None,
            _AVAILABLE,
            record.delivery_count,
            retry_at_ms=record.not_before_ms,
        )

    # -- answers and expiry ------------------------------------------------------------------

    def answered(
        self,
        attempt_id: str,
        record: LedgerRecord,
        ack: Ack,
        verdict: Verdict,
        count: int,
        now: int,
        error: ErrorInfo | None,
    ) -> AnswerResult:
        """An answer other than an accept (the ledger applies those itself: the hot path), as
        ``verdict`` says: the lock renewed, or the attempt over (redelivered or dead-lettered)."""
        if verdict.__class__ is KeepLock:
            self._attempts.renew(attempt_id, record, now + self._config.lock_duration_ms)
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
        record: LedgerRecord,
        ack: Ack | None,
        verdict: Verdict,
        now: int,
        error: ErrorInfo | None,
    ) -> AnswerResult:
        """A live attempt ends without an accept: dead-lettered or redelivered, as ``verdict`` says."""
        self._attempts.retire(attempt_id, record)
        if record.pending or record.suspect:
            self._settle(record)
        if isinstance(verdict, DeadLetter):
            reason = verdict.reason
            if reason is _REJECTED:
                record.error = error  # the reject's own account, or none
            elif error is not None:
                record.error = error  # else the last release's account stays
            self.start_archiving(record, reason, record.error)
            return AnswerResult(
                attempt_id, record.offset, ack, _ARCHIVING, record.delivery_count, reason=reason
            )
        assert isinstance(verdict, Redeliver)
        if error is not None:
            record.error = error
        threshold = self._config.tier_threshold_ms
        if threshold is not None and verdict.delay_ms > threshold:
            # A long delay leaves this ledger: written to a retry tier, then done here.
            record.tier_delay_ms = verdict.delay_ms
            self.start_archiving(record, ArchiveReason.RETRY_TIER, record.error)
            return AnswerResult(
                attempt_id,
                record.offset,
                ack,
                _ARCHIVING,
                record.delivery_count,
                reason=ArchiveReason.RETRY_TIER,
            )
        enter(record, _RELEASE_EVENT)
        record.not_before_ms = now + verdict.delay_ms
        if verdict.delay_ms <= 0:
            self._holdings.queue(record)  # settled: never a suspect here
        else:
            self._holdings.back_off(record)
        return AnswerResult(
            attempt_id,
            record.offset,
            ack,
            _AVAILABLE,
            record.delivery_count,
            retry_at_ms=record.not_before_ms,
        )

    def decide_release(
        self, record: LedgerRecord, count: int, retry_after_ms: int | None
    ) -> Verdict:
        """`outcome.decide` for a release (or a lock expiry) of the ``count``-th attempt."""
        return decide(
            _RELEASE,
            count,
            self._config.delivery_count_limit,
            retry=self._config.retry,
            rand=jitter_rand(record.offset, count),
            retry_after_ms=retry_after_ms,
        )

    def expire(self, now: int) -> list[AnswerResult]:
        """Release every attempt whose lock deadline has passed (``ack=None``)."""
        live = self._live
        out: list[AnswerResult] = []
        while live:
            attempt_id, record = next(iter(live.items()))
            if record.lock_deadline_ms > now:
                break
            # A lock timeout is a release with no answer.
            verdict = self.decide_release(record, record.delivery_count + record.pending, None)
            error = ErrorInfo(
                LOCK_TIMEOUT,
                f"no answer within the lock duration of {self._config.lock_duration_ms} ms",
                None,
            )
            out.append(self._end_attempt(attempt_id, record, None, verdict, now, error))
        return out

    # -- readiness and the end of a record ---------------------------------------------------

    def make_ready(self, record: LedgerRecord, now: int) -> None:
        """A record may go: ready, backing off until its due time, or (at the limit) archived."""
        limit = self._config.delivery_count_limit
        if record.delivery_count >= limit:
            # Restored at the limit: the last attempt's outcome was lost in a crash or a
            # rebalance.  Archiving now is what bounds a poison pill that kills the pod.
            self.start_archiving(
                record,
                ArchiveReason.DELIVERY_COUNT_EXCEEDED,
                ErrorInfo(
                    COUNT_EXHAUSTED,
                    f"delivery count {record.delivery_count} reached the limit "
                    f"{limit} before a restart or rebalance",
                    None,
                ),
            )
            return
        if record.not_before_ms > now:
            self._holdings.back_off(record)  # a retry tier's record, not due yet
            return
        self._holdings.queue(record)

    def start_archiving(
        self, record: LedgerRecord, reason: ArchiveReason, error: ErrorInfo | None
    ) -> None:
        self._archive.start(record, reason, error)
        if record.suspect:
            self._horizon.clear_suspect(record)  # restored at the limit: no delivery, DLQ now

    def _settle(self, record: LedgerRecord) -> None:
        """The outcome of the record's attempt is known (not an accept): charge it if pending."""
        if record.pending:
            record.pending = False
            count = record.delivery_count
            record.delivery_count = count + 1
            self._metadata.counted(record.offset, count, count + 1)
            record.counted_after = self._horizon.points
        if record.suspect:
            self._horizon.clear_suspect(record)

    def finish(self, record: LedgerRecord, now: int) -> None:
        """The record is done: it leaves the holdings; the next of its key may go."""
        self._metadata.done(record)  # before it leaves: the lowest record held may be this one
        following = self._holdings.remove(record)
        if following is not None:
            self.make_ready(following, now)
