"""Fakes the engine parts are built from in their unit tests: an outlet, a source, a sink.

Each records what it was asked and answers what the test sets; none does I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.config import Config, parse_config
from sidecar.core import ledger as L
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import ArchiveReason, ErrorInfo
from sidecar.core.record import SourceRecord, Tracked
from sidecar.engines.interfaces import Delivery, DlqSink, Room, Until
from sidecar.kafka.source import OffsetToCommit

OPEN = Room(
    app_reachable=True,
    draining=False,
    stopping=False,
    intake_stopped=False,
    failed=False,
    dlq_ready=True,
    breaker_open=False,
    in_flight=0,
    sending=0,
    send_room=100,
    breaker_room=None,
)


def config(**keys: Any) -> Config:
    return parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": {"url": "http://127.0.0.1:8080/records"},
            **keys,
        },
        env={},
    )


def tracked(offset: int, topic: str = "t", partition: int = 0) -> Tracked:
    return Tracked(SourceRecord(topic, partition, offset, None, b"v", (), 0, "create"))


def fill(ledger: L.PartitionLedger, offsets: range, now: int = 1) -> None:
    for offset in offsets:
        rec = tracked(offset, ledger.topic, ledger.partition)
        ledger.add(offset, f"k{offset}".encode(), rec, now)


@dataclass
class DeadLettered:
    tracked: Tracked
    delivery_count: int
    reason: ArchiveReason
    sink: DlqSink
    may_hold: bool = True
    error: ErrorInfo | None = None


@dataclass
class FakeOutlet:
    """An `Outlet`: deliveries issued and sent, retired, expired and dead-lettered, recorded."""

    room_now: Room = OPEN
    outcome: ArchiveOutcome = ArchiveOutcome.WRITTEN
    issued: list[Delivery[Any]] = field(default_factory=list)
    sent: list[Delivery[Any]] = field(default_factory=list)
    retired: list[Delivery[Any]] = field(default_factory=list)
    expired: list[tuple[str, Delivery[Any] | None, str]] = field(default_factory=list)
    dead: list[DeadLettered] = field(default_factory=list)

    def issue(
        self, tracked: Tracked, delivery_count: int, ref: Any, *, lock_deadline: float | None = None
    ) -> Delivery[Any]:
        delivery = Delivery(
            f"d{len(self.issued)}", tracked, delivery_count, ref, lock_deadline=lock_deadline
        )
        self.issued.append(delivery)
        return delivery

    def send(self, delivery: Delivery[Any]) -> None:
        self.sent.append(delivery)

    def retire(self, delivery: Delivery[Any]) -> None:
        self.retired.append(delivery)

    def lock_expired(self, topic: str, delivery: Delivery[Any] | None, outcome: str) -> None:
        self.expired.append((topic, delivery, outcome))

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
        self.dead.append(DeadLettered(tracked, delivery_count, reason, sink, may_hold, error))
        return self.outcome

    def room(self) -> Room:
        return self.room_now

    async def wait(self, until: Until, deadline: float) -> bool:
        return True

    async def run_source(self, poll: Callable[[], Awaitable[None]]) -> None:
        await poll()


@dataclass
class FakeSource:
    """The Kafka source as the consumer engine's parts use it: partitions, pause/resume, commits."""

    assigned: set[tuple[str, int]] = field(default_factory=set)
    paused: set[tuple[str, int]] = field(default_factory=set)
    busy_marks: int = 0
    commits: list[list[OffsetToCommit]] = field(default_factory=list)
    commit_error: Exception | None = None

    def pause(self, keys: Sequence[tuple[str, int]]) -> None:
        self.paused.update(keys)

    def resume(self, keys: Sequence[tuple[str, int]]) -> None:
        self.paused.difference_update(keys)

    def mark_busy(self) -> None:
        self.busy_marks += 1

    async def commit(self, offsets: list[OffsetToCommit]) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(list(offsets))

    def group_metadata(self) -> object:
        return object()


@dataclass
class FakeSink:
    """A `DlqSink`: what it was given, and what it answers (or raises)."""

    answer: object = True
    error: Exception | None = None
    written: list[tuple[FailedRecord, str]] = field(default_factory=list)

    async def write(self, failed: FailedRecord, dlq_topic: str) -> object:
        if self.error is not None:
            raise self.error
        self.written.append((failed, dlq_topic))
        return self.answer


@dataclass
class Calls:
    """A callable that counts its calls (a scheduler's kick, a failure callback)."""

    args: list[tuple[Any, ...]] = field(default_factory=list)

    def __call__(self, *args: Any) -> None:
        self.args.append(args)

    @property
    def count(self) -> int:
        return len(self.args)
