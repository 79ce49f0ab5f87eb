"""A share consumer's batch and the steps its thread runs (:mod:`sidecar.engines.share_group`).

A batch is one poll's records on one consumer; its `_process_batch` call in trio returns a `Step`
(acknowledge these, send them now or with the next poll, then run the next step), and a batch with
suspects runs one step per suspect (`SuspectRun`, in `isolation_order`). Plain data, no client calls:
the Kafka types appear in annotations only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from sidecar.core.record import Tracked
from sidecar.engines.share_journal import Coord

if TYPE_CHECKING:
    from confluent_kafka import AcknowledgeType, Message

PartitionKey = tuple[str, int]


@dataclass(slots=True, eq=False)
class Batch:
    """One poll's records on one consumer; all of them are acknowledged before that consumer polls again."""

    consumer: int
    deadline: float  # trio time: answers after this count as releases (the lock is about to expire)
    pending: int = 0
    answered: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop waiting for answers
    hard: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop the DLQ writes too


@dataclass(frozen=True, slots=True)
class Acquired:
    """A `Delivery`'s ref: the message to acknowledge and the batch it belongs to."""

    msg: Message
    batch: Batch


@dataclass(slots=True)
class Step:
    """What a consumer thread does with one part of a batch: acknowledge `decisions`, send them
    now when `flush`, then run `next` (in trio) for the next part, if any."""

    decisions: list[tuple[Message, AcknowledgeType]]
    flush: bool = False
    next: Callable[[], Awaitable[Step]] | None = None


@dataclass(slots=True)
class SuspectRun:
    """A batch's suspects, delivered one at a time after its other records are settled."""

    consumer: int
    deadline: float
    remaining: list[tuple[Message, Tracked, int]]
    held: list[PartitionKey]
    total: int = 0

    def __post_init__(self) -> None:
        self.total = len(self.remaining)


@dataclass(frozen=True, slots=True)
class AckCommit:
    offsets: dict[PartitionKey, int]
    error: str | None
    done: tuple[Coord, ...] = ()  # on success: the records whose acknowledgement the broker has


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


def ack_commit(offsets: Mapping[Any, Any], exc: Exception | None) -> AckCommit:
    counts = {(str(tp.topic), int(tp.partition)): len(offs) for tp, offs in offsets.items()}
    if exc is not None:
        return AckCommit(counts, str(exc))
    done = tuple(
        (str(tp.topic), int(tp.partition), int(o)) for tp, offs in offsets.items() for o in offs
    )
    return AckCommit(counts, None, done)


__all__ = [
    "AckCommit",
    "Acquired",
    "Batch",
    "Step",
    "SuspectRun",
    "ack_commit",
    "isolation_order",
]
