"""The interfaces around the delivery pipeline, and the values that cross them.

Owns one protocol per direction (drawn in `Engine`'s docstring): `Engine` (daemon, API, metrics →
pipeline), `StateAdapter` and its `StateView` (pipeline → adapter), `Outlet` (adapter → pipeline),
and the values they pass: `EngineParts`, `Delivery` (generic over the adapter's ``ref``), `Room`,
`Settled`, `Counters`.

Must not import either engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

import trio

from sidecar.config import Config
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import Ack, ArchiveReason, ErrorInfo
from sidecar.core.record import Tracked
from sidecar.core.wire import AckItem, Answer, RecordView
from sidecar.kafka.dlq import DlqWriter

PartitionKey = tuple[str, int]
AckResult = Literal["ok", "unknown", "expired", "already"]


class Settled(enum.Enum):
    """What an answer led to, as the adapter decided it (the one decision per answer:
    :func:`sidecar.core.outcome.decide`, made by the ledger or the share engine)."""

    ACCEPTED = "accepted"
    REDELIVERED = "redelivered"  # released below the limit: the record goes to the app again
    DEAD_LETTERED = "dead-lettered"  # rejected, or released at the limit: on its way to the DLQ
    KEPT = "kept"  # renew: the lock goes on


# What `StateAdapter.answered` returns: the decision, or why the answer did not count.
Answered = Settled | Literal["unknown", "expired"]

R = TypeVar("R")  # an adapter's handle on a record's delivery state


class TierWriter(Protocol):
    """Where an adapter writes a long release: its retry tier
    (:class:`sidecar.engines.tier_step.TierStep`)."""

    async def write(
        self,
        tracked: Tracked,
        delivery_count: int,
        delay_ms: int,
        error: ErrorInfo | None,
        *,
        sink: DlqSink,
    ) -> ArchiveOutcome:
        """Write `tracked` to the tier of `delay_ms` through `sink`: WRITTEN, HANDED_OVER, or
        FAILED (the sidecar stops)."""


class DlqSink(Protocol):
    """Where the DLQ step writes a record: the DLQ writer itself, or a consumer-group transaction
    (:meth:`sidecar.engines.consumer.commits.Committer.transaction`)."""

    async def write(self, failed: FailedRecord, dlq_topic: str) -> object:
        """Write one DLQ record and return once it is confirmed; False when the record went to
        another owner before it could be (its new owner archives it); raises DlqFatalError when
        it cannot be written."""


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
    # Partition offsets in the commits that succeeded, and the bytes of their metadata strings:
    # what the commits cost the group's `__consumer_offsets` partition (docs/scaling.md).
    committed_partitions: int = 0
    commit_metadata_bytes: int = 0
    rebalances: int = 0
    metadata_pauses: int = 0
    # topic -> records the broker archives on its own, with no DLQ record (share engine; a defect to report)
    broker_archived: dict[str, int] = field(default_factory=dict)

    by_topic: dict[tuple[str, str], int] = field(default_factory=dict)  # (topic, outcome) -> count
    # Retry tiers (tier label -> records): written to a tier, delivered from one; a tier record
    # read again with the same original and count (at least once) is skipped, not delivered.
    tier_written: dict[str, int] = field(default_factory=dict)
    tier_delivered: dict[str, int] = field(default_factory=dict)
    tier_duplicates: int = 0
    tier_foreign: int = 0  # another group's tier records, skipped
    tier_failed: int = 0
    # (source topic, reason, exception class, DLQ topic) -> DLQ records written; see
    # dlq_step.dead_lettered_key
    dead_lettered: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    # source topic -> DLQ records in the default DLQ because the app named a topic not allowed
    route_refused: dict[str, int] = field(default_factory=dict)
    # Headers-only DLQ records written here whose source offset was deleted since (source topic ->
    # count), and those still watched (sidecar.engines.payload_watch: their one writer).
    source_deleted: dict[str, int] = field(default_factory=dict)
    headers_only_watched: int = 0

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def committed(self, ok: bool = True, partitions: int = 0, metadata_bytes: int = 0) -> None:
        """One offset commit (or share acknowledgement) done, or failed (`ok` False); a commit
        done names how many partition offsets it carried and their metadata's bytes."""
        if ok:
            self.commits += 1
            self.committed_partitions += partitions
            self.commit_metadata_bytes += metadata_bytes
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
            "committed_partitions": self.committed_partitions,
            "commit_metadata_bytes": self.commit_metadata_bytes,
            "rebalances": self.rebalances,
            "tiers": {
                "written": dict(self.tier_written),
                "delivered": dict(self.tier_delivered),
                "duplicates": self.tier_duplicates,
                "other_group": self.tier_foreign,
                "failed": self.tier_failed,
            },
        }


