"""Test helpers that talk to the real broker: create topics, produce, read a topic back, read committed offsets.

`Broker(bootstrap, config)` adds `config` (e.g. SASL_SSL or mTLS properties) to every client it makes;
`SecuredKafka` describes a broker started by `scripts/kafka start --secured` and builds those properties.

Only tests import this module; it uses confluent-kafka directly (never a fake).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Rec:
    """A record as written or read: everything the sidecar must keep byte-exact."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    partition: int | None = None
    offset: int | None = None
    timestamp_ms: int | None = None

    def headers_by_name(self) -> dict[str, list[bytes | None]]:
        """Every header value, by name, in record order."""
        out: dict[str, list[bytes | None]] = {}
        for k, v in self.headers:
            out.setdefault(k, []).append(v)
        return out

    def header(self, name: str) -> str | None:
        """The first `name` header as text (None when absent or null)."""
        for key, value in self.headers:
            if key == name:
                return None if value is None else value.decode()
        return None


@dataclass(frozen=True)
class SecuredKafka:
    """A broker started by `scripts/kafka start --secured`: where its listeners are and what clients need.

    `plain` is the PLAINTEXT listener (for setting up topics); `sasl_ssl` takes SCRAM over TLS with
    server-only TLS; `mtls` takes TLS with a client certificate (`ssl.client.auth=required`).
    """

    plain: str
    sasl_ssl: str
    mtls: str
    sasl_mechanism: str
    sasl_username: str
    sasl_password: str
    ca: str
    untrusted_ca: str
    client_certificate: str
    client_key: str
    client_key_password: str

    @classmethod
    def from_state_file(cls, path: Path) -> SecuredKafka:
        state = json.loads(path.read_text())
        return cls(plain=state["bootstrap"], **state["secured"])

    def sasl_config(self, **overrides: str) -> dict[str, str]:
        """librdkafka properties for the SASL_SSL listener (bootstrap included)."""
        return {
            "bootstrap.servers": self.sasl_ssl,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ca,
            **overrides,
        }

    def mtls_config(self, **overrides: str) -> dict[str, str]:
        """librdkafka properties for the mTLS listener (bootstrap included)."""
        return {
            "bootstrap.servers": self.mtls,
            "security.protocol": "SSL",
            "ssl.ca.location": self.ca,
            "ssl.certificate.location": self.client_certificate,
            "ssl.key.location": self.client_key,
            "ssl.key.password": self.client_key_password,
            **overrides,
        }

    def client(self, config: Mapping[str, str]) -> Broker:
        """A `Broker` whose clients all connect with `config` (from `sasl_config`/`mtls_config`)."""
        conf = dict(config)
        return Broker(conf.pop("bootstrap.servers"), conf)


