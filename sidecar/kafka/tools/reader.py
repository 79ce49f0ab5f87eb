"""The operator tools' read-only consumer: partitions, watermarks, a group's offsets, a bounded read.

Owns `ReadConsumer` (assign only, read_committed, never commits on its own: its docstring).

Imports confluent-kafka, the pure core and `sidecar.kafka.errors` / `.tools.records` only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sidecar.kafka.errors import KafkaCallError, translate
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.tools.records import ReadRecord


class ReadConsumer:
    """A consumer that reads by assign() and never commits on its own (`group`: the one it commits to
    when asked, else a throwaway one).

    `ReadConsumer` reads by assign(), never commits on its own, and reads committed records only (aborted
    transactional DLQ writes are not DLQ records). `read_range` stops at the ends it is given (the high
    watermarks seen at start, as `dlq inspect` and `dlq replay` pass them), so a command never waits for
    records appended meanwhile, and raises `KafkaCallError` when the broker stalls. A group given to it is
    only ever committed to explicitly (`commit`: `dlq replay`'s progress under its name). Blocking, every
    broker call has a timeout; every `KafkaException` leaves as `KafkaCallError`.
    """

    def __init__(self, props: Mapping[str, Any], group: str | None = None) -> None:
        # A group id is required by librdkafka even for assign(); a throwaway one leaves no trace
        # because nothing is ever committed under it.
        self.group = group or f"dlq-inspect-{uuid.uuid4().hex[:12]}"
        try:
            self._consumer = Consumer(
                {
                    **props,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    # Whatever the configuration says: aborted transactional DLQ writes (and the
                    # abort-only probes of the marker check) are not DLQ records.
                    "isolation.level": "read_committed",
                },
                logger=librdkafka_logger(),
            )
        except KafkaException as exc:
            raise translate("cannot create a Kafka consumer", exc, KafkaCallError) from exc

    def close(self) -> None:
        try:
            self._consumer.close()
        except KafkaException as exc:
            raise translate("cannot close the Kafka consumer", exc, KafkaCallError) from exc

    def partitions(self, topic: str, timeout_s: float = 15) -> list[int]:
        """The topic's partitions, sorted; empty when the topic does not exist (or is not readable)."""
        try:
            md = self._consumer.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise translate(f"cannot read the metadata of {topic}", exc, KafkaCallError) from exc
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return []
        return sorted(tmd.partitions)

    def watermarks(
        self, topic: str, partitions: Sequence[int], timeout_s: float = 15
    ) -> dict[int, tuple[int, int]]:
        """Each partition's (low, high) watermark."""
        out: dict[int, tuple[int, int]] = {}
        for p in partitions:
            try:
                lo, hi = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=timeout_s
                )
            except KafkaException as exc:
                raise translate(
                    f"cannot read the offsets of {topic}[{p}]", exc, KafkaCallError
                ) from exc
            out[p] = (lo, hi)
        return out

    def committed(
        self, topic: str, partitions: Sequence[int], timeout_s: float = 15
    ) -> dict[int, tuple[int, str | None]]:
        """The group's committed (offset, metadata) per partition; the offset is negative when none."""
        try:
            tps = self._consumer.committed(
                [TopicPartition(topic, p) for p in partitions], timeout=timeout_s
            )
        except KafkaException as exc:
            raise translate(
                f"cannot read the offsets of group {self.group}", exc, KafkaCallError
            ) from exc
        return {tp.partition: (tp.offset, tp.metadata) for tp in tps}

    def commit(self, topic: str, offsets: Mapping[int, int], metadata: str) -> None:
        """Commit `offsets` (partition -> next offset) with `metadata`, synchronously."""
        try:
            self._consumer.commit(
                offsets=[
                    TopicPartition(topic, p, o, metadata=metadata) for p, o in offsets.items()
                ],
                asynchronous=False,
            )
        except KafkaException as exc:
            raise translate(
                f"cannot commit the offsets of group {self.group}", exc, KafkaCallError
            ) from exc

    def read_range(
        self,
        topic: str,
        ranges: Mapping[int, tuple[int, int]],
        *,
        stop: Callable[[], bool] = lambda: False,
        skip_partition: Callable[[int], bool] = lambda _p: False,
        batch: int = 500,
        stall_timeout_s: float = 30.0,
    ) -> Iterator[list[ReadRecord]]:
        """Yield batches of `topic`'s records from each partition's start offset up to (excluding) its end.

        A partition is finished at its end offset or at a partition-EOF event (a transaction marker can
        sit on the last offset, so offset `end - 1` may never arrive). Raises KafkaCallError when nothing
        arrives for `stall_timeout_s` while records are still expected.
        """
        return self.read_ranges(
            {(topic, p): r for p, r in ranges.items()},
            stop=stop,
            skip=lambda key: skip_partition(key[1]),
            batch=batch,
            stall_timeout_s=stall_timeout_s,
        )

    def read_ranges(
        self,
        ranges: Mapping[tuple[str, int], tuple[int, int]],
        *,
        stop: Callable[[], bool] = lambda: False,
        skip: Callable[[tuple[str, int]], bool] = lambda _key: False,
        batch: int = 500,
        stall_timeout_s: float = 30.0,
    ) -> Iterator[list[ReadRecord]]:
        """`read_range` over partitions of several topics at once ((topic, partition) -> (start, end)):
        one assignment, so reading the newest records of many topics costs one round of fetches."""
        pending = {key: r for key, r in ranges.items() if r[0] < r[1]}
        if not pending:
            return
        what = ", ".join(dict.fromkeys(t for t, _p in pending))
        try:
            self._consumer.assign(
                [TopicPartition(t, p, start) for (t, p), (start, _end) in pending.items()]
            )
        except KafkaException as exc:
            raise translate(f"cannot read {what}", exc, KafkaCallError) from exc
        last_progress = time.monotonic()
        while pending and not stop():
            for key in [key for key in pending if skip(key)]:
                del pending[key]
            if not pending:
                break
            try:
                msgs: list[Any] = self._consumer.consume(batch, 0.5)
            except KafkaException as exc:
                raise translate(f"cannot read {what}", exc, KafkaCallError) from exc
            out = []
            for msg in msgs:
                key = (msg.topic(), msg.partition())
                err = msg.error()
                if key not in pending:
                    continue  # finished, skipped, or prefetched beyond the end
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        del pending[key]
                        last_progress = time.monotonic()
                        continue
                    raise KafkaCallError(f"cannot read {key[0]}[{key[1]}]: {err.str()}")
                if msg.offset() >= pending[key][1]:
                    del pending[key]
                    continue
                out.append(ReadRecord.of(msg))
                if msg.offset() >= pending[key][1] - 1:
                    del pending[key]
            if out:
                last_progress = time.monotonic()
                yield out
            elif time.monotonic() - last_progress > stall_timeout_s:
                topics = dict.fromkeys(t for t, _p in pending)
                waiting = ", ".join(
                    f"[{p}] up to {end}" if len(topics) == 1 else f"{t}[{p}] up to {end}"
                    for (t, p), (_s, end) in sorted(pending.items())
                )
                raise KafkaCallError(
                    f"no records from {', '.join(topics)} for {stall_timeout_s:.0f}s "
                    f"while expecting {waiting}"
                )


__all__ = ["ReadConsumer"]
