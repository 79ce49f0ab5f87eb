"""Private brokers: one behind a fault proxy, shared by the broker and network scenarios (started once: ~15 s);
one with short share sessions for the share engine's crash isolation (tests/reliability/share_killer.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException

from tests.faults.broker import PrivateBroker, free_port
from tests.faults.proxy import PASS, FaultProxy
from tests.kafkatools import Broker


@pytest.fixture(scope="session")
def private_kafka() -> Iterator[tuple[PrivateBroker, FaultProxy]]:
    proxy_port = free_port()
    with (
        PrivateBroker(advertised_port=proxy_port) as broker,
        FaultProxy(broker.upstream, proxy_port) as proxy,
    ):
        broker.start()
        yield broker, proxy


@pytest.fixture
def kafka_behind_proxy(
    private_kafka: tuple[PrivateBroker, FaultProxy],
) -> Iterator[tuple[PrivateBroker, FaultProxy]]:
    broker, proxy = private_kafka
    if broker.proc is None or broker.proc.poll() is not None:
        broker.start()  # an earlier scenario left it dead: every scenario starts from a live broker
    proxy.set_mode(PASS)
    yield broker, proxy
    proxy.set_mode(PASS)


# A SIGKILLed share consumer keeps its records until its share session expires (45 s at the least on a
# default broker, so a killer run of four deaths takes minutes): 6 s here. Everything else is the default.
SHORT_SHARE_SESSIONS = {
    "group.share.min.session.timeout.ms": "6000",
    "group.share.session.timeout.ms": "6000",
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.share.heartbeat.interval.ms": "1000",
    "group.coordinator.rebalance.protocols": "classic,consumer,share",
}


@pytest.fixture(scope="session")
def share_kafka() -> Iterator[str]:
    """The bootstrap of a private broker whose share sessions expire after 6 s."""
    with PrivateBroker(extra=SHORT_SHARE_SESSIONS) as broker:
        broker.start()
        # A fresh broker answers NOT_COORDINATOR to offset requests until its offsets topic is up.
        tools = Broker(broker.direct)
        topic = tools.create_topic(f"warmup-{uuid.uuid4().hex[:6]}", 1)
        deadline = time.monotonic() + 60
        while True:
            try:
                tools.committed("warmup", topic, [0])
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield broker.direct
