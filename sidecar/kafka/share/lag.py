"""The share group's lag as this sidecar estimates it (engine: share), for metrics and autoscaling.

Owns `ShareLagEstimate`: per source partition, the high watermark less the furthest offset this
process was handed (why an estimate, and how several pods' estimates combine: its docstring).

Imports confluent_kafka's admin types and trio only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]

# How often the high watermarks are read (one metadata and one ListOffsets request per refresh).
REFRESH_S = 10.0


class ShareLagEstimate:
    """Per partition of the source topics: the high watermark and the furthest offset handed here.

    Kafka 4.2+ brokers compute a share partition's lag themselves (KIP-1226: DescribeShareGroupOffsets
    returns it next to the share-partition start offset), but the pinned confluent-kafka (2.16) and its
    librdkafka have no share-group admin call, so the sidecar cannot read it. It estimates instead, per
    source partition:

        lag = high watermark - (furthest offset this process was handed + 1)

    that is, the records past the furthest one this sidecar's share consumers acquired, for each partition
    it was handed a record of at least once (a partition the group assigned elsewhere gets no series, so a
    pod never reports a partition it does not read). Records acquired and not yet acknowledged are not in
    it (they are in flight).

    With several pods in one share group each one sees only the records it acquired: the group's lag is
    the smallest estimate across pods for a partition (``min by (topic, partition)`` in PromQL), the
    furthest any member got; a pod that lost a partition in a rebalance keeps its older, larger estimate,
    which the minimum ignores. It is an estimate: it lags the broker by up to one refresh, it counts
    nothing on a partition before the first record was acquired, and a record released back and acquired
    again is not counted.
    """

    def __init__(self, topics: Iterable[str], refresh_s: float = REFRESH_S) -> None:
        self.topics = tuple(topics)
        self.refresh_s = refresh_s
        self._next: dict[PartitionKey, int] = {}  # furthest offset handed here, plus one
        self._end: dict[PartitionKey, int] = {}  # high watermark at the last refresh

    def handed_all(self, coords: Sequence[tuple[str, int, int]]) -> None:
        """A consumer of this process acquired these records, by (topic, partition, offset)."""
        nxt = self._next
        for topic, partition, offset in coords:
            key = (topic, partition)
            if offset + 1 > nxt.get(key, -1):
                nxt[key] = offset + 1

    def update_ends(self, ends: dict[PartitionKey, int]) -> None:
        """Record the high watermarks just read."""
        self._end.update(ends)

    def lag(self) -> dict[PartitionKey, int]:
        """The estimate per partition handed here whose high watermark has been read."""
        return {
            key: max(0, self._end[key] - nxt) for key, nxt in self._next.items() if key in self._end
        }

    async def run(self, admin_factory: Callable[[], Any]) -> None:
        """Refresh the high watermarks every `refresh_s` until cancelled (errors are retried), with
        one admin client from `admin_factory` (kept referenced: a dropped client never answers)."""
        admin = await trio.to_thread.run_sync(admin_factory)
        while True:
            try:
                self.update_ends(await trio.to_thread.run_sync(self._read_ends, admin))
            except (KafkaException, TimeoutError) as exc:
                log.debug("share lag estimate: cannot read the high watermarks: %s", exc)
            await trio.sleep(self.refresh_s)

    def _read_ends(self, admin: Any) -> dict[PartitionKey, int]:
        parts: list[TopicPartition] = []
        metadata = admin.list_topics(timeout=10)
        for topic in self.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            parts.extend(TopicPartition(topic, p) for p in sorted(meta.partitions))
        if not parts:
            return {}
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in parts},  # type: ignore[no-untyped-call]
            request_timeout=5,
        )
        return {
            (tp.topic, tp.partition): int(f.result(timeout=10).offset) for tp, f in futures.items()
        }
