"""A share consumer's batch and its suspects (:mod:`sidecar.engines.share.group`).

A batch is one poll's records on one consumer; its `on_batch` call in trio returns a `Step`
(:mod:`sidecar.kafka.share.consumer`: acknowledge these, send them now or with the next poll, then run
the next step), and a batch with suspects runs one step per suspect (`SuspectRun`, in
`isolation_order`); a record's coordinates (`coordinates`). Plain data, no client calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import trio

from sidecar.core.record import Tracked
from sidecar.kafka.message import Message

PartitionKey = tuple[str, int]


def coordinates(msg: Message) -> tuple[str, int, int]:
    """A record's (topic, partition, offset), as the journal and the held set key it."""
    return (str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))


@dataclass(slots=True, eq=False)
class Batch:
    """One poll's records on one consumer; all of them are acknowledged before that consumer polls again."""

    consumer: int
    deadline: float  # trio time: answers after this count as releases (the lock is about to expire)
    pending: int = 0
    answered: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop waiting for answers
    hard: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop the DLQ writes too

    def expect(self, n: int) -> None:
        """`n` deliveries handed out: the batch waits for as many answers."""
        self.pending = n

    def one_answered(self) -> None:
        """One answer in: the batch's wait ends with its last."""
        self.pending -= 1
        if self.pending <= 0:
            self.answered.set()


class Acquired(NamedTuple):
    """A `Delivery`'s ref: the message to acknowledge, the batch it belongs to, and the record's
    coordinates (topic, partition, offset; read from the message once)."""

    msg: Message
    batch: Batch
    coord: tuple[str, int, int]


@dataclass(slots=True)
class SuspectRun:
    """A batch's suspects, delivered one at a time after its other records are settled."""

    consumer: int
    deadline: float
    remaining: list[tuple[Message, Tracked, int]]
    held: Mapping[PartitionKey, int]  # its batch's records per partition (`InFlight.hold`)
    total: int = 0

    def __post_init__(self) -> None:
        self.total = len(self.remaining)


def isolation_order(
    suspects: Sequence[tuple[Message, Tracked, int]], *, own_counts: bool = False
) -> list[tuple[Message, Tracked, int]]:
    """The order suspects go out in, one at a time.

    A record that kills the sidecar leaves the suspects waiting behind it held at its death. With
    the sidecar's own counts (a journal), a death charges only the record alone at the app, so the
    culprit's count is above its peers': lowest count first sends it last. With the broker's counts
    (a death charges every record held), offset order, reversed when the lowest count is odd: the
    next pass, one count higher, runs the other way, so the survivors go out before the culprit.
    """

    def offset(s: tuple[Message, Tracked, int]) -> tuple[str, int, int]:
        return (s[1].record.topic, s[1].record.partition, s[1].record.offset)

    if own_counts:
        return sorted(suspects, key=lambda s: (s[2], offset(s)))
    ordered = sorted(suspects, key=offset)
    if min(c for _m, _t, c in suspects) % 2:
        ordered.reverse()
    return ordered


__all__ = ["Acquired", "Batch", "SuspectRun", "coordinates", "isolation_order"]
