"""The per-partition delivery ledger: every record state transition lives here (sans-IO).

One :class:`PartitionLedger` per assigned partition tracks the records fetched from it through the
lifecycle of SPEC §2 (a KIP-932 share group, run by the sidecar itself)::

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

This module must not import trio, confluent_kafka, HTTP code or anything that performs I/O, and it
never reads a clock: callers pass ``now_ms`` (a monotonic clock in milliseconds).  It is the hot
path, so every operation is O(log n) or amortised O(1); only ``commit_state`` and the metadata
size check walk the records held (bounded by ``max_buffered_records``).

Flow control (``should_pause`` / ``may_resume``) bounds the records held by count and, when the
caller passes the partition's share of the byte budget (``sidecar.core.budget``), by their sizes:
``add`` takes each record's size and ``buffered_bytes`` is the sum over the records not done.

Crash accounting
----------------
SPEC §3: a record that kills the process (or the pod) on every delivery reaches the DLQ after at
most ``limit + 1`` deaths, and no other record is dead-lettered, or has its count raised, because
of those deaths.  ``LedgerConfig.crash_accounting`` selects how:

``WRITE_AHEAD`` (what the engine does today): ``acquire`` counts the attempt, the caller commits
the state (counts of attempts in flight included, metadata version 1) before handing it out.  Every
record in flight at a death is charged that attempt.

``HORIZON``: the committed state carries a *horizon* H (metadata version 2), meaning "every offset
above H that is not done was never handed out".  Then:

- *Normal delivery.*  ``acquire`` hands out records up to the confirmed horizon without any commit;
  an attempt's count is *pending*: it is charged (``delivery_count`` goes up) only when its outcome
  is known -- a release, a lock expiry or a reject -- and never for a death.  ``commit_state``
  writes settled counts only.  The horizon runs ahead of the hand-outs by ``horizon_window``
  offsets (default ``max_record_locks``): ``horizon_wanted()`` asks for a commit once the
  hand-outs have used half of it (or a ready record is held beyond it), the caller commits a
  ``commit_point()`` asynchronously and reports it with ``committed()``.  A record waits for a
  commit only when that commit fell behind (or after an offset jump wider than half the window,
  e.g. a compaction gap), never in steady state.
- *Suspects.*  After an unclean stop (a death, a lost partition, a revoke with answers lost) the
  next owner restores H: every not-done record at or below it may have been in flight and is a
  *suspect*.  Suspects are few: those in flight, in backoff or held by key order, plus at most a
  window of records never delivered.
- *Isolation pass.*  While a suspect is ready, ``acquire`` hands out nothing for the partition.
  ``isolate()`` (allowed only with nothing of this partition in flight, and the caller makes sure
  nothing is in flight in the whole process) takes the lowest ready suspect and raises its count in
  memory (write-ahead, exactly as today); the next ``commit_point()`` carries it in the version-2
  header, where a prefix encoding cannot drop it; ``committed()`` of that point returns its
  :class:`Attempt`.  A death now charges that record and nothing else.  A suspect is *settled*
  once its isolated attempt has an outcome (any answer or a lock expiry: its count is then exact
  and persisted, and it leaves the pass even if it waits for a retry); ``not_attempted`` takes
  the charge back and it stays a suspect.  The outcome (or the take-back) is committed before
  anything else of the partition goes out (``IsolationPhase.SETTLING``): else a death caused by
  the next record would find the isolated one still charged and not done, and charge it again.
  The next suspect may be charged meanwhile: one commit then carries both (one commit a suspect).
  Suspects are taken in offset order, so key order holds;
  one blocked behind a record waiting for a retry (``IsolationPhase.WAITING``) does not hold the
  rest of the partition.  The pass is over when no fetched suspect is left; suspects fetched later
  (still at or below H) reopen it.  Restored at the limit, a suspect is archived with no delivery.
- *Killer.*  Its first death happens in normal delivery and charges no one; every later one happens
  with it alone in flight and charged: it is archived when restored at ``limit``, after
  ``limit + 1`` deaths.  Innocent suspects are charged only for isolated attempts whose outcome is
  known, or for a death while they are the one isolated (then they were alone in flight: that
  death was theirs, or not caused by a record).
- *Revoke.*  The final state (``revoke()``) charges nothing in flight and lowers H to what is
  unsettled: the highest offset still in flight (its answer is lost), and the restored H while
  suspects are left.  A revoke with nothing in flight and no suspect leaves H below the base: the
  next owner has no pass.  A charge not yet handed out is taken back.  (The caller should let the
  app answer what is in flight before revoking; a clean shutdown is a revoke of every partition.)
- *Records in backoff* (released, count > 0) are settled: their counts are exact.  They are
  suspects after a death only because one may have been redelivered; isolating them costs time,
  never a count that is not theirs.
- *Transactional DLQ*: a commit point can go with the open transaction
  (``send_offsets_to_transaction``); ``committed()`` once the transaction commits.
- *Metadata size*: version 2 adds at most 24 bytes of header (horizon and the charged count); the
  size checks count them.  A version-1 state restored in horizon mode (or none) has no horizon:
  counts as stored, no pass.  A version-2 state restored in write-ahead mode: counts as stored,
  the horizon ignored.  Builds before version 2 read version 2 as foreign: redelivery, no loss.

Error hierarchy::

    LedgerError
    ├── UnknownAttempt      an attempt id this ledger never issued
    ├── ExpiredAttempt      lock expired, attempt superseded, already answered, or partition revoked
    ├── IllegalTransition   e.g. dlq_written for a record that is not being archived
    └── LedgerClosed        the partition was revoked
"""