class Broker:
    def __init__(self, bootstrap: str, config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = dict(config or {})
        self.admin = AdminClient(self._conf())

    def _conf(self, **extra: Any) -> dict[str, Any]:
        """Client properties: the bootstrap, the security settings given, then `extra`."""
        return {"bootstrap.servers": self.bootstrap, **self.config, **extra}

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> str:
        futures = self.admin.create_topics(
            [NewTopic(name, partitions, 1, config=config or {})], operation_timeout=30
        )
        futures[name].result(timeout=30)
        # Metadata propagates asynchronously; wait until the leader of every partition is known.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = self.admin.list_topics(name, timeout=5).topics.get(name)
            if (
                md
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return name
            time.sleep(0.05)
        raise TimeoutError(f"topic {name} has no leaders after 30s")

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topics([name], operation_timeout=30)[name].result(timeout=30)

    def topic_exists(self, name: str) -> bool:
        return name in self.admin.list_topics(timeout=10).topics

    def produce(self, topic: str, records: Iterable[Rec]) -> int:
        producer = Producer(self._conf(**{"enable.idempotence": True, "linger.ms": 5}))
        errors: list[str] = []
        n = 0

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        for rec in records:
            kwargs: dict[str, object] = {
                "key": rec.key,
                "value": rec.value,
                "on_delivery": on_delivery,
            }
            if rec.headers:
                kwargs["headers"] = list(rec.headers)
            if rec.partition is not None:
                kwargs["partition"] = rec.partition
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
        remaining = producer.flush(60)
        if remaining or errors:
            raise AssertionError(f"produce failed: {remaining} unflushed, errors {errors[:3]}")
        return n

    def read_topic(
        self, topic: str, expected: int, timeout_s: float = 60.0, group: str | None = None
    ) -> list[Rec]:
        """Read a topic from the beginning until `expected` records arrived (or the timeout)."""
        consumer = Consumer(
            self._conf(
                **{
                    "group.id": group or f"reader-{uuid.uuid4().hex[:8]}",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                }
            )
        )
        out: list[Rec] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + timeout_s
            while len(out) < expected and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.5):
                    if msg.error():
                        raise KafkaException(msg.error())
                    out.append(
                        Rec(
                            key=msg.key(),
                            value=msg.value(),
                            headers=tuple(msg.headers() or ()),
                            partition=msg.partition(),
                            offset=msg.offset(),
                            timestamp_ms=msg.timestamp()[1],
                        )
                    )
        finally:
            consumer.close()
        return out

    def count_records(self, topic: str) -> int:
        """Offsets between the low and high watermarks of every partition: the record count of a topic
        written without transactions only (transaction markers and aborted records take offsets too;
        `count_committed_records` counts records)."""
        consumer = Consumer(self._conf(**{"group.id": "wm-" + uuid.uuid4().hex[:8]}))
        try:
            md = self.admin.list_topics(topic, timeout=10).topics[topic]
            total = 0
            for p in md.partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += hi - lo
            return total
        finally:
            consumer.close()

    def read_committed_to_end(self, topic: str, timeout_s: float = 60.0) -> list[Rec]:
        """Every record a read_committed consumer reads from every partition of `topic`, start to end
        (the end is the last stable offset: an open transaction's records are not read); transaction
        markers and aborted records are not records."""
        consumer = Consumer(
            self._conf(
                **{
                    "group.id": "to-end-" + uuid.uuid4().hex[:8],
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                }
            )
        )
        try:
            md = self.admin.list_topics(topic, timeout=10).topics[topic]
            todo: set[int] = set()
            starts = []
            for p in md.partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if hi > lo:
                    todo.add(p)
                    starts.append(TopicPartition(topic, p, lo))
            out: list[Rec] = []
            if not todo:
                return out
            consumer.assign(starts)
            deadline = time.monotonic() + timeout_s
            while todo:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: partitions {sorted(todo)} not read to the end")
                for msg in consumer.consume(1000, 0.5):
                    err = msg.error()
                    if err is None:
                        out.append(
                            Rec(
                                key=msg.key(),
                                value=msg.value(),
                                headers=tuple(msg.headers() or ()),
                                partition=msg.partition(),
                                offset=msg.offset(),
                                timestamp_ms=msg.timestamp()[1],
                            )
                        )
                    elif err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(int(msg.partition() or 0))
                    else:
                        raise KafkaException(err)
            return out
        finally:
            consumer.close()

    def count_committed_records(self, topic: str, timeout_s: float = 60.0) -> int:
        """Records (not offsets) in `topic` as a read_committed consumer reads them now."""
        return len(self.read_committed_to_end(topic, timeout_s))

    def committed(
        self, group: str, topic: str, partitions: Sequence[int]
    ) -> dict[int, tuple[int, str | None]]:
        """Committed offset and metadata per partition for a group (offset -1001 when none)."""
        consumer = Consumer(self._conf(**{"group.id": group}))
        try:
            tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
            return {tp.partition: (tp.offset, tp.metadata) for tp in tps}
        finally:
            consumer.close()

    def set_group_config(self, group: str, configs: Mapping[str, str]) -> None:
        """Set a group's dynamic configs (e.g. `share.delivery.count.limit`)."""
        res = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ],
        )
        self.admin.incremental_alter_configs([res])[res].result(timeout=15)

    def group_config(self, group: str, name: str) -> str | None:
        """One of a group's configs as the broker describes it (None when it has no such entry)."""
        res = ConfigResource(ResourceType.GROUP, group)
        entry = self.admin.describe_configs([res])[res].result(timeout=15).get(name)
        return None if entry is None else str(entry.value)

    def end_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        consumer = Consumer(self._conf(**{"group.id": "wm-" + uuid.uuid4().hex[:8]}))
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions
            }
        finally:
            consumer.close()
