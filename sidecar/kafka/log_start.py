"""The log start offsets of source partitions: where retention and delete-records have cut them.

Owns `read_log_starts_sync`: one ListOffsets(earliest) request per leader for the partitions asked
about, through an admin client the caller keeps. Blocking (a worker thread's call).

Imports confluent-kafka, the pure core and `sidecar.kafka.errors` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from sidecar.core.pointers import PartitionKey
from sidecar.kafka.errors import KafkaCallError, translate


def read_log_starts_sync(
    admin: Any, partitions: Sequence[PartitionKey], timeout_s: float = 10.0
) -> dict[PartitionKey, int]:
    """Each partition's log start offset; a partition the broker cannot answer for now (its topic
    deleted, no leader) is left out rather than guessed. KafkaCallError when none can be asked."""
    if not partitions:
        return {}
    try:
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.earliest() for t, p in partitions},  # type: ignore[no-untyped-call]
            request_timeout=timeout_s,
        )
    except KafkaException as exc:
        raise translate("cannot read the log start offsets", exc, KafkaCallError) from exc
    out: dict[PartitionKey, int] = {}
    for tp, fut in futures.items():
        try:
            offset = int(fut.result(timeout=timeout_s).offset)
        except KafkaException:
            continue
        if offset >= 0:
            out[(tp.topic, tp.partition)] = offset
    return out


__all__ = ["read_log_starts_sync"]
