"""One record read back from a topic at an offset: the original of a headers-only DLQ record.

A headers-only DLQ record (copy off, or the copy dropped as too large; or another writer's record
without key and value) is replayed, or shown, from its source topic while retention still holds the
offset. `OffsetFetcher.fetch` tells "found", "gone for good" (deleted topic or partition, offset below
the low watermark, compacted away) and "not readable now" (a failure) apart; `log_start` alone is
the cheap check (one watermark request per partition) that `payload_gone` words.

Imports confluent-kafka, the pure core and `sidecar.kafka.errors` / `.tools.records` only.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sidecar.kafka.errors import KafkaCallError, translate
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.tools.records import ReadRecord


class Fetched(NamedTuple):
    """(record, None, _) when found; (None, reason, True) when gone for good; (None, reason, False)
    when it could not be read now (a failure, not a skip)."""

    record: ReadRecord | None
    reason: str | None
    gone: bool


FETCH_WAIT_MAX_MS = 10


def payload_gone(topic: str, partition: int, offset: int, log_start: int) -> str:
    """The plain words for a source offset below its partition's log start."""
    return (
        f"payload gone: source offset {topic}[{partition}]@{offset} was deleted "
        f"(log start now {log_start}; retention or delete-records)"
    )


class OffsetFetcher:
    """Reads one record of a topic at an offset: assign, seek, fetch. Caches partition counts."""

    def __init__(self, props: Mapping[str, Any], timeout_s: float) -> None:
        try:
            self._consumer = Consumer(
                {
                    **props,
                    "group.id": f"dlq-replay-fetch-{uuid.uuid4().hex[:12]}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    # A deleted offset must show as an error, never silently jump to another record.
                    "auto.offset.reset": "error",
                    # One record at a time: a fetch that reached the partition's end waits on the
                    # broker up to this long for more (500 ms by default), and the next record's
                    # fetch queues behind it: 0.5 s per record of a dry run, not the records' size.
                    "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
                },
                logger=librdkafka_logger(),
            )
        except KafkaException as exc:
            raise translate("cannot create a Kafka consumer", exc, KafkaCallError) from exc
        self._timeout_s = timeout_s
        # topic -> partition count, or why it is unusable
        self._partitions: dict[str, int | str] = {}

    def close(self) -> None:
        with contextlib.suppress(KafkaException):
            self._consumer.close()

    def partition_count(self, topic: str) -> int | str:
        """The topic's partition count, or why it cannot be used (it does not exist)."""
        if topic not in self._partitions:
            try:
                tmd = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
            except KafkaException as exc:
                raise translate(
                    f"cannot read the metadata of {topic}", exc, KafkaCallError
                ) from exc
            if tmd is None or tmd.error is not None or not tmd.partitions:
                self._partitions[topic] = f"source topic {topic} does not exist (deleted?)"
            else:
                self._partitions[topic] = len(tmd.partitions)
        return self._partitions[topic]

    def log_start(self, topic: str, partition: int) -> int | str:
        """The partition's log start offset (its low watermark), or why it has none: the topic or
        the partition does not exist. KafkaCallError when the broker cannot say now."""
        count = self.partition_count(topic)
        if isinstance(count, str):
            return count
        if partition >= count:
            return f"partition {partition} of {topic} does not exist"
        try:
            lo, _hi = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10
            )
        except KafkaException as exc:
            raise translate(
                f"cannot read the offsets of {topic}[{partition}]", exc, KafkaCallError
            ) from exc
        return int(lo)

    def fetch(self, topic: str, partition: int, offset: int) -> Fetched:
        """The record at `topic[partition]@offset`, or why not (see `Fetched`)."""
        count = self.partition_count(topic)
        if isinstance(count, str):
            return Fetched(None, count, True)
        if partition >= count:
            return Fetched(None, f"partition {partition} of {topic} does not exist", True)
        where = f"{topic}[{partition}]@{offset}"
        tp = TopicPartition(topic, partition)
        try:
            lo, hi = self._consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            return Fetched(None, f"cannot read the offsets of {topic}[{partition}]: {exc}", False)
        if offset < lo:
            return Fetched(None, payload_gone(topic, partition, offset, lo), True)
        if offset >= hi:
            return Fetched(None, f"source offset {where} is beyond the high watermark {hi}", True)
        try:
            self._consumer.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + self._timeout_s
            while time.monotonic() < deadline:
                msg: Any = self._consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return Fetched(None, f"no record at {where} (compacted?)", True)
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        return Fetched(
                            None, f"source offset {where} was deleted: {err.str()}", True
                        )
                    return Fetched(None, f"cannot read {where}: {err.str()}", False)
                if msg.offset() == offset:
                    return Fetched(ReadRecord.of(msg), None, False)
                if msg.offset() > offset:
                    return Fetched(None, f"no record at {where} (compacted?)", True)
            return Fetched(None, f"timed out after {self._timeout_s:.0f}s reading {where}", False)
        except KafkaException as exc:
            return Fetched(None, f"cannot read {where}: {exc}", False)
        finally:
            with contextlib.suppress(KafkaException):
                self._consumer.unassign()


__all__ = ["Fetched", "OffsetFetcher", "payload_gone"]