@dataclass(slots=True, eq=False)
class Delivery(Generic[R]):
    """One live attempt: a record handed to the app under a fresh random id.

    ``ref`` is the adapter's handle on the record's delivery state (a ledger attempt, a share
    batch), typed by the adapter (``Delivery[_Acquired]``); ``answer`` and ``settled`` are set by
    the share adapter when the answer arrives.
    """

    id: str
    tracked: Tracked
    delivery_count: int
    ref: R
    answer: Answer | AckItem | None = None
    settled: Settled | None = None  # the share adapter's decision on `answer`, once made
    # trio time the lock expires (pull mode tells the app); None: the config's lock from issue.
    lock_deadline: float | None = None
    # perf_counter when the app got it to answer later through /v1/acks (a pull, or a push answered
    # `deferred`): the answer's delay is observed from here. None: answered in its own request.
    handed_at: float | None = None
    sent: bool = False  # a request carrying it went out (share: a lock expiry before is no attempt)

    @property
    def topic(self) -> str:
        return self.tracked.record.topic


class Room(NamedTuple):
    """What the pipeline leaves room for now (`Outlet.room`): read once per scheduler turn."""

    app_reachable: bool
    draining: bool  # shutdown: in-flight work finishes, nothing new is handed out
    stopping: bool  # the final commits are under way, or the sidecar failed
    intake_stopped: bool  # shutdown began: fetch no more records
    failed: bool
    dlq_ready: bool  # the DLQ topics are checked (or no DLQ is configured)
    breaker_open: bool  # the DLQ circuit breaker is open (not half-open): intake stops
    in_flight: int  # live deliveries
    sending: int  # deliveries handed to `send` whose request has not finished
    send_room: int  # more deliveries the open requests (or the waiting polls) take now
    breaker_room: int | None  # None (no limit), 1 (a probe) or 0


class Until(enum.Enum):
    """What `Outlet.wait` waits for."""

    APP_REACHABLE = "app reachable"
    INTAKE_OPEN = "intake open"  # the app reachable (push mode), or a poll waiting (pull mode)
    BREAKER_ROOM = "breaker room"  # the DLQ circuit breaker lets a record out


