"""The interfaces around the delivery pipeline, and the values that cross them.

Three protocols, one per direction (the pipeline itself is :mod:`sidecar.engines.pipeline`)::

    daemon, local API, metrics ──Engine──▶ Pipeline ──DeliveryState──▶ adapter (consumer | share)
                                              ▲                            │
                                              └────────────Pipe────────────┘

- :class:`Engine`: what the daemon, the local API and the metrics may do with an engine;
- :class:`DeliveryState`: what an adapter (:mod:`sidecar.engines.consumer_group`,
  :mod:`sidecar.engines.share_group`) adds to the pipeline: where delivery state lives;
- :class:`Pipe`: what an adapter may use of the pipeline, and nothing else.

:class:`Delivery` is generic over its ``ref``, the adapter's own handle on the record's delivery
state, so an adapter reads it back with its own type and no cast. Must not import either engine,
the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import trio

from sidecar.config import Config
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import Ack, ArchiveReason, ErrorInfo
from sidecar.core.record import Tracked
from sidecar.core.wire import AckItem, Answer, RecordView
from sidecar.kafka.dlq import DlqWriter

PartitionKey = tuple[str, int]
AckResult = Literal["ok", "unknown", "expired"]
# Writes one DLQ record; False when the record went to another owner before it could be (its
# new owner archives it); raises DlqFatalError when it cannot be written.
DlqWrite = Callable[[FailedRecord, str], Awaitable[bool]]

R = TypeVar("R")  # an adapter's handle on a record's delivery state


@dataclass(slots=True)
class Counters:
    """Plain integers the metrics read at scrape time (the hot path makes no metric calls)."""

    delivered: dict[str, int] = field(default_factory=dict)  # outcome -> count
    attempts: int = 0
    not_attempted: int = 0
    archived: dict[str, int] = field(default_factory=dict)  # reason -> count
    dlq_written: int = 0
    dlq_failed: int = 0
    expired_answers: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    metadata_pauses: int = 0
    # topic -> records the broker archives on its own, with no DLQ record (share engine; a defect to report)
    broker_archived: dict[str, int] = field(default_factory=dict)

    by_topic: dict[tuple[str, str], int] = field(default_factory=dict)  # (topic, outcome) -> count
    # (source topic, reason, exception class) -> DLQ records written; see dlq_step.dead_lettered_key
    dead_lettered: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def committed(self, ok: bool = True) -> None:
        """One offset commit (or share acknowledgement) done, or failed (`ok` False)."""
        if ok:
            self.commits += 1
        else:
            self.commit_failures += 1

    def outcome(self, topic: str, word: str) -> None:
        # Once per answered record: the two counts inline, not through bump().
        delivered = self.delivered
        delivered[word] = delivered.get(word, 0) + 1
        by_topic, key = self.by_topic, (topic, word)
        by_topic[key] = by_topic.get(key, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "delivered": dict(self.delivered),
            "attempts": self.attempts,
            "not_attempted": self.not_attempted,
            "archived": dict(self.archived),
            "dlq_written": self.dlq_written,
            "dlq_failed": self.dlq_failed,
            "expired_answers": self.expired_answers,
            "commits": self.commits,
            "commit_failures": self.commit_failures,
            "rebalances": self.rebalances,
        }


@dataclass(slots=True, eq=False)
class Delivery(Generic[R]):
    """One live attempt: a record handed to the app under a fresh random id.

    ``ref`` is the adapter's handle on the record's delivery state (a ledger attempt, a share
    batch), typed by the adapter (``Delivery[_Acquired]``); ``answer`` is set by the share adapter
    when the answer arrives.
    """

    id: str
    tracked: Tracked
    delivery_count: int
    ref: R
    answer: Answer | AckItem | None = None
    # trio time the lock expires (pull mode tells the app); None: the config's lock from issue.
    lock_deadline: float | None = None
    # perf_counter when the app got it to answer later through /v1/acks (a pull, or a push answered
    # `deferred`): the answer's delay is observed from here. None: answered in its own request.
    handed_at: float | None = None
    sent: bool = False  # a request carrying it went out (share: a lock expiry before is no attempt)

    @property
    def topic(self) -> str:
        return self.tracked.record.topic


class DeliveryState(Protocol):
    """Where delivery state lives: what an engine adds to the pipeline (see the module docstring)."""

    kind: str  # "consumer" | "share": the status's `engine`

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Intake and the adapter's own tasks; started once subscribed. Cancelled at the end."""

    def answered(self, delivery: Delivery[Any], ack: Ack, answer: Answer | AckItem) -> AckResult:
        """Apply an answer to a live delivery (the pipeline retires it and counts the outcome)."""

    async def not_reached(self, deliveries: Sequence[Delivery[Any]]) -> bool:
        """The app was not listening (not an attempt): True to send them again now."""

    def wake(self) -> None:
        """Something changed (an answer, a delivery finished): re-evaluate soon."""

    def hold_wakes(self) -> None:
        """Answers are applied in a row (one wake-up of the app client's reader): hold the wakes
        they cause until `release_wakes`."""

    def release_wakes(self) -> None:
        """The row of answers is over: re-evaluate now, once, if any of them woke this."""

    def intake_changed(self) -> None:
        """App reachability, draining or stopping changed: pause or resume intake now."""

    def stop_intake(self) -> None:
        """Shutdown begins: fetch no more records."""

    def release_held(self) -> None:
        """The DLQ circuit breaker is half-open or closed: records it held on their way to the DLQ
        (`ArchiveOutcome.HELD`) may go to the app again (within `Pipeline.breaker_room`)."""

    async def wait_drained(self) -> None:
        """Return once nothing is in flight (the pipeline bounds the wait)."""

    async def finish(self) -> None:
        """Final commits and close (shielded by the caller)."""

    def readiness(self) -> dict[str, bool]: ...
    def broker_error(self) -> str | None: ...
    def stalled(self) -> str | None: ...
    def status_fields(self) -> dict[str, Any]: ...
    def partitions(self) -> list[dict[str, Any]]: ...
    def paused(self) -> set[PartitionKey]: ...
    def lag(self) -> dict[PartitionKey, int]: ...
    def commit_metadata_bytes(self) -> dict[PartitionKey, int]: ...