from __future__ import annotations

import enum
import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields

from sidecar.core.backoff import RetryPolicy
from sidecar.core.commitstate import (
    MAX_OFFSET,
    CommitState,
    chars_for_payload,
    encode,
    encoded_length,
    payload_bound,
)
from sidecar.core.errors import SidecarError
from sidecar.core.outcome import COUNT_EXHAUSTED, LOCK_TIMEOUT, Ack, ArchiveReason, ErrorInfo

__all__ = [
    "Ack",
    "AnswerResult",
    "ArchiveReason",
    "ArchiveRequest",
    "Attempt",
    "CommitPoint",
    "CrashAccounting",
    "ErrorInfo",
    "ExpiredAttempt",
    "HorizonStatus",
    "IllegalTransition",
    "IsolationCharge",
    "IsolationPhase",
    "LedgerClosed",
    "LedgerConfig",
    "LedgerError",
    "LedgerStats",
    "Ordering",
    "PartitionLedger",
    "RecordState",
    "UnknownAttempt",
]


class RecordState(enum.Enum):
    AVAILABLE = "available"
    ACQUIRED = "acquired"
    ACKNOWLEDGED = "acknowledged"
    ARCHIVING = "archiving"
    ARCHIVED = "archived"


class Ordering(enum.StrEnum):
    """`ordering` (SPEC §4); the configuration uses this enum too, so there is one copy."""

    KEY = "key"
    PARTITION = "partition"
    NONE = "none"


class CrashAccounting(enum.Enum):
    """How a delivery is counted against a death (see the module docstring)."""

    WRITE_AHEAD = "write_ahead"  # every hand-out counted and committed before it leaves
    HORIZON = "horizon"  # a horizon committed ahead; suspects isolated after a death


class IsolationPhase(enum.Enum):
    """Where the partition's isolation pass is (horizon mode)."""

    NONE = "none"  # no suspect left: normal delivery
    READY = "ready"  # a suspect may be isolated (once nothing is in flight in the process)
    CHARGED = "charged"  # its count is raised in memory: commit, then it is handed out
    IN_FLIGHT = "in_flight"  # the isolated attempt is with the app
    SETTLING = "settling"  # its outcome is known: commit it before anything else goes out
    WAITING = "waiting"  # suspects left, none ready (backoff, or key order behind a record)


class LedgerError(SidecarError):
    """Root of the ledger's errors; the ledger is unchanged when one is raised."""


class UnknownAttempt(LedgerError):
    """The attempt id was never issued by this ledger."""


class ExpiredAttempt(LedgerError):
    """The attempt's lock expired, it was superseded or already answered, or it was fenced."""


class IllegalTransition(LedgerError):
    """The call does not apply to the record's current state."""


