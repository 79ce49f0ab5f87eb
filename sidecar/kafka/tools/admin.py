"""The operator tools' admin client: topic names and partition counts, deleting and creating topics.

Used by the demo (a fresh topic each run) and the console (the topics a DLQ may be in, and their
watermarks, read for every partition at once). Blocking, every call has a timeout; every
`KafkaException` leaves as `KafkaCallError`.

Imports confluent-kafka, the pure core and `sidecar.kafka.errors` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from sidecar.kafka.errors import KafkaCallError, translate
from sidecar.kafka.logsummary import librdkafka_logger


class TopicAdmin:
    """An admin client on the tools' connection settings."""

    def __init__(self, props: Mapping[str, Any]) -> None:
        try:
            self._admin = AdminClient(dict(props), logger=librdkafka_logger())
        except KafkaException as exc:
            raise translate("cannot create a Kafka admin client", exc, KafkaCallError) from exc

    def topics(self, timeout_s: float = 15) -> dict[str, int]:
        """Every topic the cluster shows this client, with its partition count (0: not readable now)."""
        try:
            md = self._admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise translate("cannot read the cluster's topics", exc, KafkaCallError) from exc
        return {
            name: (len(t.partitions) if t.error is None else 0) for name, t in md.topics.items()
        }

    def watermarks(
        self, partitions: Sequence[tuple[str, int]], timeout_s: float = 15
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Each partition's (low, high) watermark, read in two requests for all of them (the
        earliest and the latest offsets; librdkafka sends one request per leader). A partition
        the broker cannot answer for now (its topic deleted meanwhile, no leader) is left out
        rather than waited for."""
        if not partitions:
            return {}
        ends: list[dict[tuple[str, int], int]] = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):  # type: ignore[no-untyped-call]
            try:
                futures = self._admin.list_offsets(
                    {TopicPartition(t, p): spec for t, p in partitions},
                    request_timeout=timeout_s,
                )
            except KafkaException as exc:
                raise translate("cannot read the offsets", exc, KafkaCallError) from exc
            found: dict[tuple[str, int], int] = {}
            for tp, fut in futures.items():
                try:
                    found[(tp.topic, tp.partition)] = int(fut.result(timeout=timeout_s).offset)
                except KafkaException:
                    continue  # not answerable now: left out, as the docstring says
            ends.append(found)
        low, high = ends
        return {k: (low[k], high[k]) for k in low if k in high}

    def delete_topics(self, names: Sequence[str], timeout_s: float = 30) -> None:
        """Delete `names` (deletion then finishes asynchronously on the broker)."""
        if not names:
            return
        try:
            for fut in self._admin.delete_topics(list(names), operation_timeout=timeout_s).values():
                fut.result(timeout=timeout_s)
        except KafkaException as exc:
            raise translate(f"cannot delete {', '.join(names)}", exc, KafkaCallError) from exc

    def create_topic(self, name: str, partitions: int, replication: int = 1) -> None:
        try:
            self._admin.create_topics(
                [NewTopic(name, partitions, replication)], operation_timeout=30
            )[name].result(timeout=30)
        except KafkaException as exc:
            raise translate(f"cannot create topic {name}", exc, KafkaCallError) from exc

    def leaders_ready(self, name: str, partitions: int, timeout_s: float = 5) -> bool:
        """True when `name` has `partitions` partitions, each with a leader."""
        try:
            md = self._admin.list_topics(name, timeout=timeout_s).topics.get(name)
        except KafkaException as exc:
            raise translate(f"cannot read the metadata of {name}", exc, KafkaCallError) from exc
        return bool(
            md
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        )


__all__ = ["TopicAdmin"]
