"""The consumer properties the sidecar derives from the user's `kafka:` section."""

from __future__ import annotations

from sidecar.kafka.source import consumer_properties


def test_defaults_the_sidecar_sets_and_the_user_may_override() -> None:
    props = consumer_properties({"bootstrap.servers": "b:9092", "group.id": "g"})
    assert props["auto.offset.reset"] == "earliest"
    assert props["queued.max.messages.kbytes"] == 16384
    assert props["partition.assignment.strategy"] == "cooperative-sticky"
    assert props["enable.auto.commit"] is False
    mine = consumer_properties(
        {"auto.offset.reset": "latest", "queued.max.messages.kbytes": 1024, "group.id": "g"}
    )
    assert mine["auto.offset.reset"] == "latest"
    assert mine["queued.max.messages.kbytes"] == 1024


def test_the_sidecar_owns_offset_storing_and_the_protocol_decides_the_assignor() -> None:
    props = consumer_properties({"group.protocol": "consumer", "enable.auto.commit": True})
    assert props["enable.auto.commit"] is False
    assert props["enable.auto.offset.store"] is False
    assert "partition.assignment.strategy" not in props
