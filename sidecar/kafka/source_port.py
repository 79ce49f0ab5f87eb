"""What the Kafka source gives and takes: the listener's protocol and the values it is handed.

Owns `SourceListener` (what an engine implements to be given records and partition events),
`AssignedPartition` and `OffsetToCommit`, a commit's identity (`commit_key`), and the small
conversions the source makes (reset policy, topic-partition lists), its `LagReading`. `sidecar.kafka.source`
re-exports the names the engines use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from sidecar.kafka.errors import kafka_error

log = logging.getLogger("sidecar.source")

# Offsets librdkafka uses for "no committed offset".
OFFSET_INVALID = -1001
OFFSET_BEGINNING = -2
OFFSET_END = -1


@dataclass(frozen=True, slots=True)
class AssignedPartition:
    topic: str
    partition: int
    committed_offset: int | None  # None when the group has no committed offset for it
    metadata: str | None


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    topic: str
    partition: int
    offset: int
    metadata: str


class SourceListener(Protocol):
    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None: ...

    async def on_revoked(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        """Fence the partitions and return their final state to commit (before they leave)."""
        ...

    def revoked_now(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        """`on_revoked` without waiting for anything: the revoke came on trio's own thread (inside
        the wake-up path's `consume`), which must return before any task runs again."""
        ...

    async def on_lost(self, partitions: Sequence[tuple[str, int]]) -> None: ...

    def on_messages(self, messages: Sequence[Message]) -> None:
        """Take a batch, synchronously (called from trio's thread, straight from the poll
        thread's wake-up, so a batch costs no task switch). Must not block; an exception ends the
        poll loop with it, as it would end any task."""
        ...

    def messages_taken(self) -> None:
        """The batches of one wake-up are all taken (after their `on_messages`): act on them."""
        ...


# A commit's identity: what it commits. Two commits of the same offsets and metadata are
# interchangeable, so a result can go to either of their callers.
CommitKey = tuple[tuple[str, int, int, str], ...]


def commit_key(tps: Sequence[TopicPartition]) -> CommitKey:
    return tuple(sorted((tp.topic, tp.partition, tp.offset, tp.metadata or "") for tp in tps))


def values_bytes(messages: list[Message]) -> int:
    return sum(len(m) for m in messages)


def reset_offset(policy: str) -> int:
    """The logical start offset for a partition with no committed offset under `auto.offset.reset`."""
    if policy in ("smallest", "earliest", "beginning"):
        return OFFSET_BEGINNING
    if policy in ("largest", "latest", "end"):
        return OFFSET_END
    return OFFSET_INVALID  # "error": librdkafka applies it


def to_tps(offsets: Sequence[OffsetToCommit]) -> list[TopicPartition]:
    return [TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata) for o in offsets]


def names(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"


def read_committed(
    consumer: Consumer, partitions: list[TopicPartition], wait_s: float = 30.0
) -> list[TopicPartition]:
    """The group's committed offsets and metadata, retried while the coordinator moves or loads
    (a broker that was away answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS a while)."""
    if not partitions:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        try:
            result = list(consumer.committed(partitions, timeout=min(10.0, wait_s)))
            bad = next((tp.error for tp in result if tp.error is not None), None)
            if bad is not None:
                # A partition's offset unknown (UNSTABLE_OFFSET_COMMIT while a transaction
                # holds it, ...) is not "no committed offset": never start it at the reset.
                raise KafkaException(bad)
            return result
        except KafkaException as exc:
            err = kafka_error(exc)
            retriable = err.retriable() or err.code() in (
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
                KafkaError.UNSTABLE_OFFSET_COMMIT,
                KafkaError._TIMED_OUT,
                KafkaError._WAIT_COORD,
            )
            if not retriable or time.monotonic() + 1 > deadline:
                raise
            log.info("reading committed offsets: %s; retrying", exc)
            time.sleep(0.5)


def start_offsets(
    consumer: Consumer, assigned: Sequence[AssignedPartition], reset: int, wait_s: float
) -> list[TopicPartition]:
    """Where each assigned partition starts fetching: its committed offset, or where the reset
    policy (`reset`, a logical offset) puts it, looked up here for all of them at once.

    Given a logical offset, librdkafka looks each partition up on its own (its offset-query
    state) before its first fetch: with a thousand new partitions the last first record
    came 0.1 to 1.2 s after the assignment, 20 to 50 ms with one request per leader here
    (ListOffsets takes the logical offsets as timestamps; docs/scaling.md).
    What is not looked up (an error, a timeout, policy "error") starts at `reset`: librdkafka
    looks it up itself."""
    new = [
        TopicPartition(ap.topic, ap.partition, reset)
        for ap in assigned
        if ap.committed_offset is None
    ]
    found: dict[tuple[str, int], int] = {}
    if new and reset in (OFFSET_BEGINNING, OFFSET_END):
        try:
            for tp in consumer.offsets_for_times(new, timeout=wait_s):
                if tp.error is None and tp.offset >= 0:
                    found[(tp.topic, tp.partition)] = tp.offset
        except KafkaException as exc:
            log.info("looking up where %d partitions start: %s; the client does it", len(new), exc)
    return [
        TopicPartition(
            ap.topic,
            ap.partition,
            ap.committed_offset
            if ap.committed_offset is not None
            else found.get((ap.topic, ap.partition), reset),
        )
        for ap in assigned
    ]


@dataclass(frozen=True, slots=True)
class PollEnd:
    """The poll thread ended: normally (None) or with the error trio's poll loop raises."""

    error: BaseException | None


def read_lag(
    consumer: Consumer, assigned: Sequence[tuple[str, int]]
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """High watermark minus position, and the high watermark, per partition (librdkafka's cached
    values: no request)."""
    out: dict[tuple[str, int], int] = {}
    high: dict[tuple[str, int], int] = {}
    for topic, partition in assigned:
        tp = TopicPartition(topic, partition)
        try:
            _lo, hi = consumer.get_watermark_offsets(tp, cached=True)
            pos = consumer.position([tp])[0].offset
        except KafkaException:
            continue
        if hi >= 0:
            high[(topic, partition)] = hi
            if pos >= 0:
                out[(topic, partition)] = max(0, hi - pos)
    return out, high


class LagReading:
    """The source's last reading of lag and high watermarks (`read_lag`), kept for its readers."""

    def __init__(self) -> None:
        self._lag: dict[tuple[str, int], int] = {}
        self._high: dict[tuple[str, int], int] = {}

    def refresh(self, consumer: Consumer, assigned: Sequence[tuple[str, int]]) -> None:
        self._lag, self._high = read_lag(consumer, assigned)

    def lag(self, assigned: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {k: v for k, v in self._lag.items() if k in assigned}

    def high_watermarks(self, assigned: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {k: v for k, v in self._high.items() if k in assigned}
