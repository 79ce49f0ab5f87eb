"""Reading a DLQ topic: the read-only consumer, partitions, watermarks and a bounded range read.

The consumer reads by assign(), never commits on its own, and reads committed records only (aborted
transactional DLQ writes are not DLQ records). `read_range` stops at the high watermarks seen at start,
so a command never waits for records appended meanwhile, and raises `ToolKafkaError` when the broker
stalls. Blocking, every broker call has a timeout.

Imports: the standard library, confluent-kafka and `sidecar.ops.dlq_errors`.
Must not import the engines, the ledger, the source, the daemon or the HTTP modules; of the DLQ writer it
shares only the header names (`sidecar.kafka.dlq`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sidecar.ops.dlq_errors import ToolKafkaError, UsageError, _kafka_error


def client_properties(bootstrap: str, extra: Mapping[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **extra}


def _reader(props: Mapping[str, Any], group: str | None = None) -> Consumer:
    """A consumer that reads by assign() and never commits on its own."""
    return Consumer(
        {
            **props,
            # A group id is required by librdkafka even for assign(); a throwaway one leaves no trace
            # because nothing is ever committed under it.
            "group.id": group or f"dlq-inspect-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # Whatever the configuration says: aborted transactional DLQ writes (and the abort-only
            # probes of the marker check) are not DLQ records.
            "isolation.level": "read_committed",
        }
    )


def dlq_partitions(consumer: Consumer, topic: str, timeout_s: float = 15) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise _kafka_error(f"cannot read the metadata of {topic}", exc) from exc
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        raise UsageError(f"topic {topic} does not exist (or is not readable)")
    return sorted(tmd.partitions)


def watermarks(
    consumer: Consumer, topic: str, partitions: Sequence[int], timeout_s: float = 15
) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for p in partitions:
        try:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        except KafkaException as exc:
            raise _kafka_error(f"cannot read the offsets of {topic}[{p}]", exc) from exc
        out[p] = (lo, hi)
    return out


def read_range(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    stop: Callable[[], bool] = lambda: False,
    skip_partition: Callable[[int], bool] = lambda _p: False,
    batch: int = 500,
    stall_timeout_s: float = 30.0,
) -> Iterator[list[Any]]:
    """Yield batches of messages of `topic` from each partition's start offset up to (excluding) its end.

    The ends are the high watermarks seen at start: records appended meanwhile belong to a later run. A
    partition is finished at its end offset or at a partition-EOF event (a transaction marker can sit on
    the last offset, so offset `end - 1` may never arrive). Raises ToolKafkaError when nothing arrives for
    `stall_timeout_s` while records are still expected.
    """
    pending = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not pending:
        return
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _end) in pending.items()])
    except KafkaException as exc:
        raise _kafka_error(f"cannot read {topic}", exc) from exc
    last_progress = time.monotonic()
    while pending and not stop():
        for p in [p for p in pending if skip_partition(p)]:
            del pending[p]
        if not pending:
            break
        try:
            msgs: list[Any] = consumer.consume(batch, 0.5)
        except KafkaException as exc:
            raise _kafka_error(f"cannot read {topic}", exc) from exc
        out = []
        for msg in msgs:
            p = msg.partition()
            err = msg.error()
            if p not in pending:
                continue  # finished, skipped, or prefetched beyond the end
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    del pending[p]
                    last_progress = time.monotonic()
                    continue
                raise ToolKafkaError(f"cannot read {topic}[{p}]: {err.str()}")
            if msg.offset() >= pending[p][1]:
                del pending[p]
                continue
            out.append(msg)
            if msg.offset() >= pending[p][1] - 1:
                del pending[p]
        if out:
            last_progress = time.monotonic()
            yield out
        elif time.monotonic() - last_progress > stall_timeout_s:
            waiting = ", ".join(f"[{p}] up to {end}" for p, (_s, end) in sorted(pending.items()))
            raise ToolKafkaError(
                f"no records from {topic} for {stall_timeout_s:.0f}s while expecting {waiting}"
            )
