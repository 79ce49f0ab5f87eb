"""The ledger's vocabulary: record states, modes, limits, the frozen values it returns, its errors.

Nothing here changes state: the transitions are in `sidecar.core.ledger.machine`, the calls that
make them in `sidecar.core.ledger.partition`.  The values are frozen dataclasses, but for the two
the hot path builds per record (`Attempt`, `AnswerResult`): plain classes with ``Final`` attributes,
which a frozen dataclass's generated constructor would cost several times over (see `_Value`).

Imports the standard library and `sidecar.core` (backoff, ordering, outcome, errors) only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeAlias

from sidecar.core.backoff import RetryPolicy
from sidecar.core.errors import SidecarError
from sidecar.core.ordering import Ordering
from sidecar.core.outcome import Ack, ArchiveReason, ErrorInfo

__all__ = [
    "AnswerResult",
    "ArchiveRequest",
    "Attempt",
    "CommitPoint",
    "CrashAccounting",
    "ExpiredAttempt",
    "HorizonStatus",
    "IllegalTransition",
    "IsolationCharge",
    "IsolationPhase",
    "LedgerClosed",
    "LedgerConfig",
    "LedgerError",
    "LedgerStats",
    "RecordState",
    "UnknownAttempt",
]


class RecordState(enum.Enum):
    """Where a record is in its lifecycle.

    The lifecycle (the transitions are `sidecar.core.ledger.machine.enter`'s table)::

        AVAILABLE --acquire (delivery_count += 1)--> ACQUIRED --accept--> ACKNOWLEDGED        (done)
            ^                                          |
            +---- release / lock timeout (backoff) <---+  (while delivery_count < limit)
                                                       |
                reject, or release / timeout at the limit --> ARCHIVING --dlq_written--> ARCHIVED (done)
    """

    AVAILABLE = "available"
    ACQUIRED = "acquired"
    ACKNOWLEDGED = "acknowledged"
    ARCHIVING = "archiving"
    ARCHIVED = "archived"


class CrashAccounting(enum.Enum):
    """How a delivery is counted against a death (see `sidecar.core.ledger.horizon`)."""

    WRITE_AHEAD = "write_ahead"  # every hand-out counted and committed before it leaves
    HORIZON = "horizon"  # a horizon committed ahead; suspects isolated after a death


class IsolationPhase(enum.Enum):
    """Where the partition's isolation pass is (horizon mode; its moves:
    `sidecar.core.ledger.machine.ISOLATION`)."""

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
    #: Retry tiers: a release whose delay is above this many ms goes to a tier (ARCHIVING with
    #: reason RETRY_TIER, done once written) instead of backing off here. None: no tiers.
    tier_threshold_ms: int | None = None
    #: A retry tier's partition fetches on once every record it holds is due within this many ms
    #: (the consumer's ``fetch.wait.max.ms``): a partition resumed waits up to that long for the
    #: broker's answer to a fetch already under way, so resuming only once the last record is due
    #: left it idle for that long after every batch.
    tier_fetch_ahead_ms: int = 500

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
        if self.tier_fetch_ahead_ms < 0:
            raise ValueError(f"tier_fetch_ahead_ms must be >= 0, got {self.tier_fetch_ahead_ms}")
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


#: What the engine keeps with a record (the ledger never looks at it).  A named alias of ``object``:
#: mypyc resolves a dataclass field's annotation by its name in the module, where ``object`` is not.
_Item: TypeAlias = object


class _Value:
    """Equality, hash and repr over the attributes ``_FIELDS`` names, like a frozen dataclass's.

    For the values built once per record on the hot path.  A frozen dataclass's generated
    ``__init__`` sets each field through ``object.__setattr__``: about 1 µs for 8 fields, pure
    Python or compiled by mypyc, against 0.25 µs for an ``__init__`` that stores each slot (0.03 µs
    compiled, where the constructor is native).  Their attributes are ``Final``: mypy --strict
    rejects an assignment, and compiled they are read-only at run time too.
    """

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self._FIELDS])

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        inner = ", ".join([f"{name}={getattr(self, name)!r}" for name in self._FIELDS])
        return f"{type(self).__name__}({inner})"


class Attempt(_Value):
    """One hand-over of a record to the application."""

    _FIELDS = (
        "topic",
        "partition",
        "offset",
        "attempt_id",
        "delivery_count",
        "lock_deadline_ms",
        "key",
        "item",
    )
    __slots__ = _FIELDS

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        attempt_id: str,
        delivery_count: int,
        lock_deadline_ms: int,
        key: bytes | None,
        item: object,
    ) -> None:
        self.topic: Final = topic
        self.partition: Final = partition
        self.offset: Final = offset
        self.attempt_id: Final = attempt_id
        self.delivery_count: Final = delivery_count
        self.lock_deadline_ms: Final = lock_deadline_ms
        self.key: Final = key
        self.item: Final = item


class AnswerResult(_Value):
    """What an answer (or a lock expiry, ``ack=None``) did to the record."""

    _FIELDS = (
        "attempt_id",
        "offset",
        "ack",
        "state",
        "delivery_count",
        "lock_deadline_ms",
        "retry_at_ms",
        "reason",
    )
    __slots__ = _FIELDS

    def __init__(
        self,
        attempt_id: str,
        offset: int,
        ack: Ack | None,
        state: RecordState,
        delivery_count: int,
        lock_deadline_ms: int | None = None,
        retry_at_ms: int | None = None,
        reason: ArchiveReason | None = None,
    ) -> None:
        self.attempt_id: Final = attempt_id
        self.offset: Final = offset
        self.ack: Final = ack
        self.state: Final = state
        self.delivery_count: Final = delivery_count
        self.lock_deadline_ms: Final = lock_deadline_ms  # ACQUIRED (renew)
        self.retry_at_ms: Final = retry_at_ms  # AVAILABLE again: not before this time
        self.reason: Final = reason  # ARCHIVING


@dataclass(frozen=True, slots=True)
class ArchiveRequest:
    """A record to write to the DLQ; answer with ``dlq_written`` or ``dlq_failed``."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    item: _Item
    delivery_count: int
    reason: ArchiveReason
    error: ErrorInfo | None
    delay_ms: int = 0  # reason RETRY_TIER: the release's delay (the tier is chosen by it)


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