class LedgerClosed(LedgerError):
    """The partition was revoked: the ledger takes no more records."""


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Per-partition limits.  Names follow the seeds' ``share.*`` properties where they exist."""

    delivery_count_limit: int = 5
    lock_duration_ms: int = 30_000
    max_record_locks: int = 2000
    max_buffered_records: int = 10_000
    ordering: Ordering = Ordering.KEY
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    metadata_max_bytes: int = 4096
    crash_accounting: CrashAccounting = CrashAccounting.WRITE_AHEAD
    #: Horizon mode: how many offsets the committed horizon runs ahead of the hand-outs (None:
    #: ``max_record_locks``).  After a death at most about this many never-delivered records are
    #: suspects besides those in flight; a commit is wanted when half of it is used.
    horizon_window: int | None = None

    @property
    def window(self) -> int:
        return self.max_record_locks if self.horizon_window is None else self.horizon_window

    def __post_init__(self) -> None:
        if self.delivery_count_limit < 1:
            raise ValueError(f"delivery_count_limit must be >= 1, got {self.delivery_count_limit}")
        if self.lock_duration_ms < 1:
            raise ValueError(f"lock_duration_ms must be >= 1, got {self.lock_duration_ms}")
        if self.max_record_locks < 1:
            raise ValueError(f"max_record_locks must be >= 1, got {self.max_record_locks}")
        if self.max_buffered_records < 1:
            raise ValueError(f"max_buffered_records must be >= 1, got {self.max_buffered_records}")
        # Below ~64 characters not even a handful of counts fit; the default is 4096.
        if self.metadata_max_bytes < 64:
            raise ValueError(f"metadata_max_bytes must be >= 64, got {self.metadata_max_bytes}")
        if not isinstance(self.ordering, Ordering):
            raise ValueError(f"ordering must be an Ordering, got {self.ordering!r}")
        if not isinstance(self.crash_accounting, CrashAccounting):
            raise ValueError(
                f"crash_accounting must be a CrashAccounting, got {self.crash_accounting!r}"
            )
        if self.horizon_window is not None and self.horizon_window < 2:
            raise ValueError(f"horizon_window must be >= 2, got {self.horizon_window}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One hand-over of a record to the application."""

    topic: str
    partition: int
    offset: int
    attempt_id: str
    delivery_count: int
    lock_deadline_ms: int
    key: bytes | None
    item: object


@dataclass(frozen=True, slots=True)
class AnswerResult:
    """What an answer (or a lock expiry, ``ack=None``) did to the record."""

    attempt_id: str
    offset: int
    ack: Ack | None
    state: RecordState
    delivery_count: int
    lock_deadline_ms: int | None = None  # ACQUIRED (renew)
    retry_at_ms: int | None = None  # AVAILABLE again: not before this time
    reason: ArchiveReason | None = None  # ARCHIVING


@dataclass(frozen=True, slots=True)
class ArchiveRequest:
    """A record to write to the DLQ; answer with ``dlq_written`` or ``dlq_failed``."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    item: object
    delivery_count: int
    reason: ArchiveReason
    error: ErrorInfo | None


@dataclass(frozen=True, slots=True)
class LedgerStats:
    topic: str
    partition: int
    available: int
    acquired: int
    archiving: int
    acknowledged_total: int
    archived_total: int
    attempts_total: int
    buffered: int
    in_flight: int
    paused: bool
    committable_offset: int
    suspects: int = 0  # horizon mode: records of the isolation pass not yet settled
    isolation_active: bool = False
    buffered_bytes: int = 0  # the sizes of the records held (see PartitionLedger.add)


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """What to commit for one partition; after the broker confirms it, pass it to ``committed``.

    Points must be committed in the order they were made (one commit at a time, as the engine's
    commit guard does): a horizon committed after a higher one would take hand-outs back.
    """

    topic: str
    partition: int
    offset: int
    metadata: str
    horizon: int | None  # horizon mode: hand-outs may reach it once this commit is confirmed
    charged: int | None = None  # horizon mode: its count is written ahead of its isolated delivery
    charged_count: int | None = None
    serial: int = 0  # how many points the ledger had made, this one included


@dataclass(frozen=True, slots=True)
class IsolationCharge:
    """A suspect's count was raised for an isolated delivery: commit, then ``committed`` sends it."""

    topic: str
    partition: int
    offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class HorizonStatus:
    """Horizon-mode state for the engine, ``/v1/status`` and metrics (derived on each call)."""

    mode: CrashAccounting
    horizon_committed: int | None  # hand-outs go up to this offset without waiting
    horizon_wanted: int | None  # commit a point now: the horizon it would carry
    held: bool  # a ready record waits for the horizon commit (it fell behind)
    isolation: IsolationPhase
    isolating_offset: int | None  # CHARGED / IN_FLIGHT
    suspects_left: int
    suspects_total: int  # suspects met so far in this assignment
    isolated_total: int  # isolated attempts that ended (answer, expiry or revoke)

    @property
    def pass_active(self) -> bool:
        return self.isolation is not IsolationPhase.NONE


# Sentinel queue key: the record is not ordered against any other (NONE mode, or a null key).
_UNORDERED = object()
# Metadata fill (fraction of metadata_max_bytes) at which a partition pauses / may resume.
_PAUSE_FILL = 0.9
_RESUME_FILL = 0.7
# An acquisition changes one count: at most two more count runs of 9 + 9 + 3 raw bytes each (gap,
# length, count < 2**21), 63 characters with the estimate's 1.5 factor (base64 is 4/3).
_MAX_ENTRY_CHARS = 64
_PARTITION = object()
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


def _vlen(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


class _Record:
    __slots__ = (
        "attempt_id",
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


_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVING = RecordState.ARCHIVING
_ACKNOWLEDGED = RecordState.ACKNOWLEDGED
_ACCEPT = Ack.ACCEPT

# The generated __init__ of a frozen dataclass sets each field through object.__setattr__, which
# costs about 2 us per 8-field object: a third of the hot path.  These build the same frozen
# objects through the slot descriptors instead (tests check they equal the normal constructor).
_new = object.__new__
(
    _set_attempt_topic,
    _set_attempt_partition,
    _set_attempt_offset,
    _set_attempt_id,
    _set_attempt_count,
    _set_attempt_deadline,
    _set_attempt_key,
    _set_attempt_item,
) = (getattr(Attempt, f.name).__set__ for f in fields(Attempt))
(
    _set_result_id,
    _set_result_offset,
    _set_result_ack,
    _set_result_state,
    _set_result_count,
    _set_result_deadline,
    _set_result_retry_at,
    _set_result_reason,
) = (getattr(AnswerResult, f.name).__set__ for f in fields(AnswerResult))


def _attempt(
    topic: str,
    partition: int,
    offset: int,
    attempt_id: str,
    delivery_count: int,
    lock_deadline_ms: int,
    key: bytes | None,
    item: object,
) -> Attempt:
    attempt: Attempt = _new(Attempt)
    _set_attempt_topic(attempt, topic)
    _set_attempt_partition(attempt, partition)
    _set_attempt_offset(attempt, offset)
    _set_attempt_id(attempt, attempt_id)
    _set_attempt_count(attempt, delivery_count)
    _set_attempt_deadline(attempt, lock_deadline_ms)
    _set_attempt_key(attempt, key)
    _set_attempt_item(attempt, item)
    return attempt


def _result(
    attempt_id: str,
    offset: int,
    ack: Ack | None,
    state: RecordState,
    delivery_count: int,
    lock_deadline_ms: int | None = None,
    retry_at_ms: int | None = None,
    reason: ArchiveReason | None = None,
) -> AnswerResult:
    result: AnswerResult = _new(AnswerResult)
    _set_result_id(result, attempt_id)
    _set_result_offset(result, offset)
    _set_result_ack(result, ack)
    _set_result_state(result, state)
    _set_result_count(result, delivery_count)
    _set_result_deadline(result, lock_deadline_ms)
    _set_result_retry_at(result, retry_at_ms)
    _set_result_reason(result, reason)
    return result


class PartitionLedger:
    """Delivery state of one assigned partition.  See the module docstring."""

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
        """``start_offset`` is the committed offset; ``restored`` the state decoded from its
        metadata.  ``epoch`` distinguishes attempt ids of successive assignments of the same
        partition (the caller passes a counter), so an answer from before a rebalance can never
        match an attempt made after it."""
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

        # Horizon mode (see the module docstring).  Every offset handed out in this assignment is
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

        # Metadata size tracking (see _metadata_over): O(1) counters give a structural bound of
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
        self._measured_version = -1
        self._measured_chars = 0
        self._measured_raw = 0
        self._measure()  # a restored state may start near the budget

    # -- intake ----------------------------------------------------------------------------------

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

    # -- acquisition -----------------------------------------------------------------------------

    def acquire(self, now_ms: int, max_n: int) -> list[Attempt]:
        """Hand out up to ``max_n`` records that may go now (ordering, backoff, lock limits)."""
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        now = self._tick(now_ms)
        if self._backoff:
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
        pause_chars = self.config.metadata_max_bytes * _PAUSE_FILL
        allowance = 0
        while ready and len(out) < room:
            offset = ready[0]
            record = records.get(offset)
            if record is None or not record.queued:
                heapq.heappop(ready)  # stale entry
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
            self._version += 1
            heapq.heappop(ready)
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
                neighbour = records.get(offset - 1)
                left = neighbour.delivery_count if neighbour is not None else 0
                neighbour = records.get(offset + 1)
                right = neighbour.delivery_count if neighbour is not None else 0
                runs = 1 - (left == count) - (right == count)
                if count > 1:
                    runs -= 1 - (left == count - 1) - (right == count - 1)
                self._n_count_runs += runs
            seq = self._next_seq
            self._next_seq = seq + 1
            attempt_id = f"{self._id_prefix}{offset}{self._id_epoch}{seq}"
            record.attempt_id = attempt_id
            record.lock_deadline_ms = deadline
            record.state = _ACQUIRED
            live[attempt_id] = record
            out.append(
                _attempt(
                    topic, partition, offset, attempt_id, count, deadline, record.key, record.item
                )
            )
        if out:
            self._attempts_total += len(out)
            self._version += 1
        return out

    def _release_backoffs(self, now: int) -> None:
        backoff = self._backoff
        while backoff and backoff[0][0] <= now:
            not_before, offset = heapq.heappop(backoff)
            record = self._records.get(offset)
            if (
                record is not None
                and record.state is _AVAILABLE
                and not record.queued
                and record.not_before_ms == not_before
            ):
                record.queued = True
                heapq.heappush(self._suspects_ready if record.suspect else self._ready, offset)

    # -- answers ---------------------------------------------------------------------------------

    def answer(
        self,
        attempt_id: str,
        ack: Ack,
        now_ms: int,
        error: ErrorInfo | None = None,
        retry_after_ms: int | None = None,
    ) -> AnswerResult:
        """Apply the application's answer to a live attempt."""
        record = self._live.get(attempt_id)
        if record is None:
            raise self._missing(attempt_id)
        now = self._now if now_ms < self._now else now_ms
        if now >= record.lock_deadline_ms:
            raise ExpiredAttempt(f"attempt {attempt_id}: lock expired at {record.lock_deadline_ms}")
        self._now = now
        self._version += 1
        if ack is _ACCEPT:
            del self._live[attempt_id]
            record.attempt_id = None
            record.state = _ACKNOWLEDGED
            self._acknowledged_total += 1
            count = record.delivery_count
            if record.pending:
                record.pending = False  # done: its count is never written again
                count += 1
            if record.suspect:
                self._clear_suspect(record)
            self._finish(record)
            return _result(attempt_id, record.offset, ack, _ACKNOWLEDGED, count)
        if ack is Ack.RENEW:
            record.lock_deadline_ms = now + self.config.lock_duration_ms
            self._live.move_to_end(attempt_id)
            return _result(
                attempt_id,
                record.offset,
                ack,
                _ACQUIRED,
                record.delivery_count + record.pending,
                lock_deadline_ms=record.lock_deadline_ms,
            )
        del self._live[attempt_id]
        record.attempt_id = None
        if record.pending or record.suspect:
            self._settle(record)
        if ack is Ack.REJECT:
            self._start_archiving(record, ArchiveReason.REJECTED, error)
            return _result(
                attempt_id,
                record.offset,
                ack,
                _ARCHIVING,
                record.delivery_count,
                reason=ArchiveReason.REJECTED,
            )
        return self._release(
            attempt_id, record, ack, now, error=error, retry_after_ms=retry_after_ms
        )

    def _release(
        self,
        attempt_id: str,
        record: _Record,
        ack: Ack | None,
        now: int,
        *,
        error: ErrorInfo | None,
        retry_after_ms: int | None,
    ) -> AnswerResult:
        if record.pending or record.suspect:
            self._settle(record)
        if error is not None:
            record.error = error
        count = record.delivery_count
        if count >= self.config.delivery_count_limit:
            reason = ArchiveReason.DELIVERY_COUNT_EXCEEDED
            self._start_archiving(record, reason, record.error)
            return _result(attempt_id, record.offset, ack, _ARCHIVING, count, reason=reason)
        delay = self.config.retry.delay_ms(
            count, _jitter_rand(record.offset, count), retry_after_ms
        )
        record.state = _AVAILABLE
        record.not_before_ms = now + delay
        if delay <= 0:
            record.queued = True
            heapq.heappush(self._ready, record.offset)  # settled: never a suspect here
        else:
            heapq.heappush(self._backoff, (record.not_before_ms, record.offset))
        return _result(
            attempt_id, record.offset, ack, _AVAILABLE, count, retry_at_ms=record.not_before_ms
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
        self._now = now
        self._version += 1
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
        record.state = _AVAILABLE
        record.not_before_ms = now + delay_ms
        if delay_ms == 0:
            record.queued = True
            heapq.heappush(self._suspects_ready if record.suspect else self._ready, record.offset)
        else:
            heapq.heappush(self._backoff, (record.not_before_ms, record.offset))
        return _result(
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
            del live[attempt_id]
            record.attempt_id = None
            error = ErrorInfo(
                LOCK_TIMEOUT,
                f"no answer within the lock duration of {self.config.lock_duration_ms} ms",
                None,
            )
            out.append(
                self._release(attempt_id, record, None, now, error=error, retry_after_ms=None)
            )
        if out:
            self._version += 1
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

    # -- crash accounting (horizon mode) ---------------------------------------------------------

    def _settle(self, record: _Record) -> None:
        """The outcome of the record's attempt is known (not an accept): charge it if pending."""
        if record.pending:
            record.pending = False
            count = record.delivery_count
            record.delivery_count = count + 1
            self._recount(record.offset, count, count + 1)
            self._max_counted = max(self._max_counted, record.offset)
        if record.suspect:
            self._clear_suspect(record)

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

    def _horizon_need(self) -> int:
        """The highest offset handed out, held beyond the horizon, or next in line."""
        need = self._handed_top if self._handed_top > self._held_at else self._held_at
        ready = self._ready
        if ready and ready[0] > need:  # a stale entry is lower than a live one: harmless
            need = ready[0]
        return need

    def _horizon_target(self) -> int:
        """The horizon the next commit point carries: never below one already issued."""
        need = self._horizon_need()
        target = self._issued
        if need + self._window // 2 > self._confirmed:
            target = max(target, min(MAX_OFFSET, need + self._window))
        return max(target, self.committable_offset() - 1)

    def horizon_wanted(self) -> int | None:
        """Horizon mode: a commit is wanted now; the horizon its ``commit_point`` carries.

        Wanted when the hand-outs have used half the window beyond the committed horizon, or a
        ready record is held beyond it (the commit is asynchronous: hand-outs up to the committed
        horizon go on meanwhile), and during the isolation pass when a charge or an outcome waits
        for its commit.  None otherwise, in write-ahead mode and after a revoke.
        """
        if not self._horizon or self._revoked:
            return None
        if self._unflushed_after is not None or (
            self._isolating is not None and self._isolating.state is _AVAILABLE
        ):
            return self._horizon_target()
        need = self._horizon_need()
        if need + self._window // 2 <= self._confirmed:
            return None
        return self._horizon_target()

    @property
    def wants_isolation(self) -> bool:
        """A suspect is ready and nothing of it is charged or in flight: call ``isolate`` once
        nothing is in flight in the whole process (a death must charge only the isolated one)."""
        return not self._revoked and self._isolating is None and self._next_suspect() is not None

    def isolate(self, now_ms: int) -> IsolationCharge:
        """Charge the lowest ready suspect for an isolated delivery (horizon mode).

        Its delivery count goes up now, in memory: the next ``commit_point`` writes it, and once
        that point is ``committed`` the attempt is handed out.  Normal hand-outs of this partition
        stop until the pass is over.  Raises IllegalTransition in write-ahead mode, while an
        attempt of this partition is in flight or an isolation is under way, or with no suspect
        ready.
        """
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        if not self._horizon:
            raise IllegalTransition("isolation is for crash_accounting HORIZON")
        if self._isolating is not None:
            raise IllegalTransition(f"offset {self._isolating.offset} is being isolated already")
        if self._live:
            raise IllegalTransition(
                f"{len(self._live)} attempts in flight: an isolated delivery goes alone"
            )
        now = self._tick(now_ms)
        if self._backoff:
            self._release_backoffs(now)
        record = self._next_suspect()
        if record is None:
            raise IllegalTransition("no suspect is ready to be isolated")
        heapq.heappop(self._suspects_ready)
        record.queued = False
        count = record.delivery_count
        record.delivery_count = count + 1
        self._recount(record.offset, count, count + 1)
        self._max_counted = max(self._max_counted, record.offset)
        self._isolating = record
        self._version += 1
        return IsolationCharge(self.topic, self.partition, record.offset, count + 1)

    def commit_point(self) -> CommitPoint:
        """What to commit now: offset, metadata (version 2 in horizon mode) and its horizon."""
        state = self.commit_state()
        metadata = encode(state, self.config.metadata_max_bytes)
        if not self._revoked:
            self._points += 1
        if state.horizon is not None:
            # The header always fits the smallest budget (64): a point never loses its horizon.
            assert metadata is not None
            if not self._revoked and state.horizon > self._issued:
                self._issued = state.horizon
        charged = state.charged
        return CommitPoint(
            self.topic,
            self.partition,
            state.base_offset,
            metadata or "",
            state.horizon,
            charged,
            None if charged is None else state.counts[charged],
            self._points,
        )

    def committed(self, point: CommitPoint, now_ms: int) -> Attempt | None:
        """The broker confirmed ``point``: hand-outs may reach its horizon, and if it carried the
        charge of the record being isolated, that record's attempt is returned: send it."""
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        if point.topic != self.topic or point.partition != self.partition:
            raise IllegalTransition(f"a commit point of {point.topic}/{point.partition}")
        if point.horizon is not None and (not self._horizon or point.horizon > self._issued):
            raise IllegalTransition(f"horizon {point.horizon} was never issued by this ledger")
        if point.serial > self._points:
            raise IllegalTransition(f"commit point {point.serial} was never made by this ledger")
        if point.horizon is not None and point.horizon > self._confirmed:
            self._confirmed = point.horizon
        if self._unflushed_after is not None and point.serial > self._unflushed_after:
            self._unflushed_after = None
        record = self._isolating
        if (
            record is None
            or self._unflushed_after is not None  # the previous outcome is not committed yet
            or point.charged != record.offset
            or point.charged_count != record.delivery_count
            or record.state is not _AVAILABLE
        ):
            return None
        now = self._tick(now_ms)
        self._version += 1
        seq = self._next_seq
        self._next_seq = seq + 1
        attempt_id = f"{self._id_prefix}{record.offset}{self._id_epoch}{seq}"
        deadline = now + self.config.lock_duration_ms
        record.attempt_id = attempt_id
        record.lock_deadline_ms = deadline
        record.state = _ACQUIRED
        self._live[attempt_id] = record
        self._attempts_total += 1
        self._handed_top = max(self._handed_top, record.offset)
        return _attempt(
            self.topic,
            self.partition,
            record.offset,
            attempt_id,
            record.delivery_count,
            deadline,
            record.key,
            record.item,
        )

    def horizon_status(self) -> HorizonStatus:
        record = self._isolating
        if not self._horizon:
            phase = IsolationPhase.NONE
        elif record is not None:
            phase = (
                IsolationPhase.CHARGED if record.state is _AVAILABLE else IsolationPhase.IN_FLIGHT
            )
        elif self._unflushed_after is not None:
            phase = IsolationPhase.SETTLING
        elif self._next_suspect() is not None:
            phase = IsolationPhase.READY
        elif self._n_suspects:
            phase = IsolationPhase.WAITING
        else:
            phase = IsolationPhase.NONE
        held = False
        if self._horizon and not self._revoked:
            ready = self._ready
            while ready:
                top = self._records.get(ready[0])
                if top is not None and top.queued:
                    held = ready[0] > self._confirmed
                    break
                heapq.heappop(ready)
        return HorizonStatus(
            mode=self.config.crash_accounting,
            horizon_committed=self._confirmed if self._horizon else None,
            horizon_wanted=self.horizon_wanted(),
            held=held,
            isolation=phase,
            isolating_offset=record.offset if record is not None else None,
            suspects_left=self._n_suspects,
            suspects_total=self._suspects_total,
            isolated_total=self._isolated_total,
        )

    # -- archiving -------------------------------------------------------------------------------

    def _start_archiving(
        self, record: _Record, reason: ArchiveReason, error: ErrorInfo | None
    ) -> None:
        if record.suspect:
            self._clear_suspect(record)  # restored at the limit: no delivery, DLQ now
        record.state = _ARCHIVING
        record.reason = reason
        record.error = error
        record.handed_out = False
        self._n_archiving += 1
        self._archive.append(record.offset)

    def to_archive(self) -> list[ArchiveRequest]:
        """Records to write to the DLQ; each is returned once (again after ``dlq_failed``)."""
        out: list[ArchiveRequest] = []
        while self._archive:
            offset = self._archive.popleft()
            record = self._records.get(offset)
            if record is None or record.state is not _ARCHIVING or record.handed_out:
                continue
            record.handed_out = True
            assert record.reason is not None
            out.append(
                ArchiveRequest(
                    self.topic,
                    self.partition,
                    offset,
                    record.key,
                    record.item,
                    record.delivery_count,
                    record.reason,
                    record.error,
                )
            )
        return out

    def _handed_out(self, offset: int) -> _Record:
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        record = self._records.get(offset)
        if record is None or record.state is not _ARCHIVING or not record.handed_out:
            raise IllegalTransition(
                f"offset {offset} is not waiting for a DLQ write "
                f"(state {record.state.name if record else 'not held'})"
            )
        return record

    def dlq_written(self, offset: int) -> None:
        """The DLQ record of ``offset`` is confirmed (or no DLQ is configured): ARCHIVED, done."""
        record = self._handed_out(offset)
        self._version += 1
        record.state = RecordState.ARCHIVED
        self._n_archiving -= 1
        self._archived_total += 1
        self._finish(record)

    def dlq_failed(self, offset: int) -> None:
        """A retriable DLQ write failure: ``to_archive`` hands the record out again."""
        record = self._handed_out(offset)
        record.handed_out = False
        self._archive.append(offset)

    def dlq_withheld(self, offset: int, now_ms: int) -> None:
        """The DLQ circuit breaker held the write of ``offset``: AVAILABLE again, for one more
        delivery (not done, so nothing is committed past it meanwhile).

        Its count continues, and it goes out even at the limit (``_make_ready``'s check is not
        applied): the breaker judged the answers that sent it to the DLQ untrustworthy. An answer
        to that delivery other than an accept archives it as usual (the limit is reached).
        """
        record = self._handed_out(offset)
        self._tick(now_ms)
        self._version += 1
        record.state = _AVAILABLE
        record.handed_out = False
        record.reason = None
        self._n_archiving -= 1
        record.not_before_ms = self._now
        record.queued = True
        heapq.heappush(self._ready, offset)  # archiving cleared it as a suspect

    # -- done ------------------------------------------------------------------------------------

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
        self._count_done_run(seq, front_seq, extends=seq > self._max_done_seq)
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

    def _count_done_run(self, seq: int, front_seq: int, *, extends: bool) -> None:
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

    # -- persistence -----------------------------------------------------------------------------

    def commit_state(self) -> CommitState:
        """The state to persist with ``committable_offset()``.

        Write-ahead mode: the counts of attempts in flight included.  Horizon mode: not included
        (only the isolated one's), and the horizon is the one the next commit point carries.
        """
        if self._final is not None:
            return self._final
        base = self.committable_offset()
        upper = self._max_done
        done: list[tuple[int, int]] = []
        counts: dict[int, int] = {}
        previous = base
        previous_seq = -1  # the first held record is the base itself
        last = upper if upper > self._max_counted else self._max_counted
        for offset, record in self._records.items():
            if offset > last:
                break  # nothing further is done or counted: see _max_counted
            if record.delivery_count:
                counts[offset] = record.delivery_count
            if offset <= upper:
                # Only where records were fetched between two held ones: a range of compaction
                # gaps alone would cost bytes and say nothing.
                if previous_seq >= 0 and record.seq - previous_seq > 1:
                    done.append((previous + 1, offset))
                previous = offset
                previous_seq = record.seq
        if upper > previous:
            done.append((previous + 1, upper + 1))
        # What the restored state said about offsets not fetched again yet.
        following = self._last_added + 1
        for range_start, end in self._restored_done[self._restored_index :]:
            start = max(range_start, following, base + 1)
            if start >= end:
                continue
            if done and done[-1][1] >= start:
                done[-1] = (done[-1][0], max(end, done[-1][1]))
            else:
                done.append((start, end))
        if self._restored_counts:
            self._restored_counts = {
                o: c for o, c in self._restored_counts.items() if o >= following
            }
            counts.update(self._restored_counts)
        if not self._horizon:
            return CommitState(base, tuple(done), counts)
        isolating = self._isolating
        return CommitState(
            base,
            tuple(done),
            counts,
            self._horizon_target(),
            isolating.offset if isolating is not None else None,
        )

    def encode_metadata(self) -> str:
        """The commit metadata string (may be a safe prefix encoding: see ``commitstate.encode``)."""
        encoded = encode(self.commit_state(), self.config.metadata_max_bytes)
        return encoded if encoded is not None else ""

    def _structural_raw(self) -> int:
        """An upper bound of the run-length payload from O(1) counters.

        The done ranges and count runs kept in memory are counted exactly (``_n_ranges``,
        ``_n_count_runs``), the restored ones not yet reached are bounded by their number; a range
        is two varints, a count run three; every varint of an offset is at most the span from the
        base to the highest offset known.
        """
        records = self._records
        base = next(iter(records)) if records else self._last_added + 1
        v = _vlen(max(self._last_added, self._restored_top) - base + 2)
        ranges = self._n_ranges + len(self._restored_done) - self._restored_index
        runs = self._n_count_runs + len(self._restored_counts)
        # base (<= 9 bytes), done kind (1), two list lengths (<= 3 each); counts < 2**21; version
        # 2's header: horizon (<= 10), charged kind (1), its offset and count (<= 13).
        header = 40 if self._horizon else 16
        return header + ranges * 2 * v + runs * (2 * v + 3)

    def _metadata_estimate(self) -> int:
        """Encoded size estimate in characters, O(1).

        The structural bound is a true upper bound, but a poor one for compressible states; past
        it, the estimate is the last exact measurement plus the structural growth since.  That
        assumes the chosen (perhaps zlib) form grows no faster than the structure: zlib gives no
        such guarantee, but an underestimate only ever leads to a prefix encoding, which is safe
        (see ``commitstate.encode``), and it keeps exact measurements (O(records held)) rare.
        """
        raw = self._structural_raw()
        bound = chars_for_payload(raw)
        growth = max(0, raw - self._measured_raw)
        return min(bound, self._measured_chars + (growth * 3 + 1) // 2 + 8)

    def _metadata_over(self, fraction: float) -> bool:
        """Would the metadata exceed ``fraction`` of the budget?  Exact when it matters."""
        limit = self.config.metadata_max_bytes * fraction
        if self._metadata_estimate() <= limit:
            return False
        if self._measured_version != self._version:
            self._measure()
        return self._measured_chars > limit

    def _measure(self) -> None:
        state = self.commit_state()
        self._measured_raw = self._structural_raw()
        self._measured_version = self._version
        bound = chars_for_payload(payload_bound(state))
        # Encoding (zlib included) is the expensive part: only when the bound is not conclusive.
        self._measured_chars = (
            encoded_length(state)
            if bound > self.config.metadata_max_bytes * _RESUME_FILL
            else bound
        )

    # -- flow control ----------------------------------------------------------------------------

    def should_pause(self, max_bytes: int | None = None) -> bool:
        """Stop fetching: too many records held, or ``max_bytes`` or more of them (the partition's
        share of the byte budget), locks exhausted, or metadata near its budget."""
        return (
            len(self._records) >= self.config.max_buffered_records
            or (max_bytes is not None and self._held_bytes >= max_bytes)
            or len(self._live) >= self.config.max_record_locks
            or self._metadata_over(_PAUSE_FILL)
        )

    def may_resume(self, max_bytes: int | None = None) -> bool:
        """Fetch again (hysteresis: half the buffer, half of ``max_bytes``, a free lock, metadata
        under 70%).  Never blocked by one record larger than ``max_bytes``: once it is done the
        partition holds nothing, and an empty partition may always resume."""
        return (
            len(self._records) <= self.config.max_buffered_records // 2
            and (max_bytes is None or self._held_bytes <= max_bytes // 2)
            and len(self._live) < self.config.max_record_locks
            and not self._metadata_over(_RESUME_FILL)
        )

    def update_paused(self, max_bytes: int | None = None) -> bool:
        """Apply the hysteresis and return whether the partition should now be paused."""
        if self._paused:
            self._paused = not self.may_resume(max_bytes)
        else:
            self._paused = self.should_pause(max_bytes)
        return self._paused

    def next_lock_deadline_ms(self) -> int | None:
        """The earliest lock deadline of a live attempt, or None (retry times not included)."""
        if self._live:
            return next(iter(self._live.values())).lock_deadline_ms
        return None

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which something changes by time alone, or None."""
        best: int | None = None
        if self._live:
            best = next(iter(self._live.values())).lock_deadline_ms
        backoff = self._backoff
        while backoff:
            not_before, offset = backoff[0]
            record = self._records.get(offset)
            if (
                record is not None
                and record.state is _AVAILABLE
                and not record.queued
                and record.not_before_ms == not_before
            ):
                if best is None or not_before < best:
                    best = not_before
                break
            heapq.heappop(backoff)
        return best

    # -- revocation ------------------------------------------------------------------------------

    def revoke(self) -> CommitState:
        """The partition is revoked: fence every live attempt and return the state to commit.

        Write-ahead mode: in-flight attempts stay counted in the returned state (a crash or a
        rebalance costs at most the attempt in flight).  Horizon mode: they are not counted, and
        the state's horizon covers only what is unsettled (see the module docstring: nothing in
        flight and no suspect left means no isolation pass for the next owner).  Their ids answer
        ExpiredAttempt from now on.
        """
        if self._horizon and not self._revoked:
            self._final = self._final_state()
        state = self.commit_state()
        if not self._revoked:
            self._revoked = True
            for record in self._live.values():
                record.attempt_id = None
                record.state = _AVAILABLE
                record.pending = False
            self._live.clear()
            self._ready.clear()
            self._suspects_ready.clear()
            self._backoff.clear()
            self._archive.clear()
            self._version += 1
        return state

    def _final_state(self) -> CommitState:
        """Horizon mode, at revoke: the state with the lowest horizon that is still exact."""
        isolating = self._isolating
        if isolating is not None and isolating.state is _AVAILABLE:
            # Charged, never handed out: the charge goes back; it stays a suspect.
            count = isolating.delivery_count
            isolating.delivery_count = count - 1
            self._recount(isolating.offset, count, count - 1)
            self._isolating = isolating = None
        state = self.commit_state()
        top = state.base_offset - 1
        for record in self._live.values():  # answers lost: the next owner isolates up to them
            if record.offset > top:  # noqa: PLR1730
                top = record.offset
        if self._n_suspects or self._last_added < self._suspect_top:
            top = max(top, self._suspect_top)  # suspects not settled (or not fetched) stay so
        return CommitState(
            state.base_offset,
            state.done,
            state.counts,
            top,
            isolating.offset if isolating is not None else None,
        )

    # -- introspection ---------------------------------------------------------------------------

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

    def _tick(self, now_ms: int) -> int:
        # A clock that steps back must not reorder lock deadlines (see _live).
        if now_ms > self._now:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._now = now_ms
        return self._now
