"""The bench's Kafka broker: ``$KAFKA_BOOTSTRAP`` or one started for the run; topics, records.

``Broker.open`` takes the broker of ``$KAFKA_BOOTSTRAP``, or starts one with ``scripts/kafka start``
in a private state directory (stopped by ``close``, which deletes the bench's topics either way).
The records' shape is fixed here: ``PARTITIONS`` partitions, ``DISTINCT_KEYS`` keys,
``VALUE_BYTES`` bytes per value unless a run asks for others.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.measure import PY, ROOT

PARTITIONS = 6
DISTINCT_KEYS = 10_000
VALUE_BYTES = 1024


@dataclass
class Broker:
    bootstrap: str
    own_state_dir: str | None = None
    topics: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, extra: dict[str, str] | None = None) -> Broker:
        """``$KAFKA_BOOTSTRAP``'s broker, or one of the run's own; with ``extra`` broker properties
        always one of its own (``DLQ_KAFKA_EXTRA``)."""
        external = os.environ.get("KAFKA_BOOTSTRAP")
        if external and not extra:
            return cls(external)
        # A private state dir: `scripts/kafka start` would otherwise hand back (and our stop
        # would later kill) a broker someone else started.
        state_dir = tempfile.mkdtemp(prefix="bench-kafka-state-")
        env = dict(os.environ, DLQ_KAFKA_STATE_DIR=state_dir)
        env.pop("KAFKA_BOOTSTRAP", None)
        if extra:
            env["DLQ_KAFKA_EXTRA"] = ",".join(f"{k}={v}" for k, v in extra.items())
        print(f"starting a broker with scripts/kafka start {extra or ''} ...", flush=True)
        done = subprocess.run(
            [PY, str(ROOT / "scripts" / "kafka"), "start"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return cls(done.stdout.strip().splitlines()[-1], state_dir)

    def close(self) -> None:
        from confluent_kafka.admin import AdminClient

        if self.topics:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            for future in admin.delete_topics(self.topics, operation_timeout=30).values():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
        if self.own_state_dir:
            env = dict(os.environ, DLQ_KAFKA_STATE_DIR=self.own_state_dir)
            # Without this, `scripts/kafka stop` leaves the broker running: with KAFKA_BOOTSTRAP set
            # it stops nothing ("that broker is not ours to stop").
            env.pop("KAFKA_BOOTSTRAP", None)
            subprocess.run([PY, str(ROOT / "scripts" / "kafka"), "stop"], env=env, check=False)
            shutil.rmtree(self.own_state_dir, ignore_errors=True)

    def create_topic(
        self, name: str, partitions: int = PARTITIONS, config: dict[str, str] | None = None
    ) -> str:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(name, partitions, 1, config=config or {})
        admin.create_topics([new])[name].result(timeout=30)
        self.topics.append(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=5).topics.get(name)
            if (
                md
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return name
            time.sleep(0.05)
        raise TimeoutError(f"topic {name} has no leaders")

    def end_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-watermarks"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)
            }
        finally:
            consumer.close()

    def produce_bulk(self, topic: str, count: int, value_bytes: int) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 20,
                "batch.size": max(1_000_000, 2 * value_bytes),
                "message.max.bytes": max(1_000_000, 2 * value_bytes),
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        block = os.urandom(value_bytes)
        for i in range(count):
            value = b"%08d" % i + block[8:]
            while True:
                try:
                    producer.produce(topic, value, b"key-%05d" % (i % DISTINCT_KEYS))
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 1000 == 0:
                producer.poll(0)
        if producer.flush(60) != 0:
            raise RuntimeError("produce did not complete")

    def produce_values(self, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
        """Produce ``values`` (key ``key-<i>``) in order; returns each one's (partition, offset)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        where: dict[int, tuple[int, int]] = {}
        for i, value in enumerate(values):
            producer.produce(topic, value, b"key-%05d" % i, on_delivery=_where_noter(where, i))
            producer.poll(0)
        if producer.flush(60) != 0 or len(where) != len(values):
            raise RuntimeError("produce did not complete")
        return [where[i] for i in range(len(values))]

    def read_headers(self, topic: str) -> list[tuple[int, int, dict[str, bytes]]]:
        """Every record of ``topic`` (if it exists): (partition, offset, headers), headers by name."""
        return [(p, o, h) for p, o, h, _ in self.read_records(topic)]

    def read_values(self, topic: str) -> list[bytes]:
        """Every record's value of ``topic`` (if it exists); a null value is empty."""
        return [v for _, _, _, v in self.read_records(topic)]

    def read_records(self, topic: str) -> list[tuple[int, int, dict[str, bytes], bytes]]:
        """Every record of ``topic`` (if it exists): (partition, offset, headers by name, value)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        out: list[tuple[int, int, dict[str, bytes], bytes]] = []
        try:
            md = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if md is None or md.error is not None:
                return out
            ends = {}
            for p in md.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high > low:
                    ends[p] = high
            if not ends:
                return out
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
            deadline = time.monotonic() + 30
            last: dict[int, int] = {}
            while time.monotonic() < deadline and any(
                last.get(p, -1) + 1 < end for p, end in ends.items()
            ):
                for msg in consumer.consume(500, 0.2):
                    partition, offset = msg.partition(), msg.offset()
                    if msg.error() is not None or partition is None or offset is None:
                        continue
                    last[partition] = offset
                    headers: dict[str, bytes] = {}
                    raw: Any = msg.headers() or []
                    for name, value in raw:
                        if isinstance(value, bytes):
                            headers[name] = value
                    out.append((partition, offset, headers, msg.value() or b""))
        finally:
            consumer.close()
        return out

    def set_group_config(self, group: str, configs: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
        from confluent_kafka.admin._resource import ResourceType

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        res = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ],
        )
        admin.incremental_alter_configs([res])[res].result(timeout=15)

    def produce_at_rate(self, topic: str, rate: float, seconds: float) -> list[int]:
        """Produce at a fixed offered rate; each record carries its produce time (monotonic ns).

        Returns each record's produce-to-ack time in ns: the broker's own share of the latency,
        which no consumer can beat.
        """
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        count = int(rate * seconds)
        value = os.urandom(VALUE_BYTES)
        acks: list[int] = []
        start = time.monotonic()
        for i in range(count):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sent = time.monotonic_ns()
            producer.produce(
                topic,
                value,
                b"key-%05d" % (i % DISTINCT_KEYS),
                headers=[("bench-ts", b"%d" % sent)],
                on_delivery=_ack_timer(acks, sent),
            )
            producer.poll(0)
        producer.flush(30)
        return acks


def _where_noter(where: dict[int, tuple[int, int]], index: int) -> Any:
    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            where[index] = (msg.partition(), msg.offset())

    return on_delivery


def _ack_timer(acks: list[int], sent_ns: int) -> Any:
    def on_delivery(_err: Any, _msg: Any) -> None:
        acks.append(time.monotonic_ns() - sent_ns)

    return on_delivery