class Engine(Protocol):
    """What the daemon, the local API and the metrics may do with an engine."""

    @property
    def config(self) -> Config: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def app_reachable(self) -> bool: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prepare (DLQ topics), start, report started, and run until stopped; then shut down."""

    def request_stop(self) -> None: ...
    def skip_drain(self) -> None: ...
    def ack(self, items: Sequence[AckItem]) -> list[tuple[str, str]]: ...
    def readiness(self) -> dict[str, bool]: ...
    def broker_error(self) -> str | None: ...
    def stalled(self) -> str | None: ...
    def status(self) -> dict[str, Any]: ...
    def in_flight_records(self) -> int: ...
    def paused_partitions(self) -> set[PartitionKey]: ...
    def lag(self) -> dict[PartitionKey, int]: ...
    def commit_metadata_bytes(self) -> dict[PartitionKey, int]: ...
    def observe_latencies(
        self,
        app: Callable[[float], None],
        dlq: Callable[[float], None],
        acks: Callable[[float], None],
    ) -> None: ...
    async def pull(self, max_records: int, wait_s: float) -> list[PulledRecord]: ...
    def breaker_status(self) -> dict[str, Any] | None: ...
    def close_breaker(self, reason: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class PulledRecord:
    """One delivery handed to `GET /v1/records`: its wire view and how long its lock has left."""

    view: RecordView
    lock_remaining_s: float


class Pipe(Protocol[R]):
    """What an adapter may use of the pipeline (:class:`sidecar.engines.pipeline.Pipeline`).

    Read: the configuration, the counters (the adapter bumps its own: commits, rebalances), the
    DLQ writer, and the pipeline's flags, which only the pipeline changes. Call: the deliveries'
    lifecycle (`issue` → `send` → `retire` / `lock_expired`), the DLQ step (`dead_letter`), the
    room the open requests, the polls and the circuit breaker leave, and the waits for it.
    """

    @property
    def config(self) -> Config: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def dlq(self) -> DlqWriter: ...
    @property
    def dlq_ready(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def app_reachable(self) -> bool: ...
    @property
    def sending(self) -> int: ...
    @property
    def breaker_open(self) -> bool: ...

    async def run_source(self, poll: Callable[[], Awaitable[None]]) -> None: ...
    def issue(
        self, tracked: Tracked, delivery_count: int, ref: R, *, lock_deadline: float | None = None
    ) -> Delivery[R]: ...
    def send(self, delivery: Delivery[R]) -> None: ...
    def retire(self, delivery: Delivery[R]) -> None: ...
    def lock_expired(self, topic: str, delivery: Delivery[R] | None, outcome: str) -> None: ...
    async def dead_letter(
        self,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        *,
        consequence: str,
        write: DlqWrite,
        may_hold: bool = True,
    ) -> ArchiveOutcome: ...
    def in_flight_records(self) -> int: ...
    def send_room(self) -> int: ...
    def breaker_room(self) -> int | None: ...
    async def wait_breaker_room(self, deadline: float) -> bool: ...
    async def wait_intake_open(self, deadline: float) -> bool: ...
    async def wait_app_reachable(self, deadline: float) -> bool: ...


__all__ = [
    "AckResult",
    "Counters",
    "Delivery",
    "DeliveryState",
    "DlqWrite",
    "Engine",
    "PartitionKey",
    "Pipe",
    "PulledRecord",
]