class Outlet(Protocol[R]):
    """What an adapter may use of the pipeline (:class:`sidecar.engines.outlet.PipelineOutlet`).

    The deliveries' lifecycle (`issue` → `send` → `retire` / `lock_expired`), the DLQ step
    (`dead_letter`), the room the pipeline leaves (`room`) and the waits for it (`wait`), and the
    adapter's poll loop run under the pipeline's eye (`run_source`).
    """

    def issue(
        self, tracked: Tracked, delivery_count: int, ref: R, *, lock_deadline: float | None = None
    ) -> Delivery[R]:
        """A new live attempt under a fresh random id (not sent yet); `lock_deadline` (trio
        time) is when the adapter's lock expires, for the polls of pull mode."""

    def send(self, delivery: Delivery[R]) -> None:
        """Hand it to the app: the next request (push mode), or the polls (pull mode)."""

    def retire(self, delivery: Delivery[R]) -> None:
        """The attempt is over (expired, fenced, not sent): its id answers `expired` from now on."""

    def lock_expired(self, topic: str, delivery: Delivery[R] | None, outcome: str) -> None:
        """No answer in time (`lock_expired`), or none before the sidecar stopped (`abandoned`)."""

    async def dead_letter(
        self,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        *,
        consequence: str,
        sink: DlqSink,
        may_hold: bool = True,
    ) -> ArchiveOutcome:
        """The DLQ step (:class:`sidecar.engines.dlq_step.DlqStep`): stop, skip, hold, or write the
        record's DLQ record to `sink`."""

    def room(self) -> Room: ...

    async def wait(self, until: Until, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for `until`; whether it holds."""

    async def run_source(self, poll: Callable[[], Awaitable[None]]) -> None:
        """Run the adapter's poll loop; a source that cannot continue stops the sidecar (exit 1)."""


@dataclass(frozen=True, slots=True)
class EngineParts(Generic[R]):
    """What the pipeline gives the adapter it builds."""

    config: Config
    counters: Counters  # the adapter bumps its own: commits, rebalances, metadata pauses
    dlq: DlqWriter
    outlet: Outlet[R]
    tiers: TierWriter  # the retry tier step (sidecar.engines.tier_step.TierStep)


class StateView(Protocol):
    """What the pipeline's status, readiness and metrics read of an adapter."""

    def readiness(self) -> dict[str, bool]: ...
    def broker_error(self) -> str | None: ...
    def stalled(self) -> str | None: ...
    def status_fields(self) -> dict[str, Any]: ...
    def partitions(self) -> list[dict[str, Any]]: ...
    def paused(self) -> set[PartitionKey]: ...
    def lag(self) -> dict[PartitionKey, int]: ...
    def commit_metadata_bytes(self) -> dict[PartitionKey, int]: ...


class StateAdapter(Protocol):
    """Where delivery state lives: what the pipeline may do with an engine's adapter."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Intake and the adapter's own tasks; started once subscribed. Cancelled at the end."""

    def answered(self, delivery: Delivery[Any], ack: Ack, answer: Answer | AckItem) -> Answered:
        """Apply an answer to a live delivery: the decision it led to (the pipeline retires the
        delivery, counts the outcome and tells the DLQ circuit breaker), or `unknown` / `expired`."""

    async def not_reached(self, deliveries: Sequence[Delivery[Any]]) -> bool:
        """The app was not listening (not an attempt): True to send them again now."""

    def wake(self, *, now: bool = False) -> None:
        """Something changed (an answer, a delivery finished): re-evaluate soon; `now`: in this
        task, at once (the end of a row of answers, whose wakes the pipeline held)."""

    def intake_changed(self, *, held_may_go: bool = False) -> None:
        """App reachability, the DLQ circuit breaker, draining or the stop changed (`Outlet.room`):
        pause, resume or stop intake now. `held_may_go`: the breaker is half-open or closed, so
        the records it held on their way to the DLQ (`ArchiveOutcome.HELD`) may go to the app
        again (within `Room.breaker_room`)."""

    async def wait_drained(self) -> None:
        """Return once nothing is in flight (the pipeline bounds the wait)."""

    async def finish(self) -> None:
        """Final commits and close (shielded by the caller)."""

    @property
    def view(self) -> StateView: ...


# Builds an adapter from what the pipeline gives it (`Pipeline(config, adapter)`).
AdapterFactory = Callable[[EngineParts[Any]], StateAdapter]


@dataclass(frozen=True, slots=True)
class Health:
    """What `/healthz` and `/readyz` read of an engine at one moment."""

    failure: str | None  # why it stopped (exit 1); None while it runs
    stalled: str | None  # why it cannot make progress and should be restarted; None: it can
    checks: dict[str, bool]  # the readiness checks by name
    broker_error: str | None  # why the broker cannot be used, when that is known
    missing_topics: str | None  # which source topics do not exist (None: all do, or not asked)
    app_route_missing: str | None  # why the app has no route at its URL (None: it has, as known)


@dataclass(frozen=True, slots=True)
class Figures:
    """What the metrics read of an engine at scrape time (besides its status and health)."""

    counters: Counters
    in_flight: int  # live deliveries
    app_reachable: bool
    paused: set[PartitionKey]
    lag: dict[PartitionKey, int]
    commit_metadata_bytes: dict[PartitionKey, int]


class BreakerControl(Protocol):
    """The DLQ circuit breaker as the local API sees it
    (:class:`sidecar.engines.breaker_gate.BreakerGate`)."""

    def status(self) -> dict[str, Any]: ...

    def close(self, reason: str) -> bool:
        """Close it; False when it was closed already."""


class Engine(Protocol):
    """What the daemon, the local API and the metrics may do with an engine.

    One protocol per direction (the pipeline itself is :mod:`sidecar.engines.pipeline`, its outlet
    :mod:`sidecar.engines.outlet`)::

        daemon, local API, metrics ──Engine──▶ Pipeline ──StateAdapter──▶ adapter (consumer | share)
                                                  │                          │  (its StateView: status)
                                                  └─builds─▶ outlet ◀─Outlet─┘

    - :class:`Engine`: what the daemon, the local API and the metrics may do with an engine;
    - :class:`StateAdapter`: what the pipeline may do with an adapter (:mod:`sidecar.engines.consumer.group`,
      :mod:`sidecar.engines.share.group`), where delivery state lives (8 members), and its
      :class:`StateView`, what the status and the metrics read of it (8);
    - :class:`Outlet`: what an adapter may use of the pipeline, and nothing else (8): deliveries
      issued, sent and retired, the DLQ step, the room the pipeline leaves and the waits for it.
    """

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prepare (DLQ topics), start, report started, and run until stopped; then shut down."""

    def stop(self, *, drain: bool = True) -> None:
        """Stop: let in-flight work finish first (`drain`), or not (a second signal)."""

    def answer(self, items: Sequence[AckItem]) -> list[tuple[str, str]]:
        """`POST /v1/acks`: apply each answer; per delivery id ok / already / expired / unknown."""

    async def pull(self, max_records: int, wait_s: float) -> list[PulledRecord]:
        """`GET /v1/records` (pull mode): up to `max_records` deliveries, waiting up to `wait_s`."""

    def health(self) -> Health: ...

    def status(self) -> dict[str, Any]:
        """`/v1/status`'s body."""

    def figures(self) -> Figures: ...

    def observe_latencies(
        self,
        app: Callable[[float], None],
        dlq: Callable[[float], None],
        acks: Callable[[float], None],
    ) -> None:
        """Latency observers (seconds): app requests, DLQ writes, answers through /v1/acks."""

    @property
    def breaker(self) -> BreakerControl | None:
        """The DLQ circuit breaker (None: disabled)."""

    @property
    def counters(self) -> Counters: ...


@dataclass(frozen=True, slots=True)
class PulledRecord:
    """One delivery handed to `GET /v1/records`: its wire view and how long its lock has left."""

    view: RecordView
    lock_remaining_s: float


__all__ = [
    "AckResult",
    "AdapterFactory",
    "Answered",
    "BreakerControl",
    "Counters",
    "Delivery",
    "DlqSink",
    "Engine",
    "EngineParts",
    "Figures",
    "Health",
    "Outlet",
    "PartitionKey",
    "PulledRecord",
    "Room",
    "Settled",
    "StateAdapter",
    "StateView",
    "Until",
]
