"""Headers-only DLQ records whose payload is gone: the pipeline's watch on their source offsets.

Owns `PayloadWatch`: the headers-only DLQ records this process wrote (`sidecar.core.pointers`), the
log start offsets of their source partitions read every `errors.deadletterqueue.source.check.interval.ms`
(only of partitions with records left to watch), and the counters the metrics export
(`Counters.source_deleted`, `Counters.headers_only_watched`; this part is their one writer).

Must not import either engine, the pipeline, the ledger, or confluent-kafka (the reading is given:
`sidecar.kafka.log_start.read_log_starts_sync`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from sidecar.core.errors import KafkaClientError
from sidecar.core.pointers import PartitionKey, SourcePointers
from sidecar.engines.interfaces import Counters

log = logging.getLogger("sidecar.engine")

# (admin client, partitions) -> their log start offsets (blocking; KafkaClientError when unreadable)
ReadLogStarts = Callable[[Any, Sequence[PartitionKey]], dict[PartitionKey, int]]


class PayloadWatch:
    """Counts the headers-only DLQ records of this process whose source offset has been deleted.

    A headers-only DLQ record (``copy.record.enable: false``, the default, or a copy dropped as too
    large) holds only a pointer to its source record; once retention or delete-records passes that
    offset, the payload is gone for good and the record cannot be replayed. The count is per
    process (a restart starts again from 0; Prometheus' `increase` reads across it) and covers
    only records this process wrote; a source topic deleted whole is not counted (its offsets can
    no longer be asked about). Bounded by `sidecar.core.pointers.MAX_POINTERS`.
    """

    def __init__(self, counters: Counters, interval_s: float, pointers: SourcePointers) -> None:
        self.counters = counters
        self.interval_s = interval_s
        self.pointers = pointers
        self._bound_logged = False

    def written(self, topic: str, partition: int, offset: int) -> None:
        """A headers-only DLQ record for `topic[partition]@offset` was confirmed."""
        if not self.pointers.written(topic, partition, offset) and not self._bound_logged:
            self._bound_logged = True
            log.warning(
                "%d headers-only DLQ records are watched for their source offsets; further ones "
                "are not (dlq_sidecar_dlq_source_deleted undercounts from now on)",
                self.pointers.max_pointers,
            )
        self.counters.headers_only_watched = self.pointers.watched

    async def run(self, admin_factory: Callable[[], Any], read: ReadLogStarts) -> None:
        """Every `interval_s` until cancelled: read the log starts of the watched partitions (an
        admin client made at the first need and kept referenced: a dropped client never answers)."""
        admin: Any = None
        while True:
            await trio.sleep(self.interval_s)
            parts = self.pointers.partitions()
            if not parts:
                continue
            try:
                if admin is None:
                    admin = await trio.to_thread.run_sync(admin_factory)
                starts = await trio.to_thread.run_sync(read, admin, parts)
            except KafkaClientError as exc:
                log.debug("cannot read the source partitions' log start offsets: %s", exc)
                continue
            self.update(starts)

    def update(self, starts: dict[PartitionKey, int]) -> None:
        """Take log start offsets just read: count and log the pointers newly gone."""
        newly = self.pointers.log_starts(starts)
        for topic, n in sorted(newly.items()):
            self.counters.bump(self.counters.source_deleted, topic, n)
            log.warning(
                "%d headers-only DLQ records of source topic %s now point at deleted source offsets: "
                "their payload is gone (retention or delete-records) and they cannot be replayed",
                n,
                topic,
                extra={"fields": {"topic": topic, "records": n}},
            )
        self.counters.headers_only_watched = self.pointers.watched


__all__ = ["PayloadWatch", "ReadLogStarts"]
