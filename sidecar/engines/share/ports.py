"""What the share engine's parts use of their neighbours: one narrow interface each.

A part is given the interface of what it uses, not the whole neighbour, so its unit test builds it
from fakes (tests/unit/engines): the share consumers' flags (`ConsumerFlags`), the account of
deaths (`Deaths`), the memory of known outcomes (`Outcomes`), the batches in flight (`Batches`)
and the decisions as an isolation turn uses them (`Deciding`). The DLQ and tier side is the
pipeline's (`sidecar.engines.interfaces`).
Must not import the ledger, the consumer engine, or confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from sidecar.core.outcome import Ack
from sidecar.engines.interfaces import Delivery
from sidecar.engines.share.batch import Acquired, Batch
from sidecar.kafka.message import Message
from sidecar.kafka.share import Step

if TYPE_CHECKING:
    from sidecar.engines.share.journal import ShareJournal

PartitionKey = tuple[str, int]
Coord = tuple[str, int, int]  # (topic, partition, offset)


class ConsumerFlags(Protocol):
    """The share consumers' flags (`ShareSource`), as the isolation and the decisions read them."""

    @property
    def stop_requested(self) -> bool: ...

    def unflushed(self, *, besides: int) -> bool:
        """A consumer other than `besides` holds acknowledgements the broker has not received."""


class Deaths(Protocol):
    """The account of deaths (`DeathAccount`), as the isolation and the decisions tell it."""

    @property
    def journal(self) -> ShareJournal | None:
        """The sidecar's own counts (None: every count is the broker's)."""

    def unsent(self, coord: Coord, *, suspect: bool = False) -> None: ...
    def alone(self, coords: Iterable[Coord]) -> None: ...
    def answered(self, coord: Coord, released: bool) -> None: ...
    def settle(self, outcomes: Iterable[tuple[Coord, bool]]) -> None: ...
    def check(self, suspects_waiting: int) -> None: ...
    def archived_by_broker(self, coord: Coord, broker: int, how: str) -> None: ...


class Outcomes(Protocol):
    """What the process remembers of the records it let go (`KnownOutcomes`), as decisions tell it."""

    def outcome_known(self, msg: Message) -> None:
        """Released by this process: not a suspect when it comes back."""

    def remember_held(self, topic: str, partition: int, offset: int) -> None:
        """Held by the DLQ circuit breaker: sent to the app again when acquired past the limit."""


class Batches(Protocol):
    """The batches in flight (`InFlight`), as an isolation turn adds its own and waits for others."""

    @property
    def delivering(self) -> int:
        """Batches still delivering their ordinary records."""

    def add(self, batch: Batch) -> None: ...
    def discard(self, batch: Batch) -> None: ...
    def release(self, counts: Mapping[PartitionKey, int]) -> None: ...


class Deciding(Protocol):
    """The decisions (`Decisions`), as an isolation turn has its suspects' answers decided."""

    async def wait_answers(
        self, batch: Batch, deliveries: Sequence[Delivery[Acquired]]
    ) -> None: ...

    def decide_all(
        self,
        nursery: trio.Nursery,
        deliveries: Sequence[Delivery[Acquired]],
        out: list[tuple[Message, Ack]],
    ) -> None: ...

    def step(
        self,
        decisions: list[tuple[Message, Ack]],
        flush: bool = False,
        next: Callable[[], Awaitable[Step]] | None = None,
    ) -> Step: ...


__all__ = ["Batches", "ConsumerFlags", "Coord", "Deaths", "Deciding", "Outcomes", "PartitionKey"]
