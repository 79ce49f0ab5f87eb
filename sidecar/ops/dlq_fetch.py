"""Reading one original record back from its source topic, for a headers-only DLQ record.

A headers-only DLQ record (copy off, or the copy dropped as too large; or another writer's record
without key and value) is replayed from the source topic while its retention still holds the offset. `_SourceFetcher.fetch` tells "found", "gone for
good" (deleted topic or partition, offset below the low watermark, compacted away: a skip with
`--skip-unrecoverable`) and "not readable now" (a failure that stops the partition) apart.

Imports: the standard library, confluent-kafka and `sidecar.ops.dlq_errors`.
Must not import the engines, the ledger, the source, the daemon or the HTTP modules; of the DLQ writer it
shares only the header names (`sidecar.kafka.dlq`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sidecar.ops.dlq_errors import _kafka_error


class _SourceFetcher:
    """Reads one original record from its source topic (for headers-only DLQ records): assign, seek, fetch."""

    def __init__(self, props: Mapping[str, Any], timeout_s: float) -> None:
        self._consumer = Consumer(
            {
                **props,
                "group.id": f"dlq-replay-fetch-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A deleted offset must show as an error, never silently jump to another record.
                "auto.offset.reset": "error",
            }
        )
        self._timeout_s = timeout_s
        self._partitions: dict[
            str, int | str
        ] = {}  # topic -> partition count, or why it is unusable

    def close(self) -> None:
        self._consumer.close()

    def _partition_count(self, topic: str) -> int | str:
        if topic not in self._partitions:
            try:
                tmd = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
            except KafkaException as exc:
                raise _kafka_error(f"cannot read the metadata of {topic}", exc) from exc
            if tmd is None or tmd.error is not None or not tmd.partitions:
                self._partitions[topic] = f"source topic {topic} does not exist (deleted?)"
            else:
                self._partitions[topic] = len(tmd.partitions)
        return self._partitions[topic]

    def fetch(self, topic: str, partition: int, offset: int) -> tuple[Any | None, str | None, bool]:
        """(message, None, _) when found; (None, reason, True) when gone for good; (None, reason, False)
        when it could not be read now (a failure, not a skip)."""
        count = self._partition_count(topic)
        if isinstance(count, str):
            return None, count, True
        if partition >= count:
            return None, f"partition {partition} of {topic} does not exist", True
        tp = TopicPartition(topic, partition)
        try:
            lo, hi = self._consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            return None, f"cannot read the offsets of {topic}[{partition}]: {exc}", False
        if offset < lo:
            return (
                None,
                f"source offset {topic}[{partition}]@{offset} is below the low watermark {lo} "
                "(deleted by retention or delete-records)",
                True,
            )
        if offset >= hi:
            return (
                None,
                f"source offset {topic}[{partition}]@{offset} is beyond the high watermark {hi}",
                True,
            )
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
                        return (
                            None,
                            f"no record at {topic}[{partition}]@{offset} (compacted?)",
                            True,
                        )
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        return (
                            None,
                            f"source offset {topic}[{partition}]@{offset} was deleted: {err.str()}",
                            True,
                        )
                    return None, f"cannot read {topic}[{partition}]@{offset}: {err.str()}", False
                if msg.offset() == offset:
                    return msg, None, False
                if msg.offset() > offset:
                    return None, f"no record at {topic}[{partition}]@{offset} (compacted?)", True
            return (
                None,
                f"timed out after {self._timeout_s:.0f}s reading {topic}[{partition}]@{offset}",
                False,
            )
        except KafkaException as exc:
            return None, f"cannot read {topic}[{partition}]@{offset}: {exc}", False
        finally:
            with contextlib.suppress(KafkaException):
                self._consumer.unassign()
