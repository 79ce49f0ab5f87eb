"""DLQ topics (admin): the clients' properties, creating or checking the topics, what each one allows.

`DlqTopics` learns each DLQ topic's partition count (the DLQ record's partition is the source partition
modulo it) and `max.message.bytes` (a record known to be too large goes headers-only up front), creating a
missing topic when `errors.deadletterqueue.auto.create.enable` allows. Its caches are filled by
`prepare_sync`, which runs in a worker thread (start-up, or a writer meeting a topic for the first time or
again after UNKNOWN_TOPIC) and is the only code that changes them; writers read them from the trio thread.

Imports the pure core and confluent-kafka only; never the writers (they import this module).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from sidecar.kafka.dlq.errors import DlqStartupError
from sidecar.kafka.errors import kafka_error
from sidecar.kafka.logsummary import librdkafka_logger

log = logging.getLogger("sidecar.dlq")

# The topic config Kafka 4.4 checks before a share group may use a topic as its DLQ (KIP-1191).
TOPIC_CONFIG_GROUP_DLQ = "errors.deadletterqueue.group.enable"

_CONSUMER_ONLY = frozenset(
    {
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "fetch.min.bytes",
        "fetch.wait.max.ms",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "isolation.level",
        "enable.partition.eof",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "auto.commit.interval.ms",
        "check.crcs",
        "max.poll.records",
        "share.acknowledgement.mode",
        "transactional.id",
    }
)


def producer_properties(
    kafka: Mapping[str, Any], transactional_id: str | None = None
) -> dict[str, Any]:
    """The DLQ producer's properties: the user's connection settings, our safety settings."""
    props = {k: v for k, v in kafka.items() if k not in _CONSUMER_ONLY}
    props.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            # A write that cannot be confirmed within this time is reported to us and retried by us,
            # so the partition stays paused and nothing is committed past the record meanwhile.
            "message.timeout.ms": 30000,
            # A deleted DLQ topic must surface in seconds (and stop the sidecar when auto-create
            # is off), not after librdkafka's default 30 s of waiting for metadata.
            "topic.metadata.propagation.max.ms": 5000,
        }
    )
    if transactional_id:
        props["transactional.id"] = transactional_id
    return props


class DlqTopics:
    """The DLQ topics the sidecar writes to: created or checked, partition counts, size limits."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        *,
        auto_create: bool,
        topic_partitions: int,
        topic_replication_factor: int,
    ) -> None:
        self._kafka = dict(kafka)
        self.auto_create = auto_create
        self.topic_partitions = topic_partitions
        self.topic_replication_factor = topic_replication_factor
        self.partitions: dict[str, int] = {}  # topic -> partition count (known topics only)
        self.max_bytes: dict[str, int | None] = {}  # topic -> max.message.bytes (None: unknown)

    def admin(self) -> AdminClient:
        """A new admin client on the producer's connection settings (keep it referenced until its
        futures are resolved: a dropped client never answers)."""
        return AdminClient(producer_properties(self._kafka), logger=librdkafka_logger())

    def prepare_sync(self, topics: Sequence[str]) -> dict[str, int]:
        """Make sure every DLQ topic exists (creating it when allowed) and learn its partition count."""
        admin = self.admin()
        try:
            md = admin.list_topics(timeout=15)
        except KafkaException as exc:
            raise DlqStartupError(
                f"cannot read cluster metadata to check the DLQ topics: {exc}"
            ) from exc
        missing = [t for t in dict.fromkeys(topics) if t not in md.topics]
        if missing and not self.auto_create:
            raise DlqStartupError(
                f"DLQ topic(s) {', '.join(missing)} do not exist and "
                "errors.deadletterqueue.auto.create.enable is false; create them or enable auto-create"
            )
        for topic in missing:
            self._create_topic(admin, topic)
        deadline = time.monotonic() + 30
        out: dict[str, int] = {}
        for topic in dict.fromkeys(topics):
            while True:
                tmd = admin.list_topics(topic, timeout=10).topics.get(topic)
                if tmd is not None and tmd.error is None and tmd.partitions:
                    out[topic] = len(tmd.partitions)
                    break
                if time.monotonic() > deadline:
                    raise DlqStartupError(
                        f"DLQ topic {topic} has no partitions after 30s: {tmd and tmd.error}"
                    )
                time.sleep(0.1)
        self.partitions.update(out)
        for topic in out:
            self.max_bytes[topic] = self._topic_max_message_bytes(admin, topic)
        return out

    def exists_sync(self, topic: str) -> bool:
        """Whether the topic exists; True when that cannot be told (then a write is retried)."""
        try:
            md = self.admin().list_topics(timeout=10)
        except KafkaException:
            return True
        return topic in md.topics

    def forget(self, topic: str) -> None:
        """The topic went away (UNKNOWN_TOPIC): learn it again before the next write."""
        self.partitions.pop(topic, None)

    def _topic_max_message_bytes(self, admin: AdminClient, topic: str) -> int | None:
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            configs = admin.describe_configs([res])[res].result(timeout=15)
            entry = configs.get("max.message.bytes")
            return int(entry.value) if entry is not None and entry.value else None
        except (KafkaException, ValueError, TypeError):
            return None  # not allowed to describe: learn it from a MSG_SIZE_TOO_LARGE instead

    def _create_topic(self, admin: AdminClient, topic: str) -> None:
        attempts: list[dict[str, str]] = [{TOPIC_CONFIG_GROUP_DLQ: "true"}, {}]
        last: Exception | None = None
        for config in attempts:
            new = NewTopic(
                topic, self.topic_partitions, self.topic_replication_factor, config=config
            )
            try:
                admin.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
                log.info(
                    "created DLQ topic %s (%d partition%s)",
                    topic,
                    self.topic_partitions,
                    "" if self.topic_partitions == 1 else "s",
                )
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    return
                if err.code() == KafkaError.INVALID_CONFIG and config:
                    # A broker before 4.4 does not know the share-group DLQ topic config.
                    last = exc
                    continue
                raise DlqStartupError(f"cannot create DLQ topic {topic}: {exc}") from exc
        raise DlqStartupError(f"cannot create DLQ topic {topic}: {last}")


__all__ = ["TOPIC_CONFIG_GROUP_DLQ", "DlqTopics", "producer_properties"]
