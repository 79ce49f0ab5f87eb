"""The consumer properties the sidecar derives from the user's `kafka:` section."""

from __future__ import annotations

from sidecar.kafka.source import consumer_properties


def test_defaults_the_sidecar_sets_and_the_user_may_override() -> None:
    props = consumer_properties({"bootstrap.servers": "b:9092", "group.id": "g"}, 64 * 2**20)
    assert props["auto.offset.reset"] == "earliest"
    # From max.buffered.bytes: a quarter for the queue, an eighth for one fetch.
    assert props["queued.max.messages.kbytes"] == 16384
    assert props["fetch.max.bytes"] == 8 * 2**20
    assert props["queued.min.messages"] == 16384
    assert props["partition.assignment.strategy"] == "cooperative-sticky"
    assert props["enable.auto.commit"] is False
    # librdkafka's 1,000 ms would leave a partition unfetched for most of each second of a backlog.
    assert props["fetch.queue.backoff.ms"] == 10
    mine = consumer_properties(
        {
            "auto.offset.reset": "latest",
            "queued.max.messages.kbytes": 1024,
            "group.id": "g",
            "fetch.queue.backoff.ms": 250,
        },
        64 * 2**20,
    )
    assert mine["auto.offset.reset"] == "latest"
    assert mine["fetch.queue.backoff.ms"] == 250
    assert mine["queued.max.messages.kbytes"] == 1024
    assert mine["fetch.max.bytes"] == 8 * 2**20


def test_the_budget_scales_the_prefetch_and_no_budget_leaves_librdkafka_defaults() -> None:
    props = consumer_properties({"group.id": "g"}, 256 * 2**20)
    assert props["queued.max.messages.kbytes"] == 65536
    assert props["fetch.max.bytes"] == 32 * 2**20
    bare = consumer_properties({"group.id": "g"})  # the start-up metadata check fetches nothing
    assert "queued.max.messages.kbytes" not in bare
    assert "fetch.max.bytes" not in bare


def test_the_sidecar_owns_offset_storing_and_the_protocol_decides_the_assignor() -> None:
    props = consumer_properties({"group.protocol": "consumer", "enable.auto.commit": True})
    assert props["enable.auto.commit"] is False
    assert props["enable.auto.offset.store"] is False
    assert "partition.assignment.strategy" not in props


def test_librdkafka_takes_every_property_the_sidecar_sets() -> None:
    # A property this librdkafka does not know fails the constructor (no broker is contacted).
    from confluent_kafka import Consumer

    props = consumer_properties({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}, 64 * 2**20)
    Consumer(props).close()
