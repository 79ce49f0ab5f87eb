"""A private broker behind a fault proxy, shared by the broker and network scenarios (started once: ~15 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.broker import PrivateBroker, free_port
from tests.faults.proxy import PASS, FaultProxy


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
