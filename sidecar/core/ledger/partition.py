"""`PartitionLedger`: the delivery state of one assigned partition (sans-IO).

Owns the record lifecycle's calls (intake, hand-outs, answers, lock expiry, revoke) and builds the
ledger's parts (drawn in `PartitionLedger`'s docstring).  Must not import trio, confluent_kafka,
HTTP code or anything that performs I/O, and never reads a clock: callers pass ``now_ms``.
"""

from __future__ import annotations

from sidecar.core.commitstate import MAX_OFFSET, CommitState
from sidecar.core.ledger.archive import Archive
from sidecar.core.ledger.attempts import Attempts
from sidecar.core.ledger.flow import FlowControl
from sidecar.core.ledger.handout import HandOut
from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.horizon import Horizon
from sidecar.core.ledger.machine import Event, LedgerRecord, enter
from sidecar.core.ledger.metadata import CommitMetadata
from sidecar.core.ledger.values import (
    AnswerResult,
    ArchiveRequest,
    Attempt,
    CommitPoint,
    ExpiredAttempt,
    HorizonStatus,
    IllegalTransition,
    IsolationCharge,
    LedgerClosed,
    LedgerConfig,
    LedgerStats,
    RecordState,
)
from sidecar.core.outcome import (
    Accept,
    Ack,
    ArchiveReason,
    ErrorInfo,
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


class PartitionLedger:
    """Delivery state of one assigned partition: the record lifecycle's calls.

    Inputs are method calls (``add``, ``acquire``, ``answer``, ``not_attempted``, ``expire``, the
    ``dlq_*`` calls, ``revoke``; in horizon mode ``isolate`` and ``committed``); outputs are small
    frozen values.  An illegal call raises a `LedgerError` and leaves the ledger unchanged.  What is
    committable is derived from the records held, never stored.  Every operation is O(log n) or
    amortised O(1) (the hot path) but ``commit_state`` and the metadata size check, which walk the
    records held.  The parts, each owning its attributes; a call that touches several asks each::

        PartitionLedger   here: the calls; the clock, ``changes``, revoked
        ├── Attempts        attempts: the attempts in flight, their ids and lock-deadline order
        ├── Holdings        holdings: the records held, the ready / backoff heaps, key queues, bytes
        ├── Horizon         horizon: crash accounting (the horizon, suspects, the isolation pass)
        ├── CommitMetadata  metadata: the state to commit, its size counters, commit points
        ├── FlowControl     flow: pause / resume, the next deadline
        ├── Archive         archive: the DLQ side of archiving
        └── HandOut         handout: records out as attempts and back (answers, expiry, unsent)
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        start_offset: int,
        config: LedgerConfig | None = None,
        restored: CommitState | None = None,
        *,
        epoch: int = 0,
        tier: bool = False,
    ) -> None:
        """The state of a partition assigned at ``start_offset``, the committed offset.

        ``restored`` is the state decoded from its metadata.  ``epoch`` distinguishes attempt ids
        of successive assignments of the same partition (the caller passes a counter), so an
        answer from before a rebalance can never match an attempt made after it.  ``tier``: a
        retry tier's partition (its records come with due times): in horizon mode its horizon
        covers only what is due, so a death makes no suspect of a record still waiting.
        """
        if not 0 <= start_offset <= MAX_OFFSET:
            raise ValueError(f"start_offset out of range: {start_offset}")
        self.topic = topic
        self.partition = partition
        self.config = config = config if config is not None else LedgerConfig()
        self.epoch = epoch
        self._start_offset = start_offset
        self._now = 0
        self._revoked = False
        self._acknowledged_total = 0
        # Bumped by every call that may change what the state to commit measures (see
        # CommitMetadata.over: a measurement of the same version is reused).
        self._version = 0
        # Bumped by every call that may change what a scheduler turn gets from this ledger
        # (expire, acquire, to_archive, flow control, horizon_wanted, the next deadline): see
        # `changes`.
        self._changes = 0
        # The parts, each given what it needs (drawn in the class docstring).
        self._attempts = attempts = Attempts(topic, partition, epoch)
        self._live = live = attempts.live  # read here; only Attempts changes it
        self._holdings = holdings = Holdings(config, start_offset, restored)
        self._horizon = horizon = Horizon(config, holdings, start_offset, restored, due_only=tier)
        self._metadata = metadata = CommitMetadata(
            topic, partition, config, holdings, horizon, live, start_offset
        )
        self._flow = FlowControl(config, holdings, attempts, metadata)
        self._archive = Archive(topic, partition, holdings)
        self._handout = HandOut(
            topic, partition, config, attempts, holdings, horizon, metadata, self._archive
        )
        # Retry tiers: the latest due time of the records taken (`add`); fetching waits for it.
        self._waiting_until = 0

    @property
    def changes(self) -> int:
        """A counter bumped by every call that changes the ledger's state (intake, hand-outs,
        answers, expiry, DLQ outcomes, commit points and their confirmation, revoke).

        Between two equal readings, and before ``next_deadline_ms``, every query returns what it
        returned before: a scheduler may skip a partition whose counter has not moved.
        """
        return self._changes

    def _tick(self, now_ms: int) -> int:
        # A clock that steps back must not reorder lock deadlines (see Attempts).
        if now_ms > self._now:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._now = now_ms
        return self._now

    def _check_open(self) -> None:
        if self._revoked:
            raise LedgerClosed(f"{self.topic}/{self.partition}/ was revoked")

    def committable_offset(self) -> int:
        """The lowest offset that is not done: the offset to commit (next offset to read)."""
        return self._holdings.committable_offset()

    # -- intake and hand-outs ----------------------------------------------------------------

    def add(
        self,
        offset: int,
        key: bytes | None,
        item: object,
        now_ms: int,
        size_bytes: int = 0,
        *,
        base_count: int = 0,
        not_before_ms: int = 0,
        error: ErrorInfo | None = None,
    ) -> bool:
        """Take a fetched record.  Offsets must increase (gaps are fine).

        A retry tier's record comes with the count it reached before (``base_count``, unless the
        restored state counts it), its due time (``not_before_ms``: not handed out before; the
        partition asks to be paused, ``should_pause``, until every record taken so far is due)
        and the last error its release gave (the DLQ record's, should it end there).

        ``size_bytes`` is what holding it costs (``sidecar.core.budget.record_bytes``): counted in
        ``buffered_bytes`` until the record is done.  Returns False, keeping nothing, for an offset
        below the committed start offset, one not above the last added (a re-fetch), or one the
        restored state says is done.
        """
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        if self._revoked:
            self._check_open()
        holdings = self._holdings
        if offset <= holdings.last_added or offset < self._start_offset:
            return False
        if offset > MAX_OFFSET:
            raise ValueError(f"offset out of range: {offset}")
        if now_ms > self._now:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._now = now_ms
        self._version += 1
        self._changes += 1
        seq = holdings.fetched(offset)
        metadata = self._metadata
        if holdings.restored_done and holdings.in_restored_done(offset):
            metadata.done_restored(offset, seq)
            return False
        count = holdings.restored_count(offset) if holdings.restored_counts else 0
        count = max(count, base_count)
        record = LedgerRecord(offset, key, item, count, holdings.queue_key(key), seq, size_bytes)
        if not_before_ms:
            record.not_before_ms = not_before_ms
            record.error = error
            self._waiting_until = max(self._waiting_until, not_before_ms)
        may_go = holdings.hold(record)
        metadata.held(seq)
        crash = self._horizon
        if offset <= crash.suspect_top:
            crash.fetched(record)  # the previous owner may have handed it out and died
        if count:
            metadata.counted(offset, 0, count)
        if may_go:
            self._handout.make_ready(record, self._now)
        return True

    def skip(self, offset: int, now_ms: int) -> bool:
        """A fetched record done without a delivery (a retry tier's copy of a record already taken):
        committed past as a done one.  False, doing nothing, where ``add`` would keep nothing."""
        if self._revoked:
            self._check_open()
        holdings = self._holdings
        if offset <= holdings.last_added or offset < self._start_offset:
            return False
        self._tick(now_ms)
        self._version += 1
        self._changes += 1
        self._metadata.done_restored(offset, holdings.fetched(offset))
        return True

    def acquire(self, now_ms: int, max_n: int) -> list[Attempt]:
        """Hand out up to ``max_n`` records that may go now (ordering, backoff, lock limits)."""
        if self._revoked:
            self._check_open()
        now = self._tick(now_ms)
        holdings = self._holdings
        if holdings.backoff:
            self._changes += 1  # a retry time may have come: the ready set may change
            holdings.release_backoffs(now)
        out = self._handout.acquire(now, max_n, self._version)
        if out:
            self._version += len(out) + 1  # one per record handed out, and the batch
            self._changes += 1
        return out

    # -- answers and expiry ------------------------------------------------------------------

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
            raise self._attempts.not_live(attempt_id)
        now = self._now if now_ms < self._now else now_ms
        if now >= record.lock_deadline_ms:
            raise ExpiredAttempt(f"attempt {attempt_id}: lock expired at {record.lock_deadline_ms}")
        self._now = now
        self._version += 1
        self._changes += 1
        # The count with this attempt settled (horizon mode charges it only now).
        count = record.delivery_count + record.pending
        handout = self._handout
        if ack is _RELEASE:
            verdict = handout.decide_release(record, count, retry_after_ms)
        else:  # no delay to compute: the hot path (an accept) skips the retry policy's arguments
            verdict = decide(ack, count, self.config.delivery_count_limit)
        if verdict.__class__ is not Accept:
            return handout.answered(attempt_id, record, ack, verdict, count, now, error)
        enter(record, _ACCEPT)
        self._attempts.retire(attempt_id, record)
        self._acknowledged_total += 1
        if record.pending:
            record.pending = False  # done: its count is never written again
        if record.suspect:
            self._horizon.clear_suspect(record)
        handout.finish(record, now)
        return AnswerResult(attempt_id, record.offset, ack, _ACKNOWLEDGED, count)

    def not_attempted(self, attempt_id: str, now_ms: int, delay_ms: int = 0) -> AnswerResult:
        """The request could not be sent at all (connection refused): not an attempt.

        The delivery count goes back down and the record is AVAILABLE again after ``delay_ms``
        (the caller's own connection backoff; no delivery-count backoff applies).
        """
        record = self._live.get(attempt_id)
        if record is None:
            raise self._attempts.not_live(attempt_id)
        now = max(self._now, now_ms)
        if now >= record.lock_deadline_ms:
            raise ExpiredAttempt(f"attempt {attempt_id}: lock expired at {record.lock_deadline_ms}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        result = self._handout.not_attempted(attempt_id, record, now, delay_ms)
        self._now = now
        self._version += 1
        self._changes += 1
        return result

    def expire(self, now_ms: int) -> list[AnswerResult]:
        """Release every ACQUIRED record whose lock deadline has passed (``ack=None``)."""
        now = self._tick(now_ms)
        out = self._handout.expire(now)
        if out:
            self._version += 1
            self._changes += 1
        return out

    def revoke(self) -> CommitState:
        """The partition is revoked: fence every live attempt and return the state to commit.

        Write-ahead mode: in-flight attempts stay counted in the returned state (a crash or a
        rebalance costs at most the attempt in flight).  Horizon mode: they are not counted, and
        the state's horizon covers only what is unsettled (see `sidecar.core.ledger.horizon`: nothing in
        flight and no suspect left means no isolation pass for the next owner).  Their ids answer
        ExpiredAttempt from now on.
        """
        if self._horizon.enabled and not self._revoked:
            self._metadata.finish()
        state = self._metadata.commit_state()
        if not self._revoked:
            self._revoked = True
            self._attempts.fence()
            self._horizon.fence()
            self._holdings.drop_queued()
            self._archive.clear()
            self._version += 1
            self._changes += 1
        return state

    # -- crash accounting (horizon mode, see `sidecar.core.ledger.horizon`) -----------------

    def horizon_wanted(self) -> int | None:
        """Horizon mode: a commit is wanted now; the horizon its ``commit_point`` carries.

        Wanted when the hand-outs have used half the window beyond the committed horizon, or a
        ready record is held beyond it (the commit is asynchronous: hand-outs up to the committed
        horizon go on meanwhile), when a ready redelivery waits for the commit of the count its
        last outcome raised, and during the isolation pass when a charge or an outcome
        waits for its commit.  None otherwise, in write-ahead mode and after a revoke.
        """
        return self._horizon.wanted(self._revoked)

    @property
    def wants_isolation(self) -> bool:
        """A suspect is ready and nothing of it is charged or in flight: call ``isolate`` once
        nothing is in flight in the whole process (a death must charge only the isolated one)."""
        return (
            not self._revoked
            and self._horizon.isolating is None
            and self._holdings.next_suspect() is not None
        )

    def isolate(self, now_ms: int) -> IsolationCharge:
        """Charge the lowest ready suspect for an isolated delivery (horizon mode).

        Its delivery count goes up now, in memory: the next ``commit_point`` writes it, and once
        that point is ``committed`` the attempt is handed out.  Normal hand-outs of this partition
        stop until the pass is over.  Raises IllegalTransition in write-ahead mode, while an
        attempt of this partition is in flight or an isolation is under way, or with no suspect
        ready.
        """
        self._check_open()
        self._horizon.check_isolate()
        if self._live:
            raise IllegalTransition(
                f"{len(self._live)} attempts in flight: an isolated delivery goes alone"
            )
        now = self._tick(now_ms)
        holdings = self._holdings
        if holdings.backoff:
            holdings.release_backoffs(now)
        record = holdings.take_suspect()
        if record is None:
            raise IllegalTransition("no suspect is ready to be isolated")
        charge = self._handout.isolated(record)
        self._version += 1
        self._changes += 1
        return charge

    def committed(self, point: CommitPoint, now_ms: int) -> Attempt | None:
        """The broker confirmed ``point``: hand-outs may reach its horizon, and if it carried the
        charge of the record being isolated, that record's attempt is returned: send it."""
        self._check_open()
        if point.topic != self.topic or point.partition != self.partition:
            raise IllegalTransition(f"a commit point of {point.topic}/{point.partition}")
        crash = self._horizon
        record = crash.confirm(point)
        self._changes += 1
        if record is None:
            return None
        attempt = self._handout.charged(record, max(self._now, now_ms))
        self._tick(now_ms)
        self._version += 1
        self._changes += 1
        return attempt

    def horizon_status(self) -> HorizonStatus:
        return self._horizon.status(self._revoked)

    # -- commit metadata (see `sidecar.core.ledger.metadata`) --------------------------------

    def commit_state(self) -> CommitState:
        """The state to persist with ``committable_offset()``.

        Write-ahead mode: the counts of attempts in flight included.  Horizon mode: not included
        (only the isolated one's), and the horizon is the one the next commit point carries.
        """
        return self._metadata.commit_state()

    def encode_metadata(self) -> str:
        """The commit metadata string (may be a safe prefix encoding: see ``commitstate.encode``)."""
        return self._metadata.encode_metadata()

    def commit_point(self) -> CommitPoint:
        """What to commit now: offset, metadata (version 2 in horizon mode) and its horizon."""
        point = self._metadata.commit_point(self._revoked)
        if not self._revoked:
            self._changes += 1
        return point

    # -- flow control (see `sidecar.core.ledger.flow`) ---------------------------------------

    def should_pause(self, max_bytes: int | None = None) -> bool:
        """Stop fetching: too many records held, or ``max_bytes`` or more of them (the partition's
        share of the byte budget), locks exhausted, or metadata near its budget."""
        if self._waiting_until > self._now + self.config.tier_fetch_ahead_ms:
            return True  # a retry tier's records are not all due soon: fetch no further yet
        return self._flow.should_pause(max_bytes, self._version)

    def may_resume(self, max_bytes: int | None = None) -> bool:
        """Fetch again (hysteresis: half the buffer, half of ``max_bytes``, a free lock, metadata
        under 70%).  Never blocked by one record larger than ``max_bytes``: once it is done the
        partition holds nothing, and an empty partition may always resume."""
        if self._waiting_until > self._now + self.config.tier_fetch_ahead_ms:
            return False
        return self._flow.may_resume(max_bytes, self._version)

    def update_paused(self, max_bytes: int | None = None) -> bool:
        """Apply the hysteresis and return whether the partition should now be paused."""
        return self._flow.update(max_bytes, self._version)

    def next_lock_deadline_ms(self) -> int | None:
        """The earliest lock deadline of a live attempt, or None (retry times not included)."""
        return self._flow.next_lock_deadline_ms()

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which something changes by time alone, or None."""
        return self._flow.next_deadline_ms()

    # -- archiving, the DLQ side (see `sidecar.core.ledger.archive`) -------------------------

    def to_archive(self) -> list[ArchiveRequest]:
        """Records to write to the DLQ; each is returned once (again after ``dlq_failed``)."""
        return self._archive.to_archive()

    def dlq_written(self, offset: int) -> None:
        """The DLQ record of ``offset`` is confirmed (or no DLQ is configured): ARCHIVED, done."""
        self._check_open()
        record = self._archive.written(offset)
        self._version += 1
        self._changes += 1
        self._handout.finish(record, self._now)

    def dlq_failed(self, offset: int) -> None:
        """A retriable DLQ write failure: ``to_archive`` hands the record out again."""
        self._check_open()
        self._archive.failed(offset)
        self._changes += 1

    def dlq_withheld(self, offset: int, now_ms: int) -> None:
        """The DLQ circuit breaker held the write of ``offset``: AVAILABLE again, for one more
        delivery (not done, so nothing is committed past it meanwhile).

        Its count continues, and it goes out even at the limit (``_make_ready``'s check is not
        applied): the breaker judged the answers that sent it to the DLQ untrustworthy. An answer
        to that delivery other than an accept archives it as usual (the limit is reached).
        """
        self._check_open()
        record = self._archive.withheld(offset)
        self._tick(now_ms)
        self._version += 1
        self._changes += 1
        record.not_before_ms = self._now
        self._holdings.queue(record)  # archiving cleared it as a suspect

    # -- what it holds -----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._live)

    @property
    def buffered(self) -> int:
        return len(self._holdings.records)

    @property
    def buffered_bytes(self) -> int:
        """The sizes (``add``'s ``size_bytes``) of the records held, in flight included."""
        return self._holdings.held_bytes

    @property
    def is_idle(self) -> bool:
        """Nothing held: every added record is done."""
        return not self._holdings.records

    @property
    def revoked(self) -> bool:
        return self._revoked

    def statistics(self) -> LedgerStats:
        acquired = len(self._live)
        held = len(self._holdings.records)
        archive = self._archive
        crash = self._horizon
        return LedgerStats(
            topic=self.topic,
            partition=self.partition,
            available=held - acquired - archive.n_archiving,
            acquired=acquired,
            archiving=archive.n_archiving,
            acknowledged_total=self._acknowledged_total,
            archived_total=archive.archived_total,
            attempts_total=self._attempts.total,
            buffered=held,
            buffered_bytes=self._holdings.held_bytes,
            in_flight=acquired,
            paused=self._flow.paused,
            committable_offset=self._holdings.committable_offset(),
            suspects=crash.n_suspects,
            isolation_active=crash.busy or crash.n_suspects > 0,
        )
