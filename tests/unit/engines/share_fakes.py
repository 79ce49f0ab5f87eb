"""Fakes the share engine's parts are built from in their unit tests (beside `fakes.py`'s outlet).

A share consumer's message, its flags, the account of deaths, the memory of known outcomes, a retry
tier and the decisions as an isolation turn uses them: each records what it was asked and answers
what the test sets; none does I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import Ack, ErrorInfo
from sidecar.core.record import Tracked
from sidecar.core.wire import Answer
from sidecar.engines.interfaces import Delivery, DlqSink
from sidecar.engines.share.batch import Acquired, Batch
from sidecar.kafka.share import ShareSettings, Step
from tests.unit.engines.fakes import tracked

Coord = tuple[str, int, int]

SETTINGS = ShareSettings(
    delivery_count_limit=3,
    group_delivery_count_limit=8,
    group_delivery_count_limit_source="group config",
    lock_duration_ms=30_000,
    lock_duration_source="group config",
)


@dataclass
class FakeMessage:
    """The calls the share engine's parts make on a confluent-kafka `Message`."""

    offset_: int
    count: int | None = 1
    topic_: str = "t"
    partition_: int = 0

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def delivery_count(self) -> int | None:
        return self.count

    @property
    def tracked(self) -> Tracked:
        return tracked(self.offset_, self.topic_, self.partition_)

    @property
    def coord(self) -> Coord:
        return (self.topic_, self.partition_, self.offset_)


@dataclass
class FakeFlags:
    """The share consumers' flags: a stop asked for, consumers with acknowledgements unsent."""

    stop_requested: bool = False
    dirty: set[int] = field(default_factory=set)

    def unflushed(self, *, besides: int) -> bool:
        return bool(self.dirty - {besides})


@dataclass
class FakeDeaths:
    """The account of deaths, as the parts tell it; `journal` stands for one when set."""

    journal: Any = None
    unsent_: list[tuple[Coord, bool]] = field(default_factory=list)
    alone_: list[list[Coord]] = field(default_factory=list)
    answers: list[tuple[Coord, bool]] = field(default_factory=list)
    settled: list[list[tuple[Coord, bool]]] = field(default_factory=list)
    checks: list[int] = field(default_factory=list)
    archived: list[tuple[Coord, int, str]] = field(default_factory=list)

    def unsent(self, coord: Coord, *, suspect: bool = False) -> None:
        self.unsent_.append((coord, suspect))

    def alone(self, coords: Iterable[Coord]) -> None:
        self.alone_.append(list(coords))

    def answered(self, coord: Coord, released: bool) -> None:
        self.answers.append((coord, released))

    def settle(self, outcomes: Iterable[tuple[Coord, bool]]) -> None:
        self.settled.append(list(outcomes))

    def check(self, suspects_waiting: int) -> None:
        self.checks.append(suspects_waiting)

    def archived_by_broker(self, coord: Coord, broker: int, how: str) -> None:
        self.archived.append((coord, broker, how))


@dataclass
class FakeKnown:
    """The memory of known outcomes: the records released here, the records the breaker held."""

    known: list[Coord] = field(default_factory=list)
    held: list[Coord] = field(default_factory=list)

    def outcome_known(self, msg: Any) -> None:
        self.known.append((msg.topic(), msg.partition(), msg.offset()))

    def remember_held(self, topic: str, partition: int, offset: int) -> None:
        self.held.append((topic, partition, offset))


@dataclass
class FakeTiers:
    """A `TierWriter`: the writes asked for, and the outcome it answers."""

    outcome: ArchiveOutcome = ArchiveOutcome.WRITTEN
    writes: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, count, delay)

    async def write(
        self,
        tracked: Tracked,
        delivery_count: int,
        delay_ms: int,
        error: ErrorInfo | None,
        *,
        sink: DlqSink,
    ) -> ArchiveOutcome:
        self.writes.append((tracked.record.offset, delivery_count, delay_ms))
        return self.outcome


@dataclass
class FakeDeciding:
    """The decisions as an isolation turn uses them: every delivery answered `answer`, at once,
    and decided `ack`; the steps made, recorded."""

    ack: Ack = Ack.ACCEPT
    answer: Answer = field(default_factory=lambda: Answer("accept"))
    waited: list[list[int]] = field(default_factory=list)  # offsets per batch
    steps: list[Step] = field(default_factory=list)

    async def wait_answers(self, batch: Batch, deliveries: Sequence[Delivery[Acquired]]) -> None:
        self.waited.append([d.tracked.record.offset for d in deliveries])
        for d in deliveries:
            d.answer = self.answer
        await trio.lowlevel.checkpoint()

    def decide_all(
        self,
        nursery: trio.Nursery,
        deliveries: Sequence[Delivery[Acquired]],
        out: list[tuple[Any, Ack]],
    ) -> None:
        out.extend((d.ref.msg, self.ack) for d in deliveries)

    def step(
        self,
        decisions: list[tuple[Any, Ack]],
        flush: bool = False,
        next: Callable[[], Awaitable[Step]] | None = None,
    ) -> Step:
        step = Step(decisions, flush, next)
        self.steps.append(step)
        return step
