"""The consumer queue's wake-up reads confluent-kafka's private handle layout only where it was
checked: the pinned version is one of them, the handle read is the consumer's, and a check that
fails gives its reason instead of a pointer."""

from __future__ import annotations

import os
from collections.abc import Iterator

import confluent_kafka
import pytest

from sidecar.kafka.queue_signal import (
    CHECKED_WITH,
    QueueSignal,
    handle_pointer,
    installed_version,
    queue_signal,
)

PROPS = {"bootstrap.servers": "", "group.id": "layout-check", "log_level": 0}


@pytest.fixture
def consumer() -> Iterator[confluent_kafka.Consumer]:
    c = confluent_kafka.Consumer({**PROPS, "client.id": "layout-check"})
    yield c
    c.close()


def test_the_installed_confluent_kafka_is_one_the_layout_was_checked_with() -> None:
    # A new pin of confluent-kafka fails here until its Handle struct (confluent_kafka.h: the
    # rd_kafka_t * right after PyObject_HEAD) is read again and CHECKED_WITH says so.
    version = installed_version()
    assert version in CHECKED_WITH, f"confluent-kafka {version}: re-read Handle's layout"
    assert confluent_kafka.Consumer.__basicsize__ == CHECKED_WITH[version]


def test_the_handle_read_is_the_consumer_s_and_its_queue_signals(
    consumer: confluent_kafka.Consumer,
) -> None:
    signal = queue_signal(consumer, "layout-check")
    assert isinstance(signal, QueueSignal), signal
    assert handle_pointer(consumer) != 0
    try:
        # Nothing queued yet is fine either way; the descriptor is a non-blocking pipe.
        assert os.get_blocking(signal.fd) is False
        signal.clear()
    finally:
        signal.close()
    signal.close()  # a second close does nothing


def test_a_handle_named_after_another_client_id_is_refused(
    consumer: confluent_kafka.Consumer,
) -> None:
    reason = queue_signal(consumer, "someone-else")
    assert isinstance(reason, str)
    assert "'layout-check#consumer-" in reason and "someone-else" in reason


def test_a_producer_s_handle_is_not_taken_for_a_consumer() -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": "", "client.id": "layout-check"})
    reason = queue_signal(producer, "layout-check")  # type: ignore[arg-type]
    assert reason == "the handle read is not a librdkafka consumer"


def test_an_unchecked_version_is_not_read(
    consumer: confluent_kafka.Consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sidecar.kafka.queue_signal.CHECKED_WITH", {})
    reason = queue_signal(consumer, "layout-check")
    assert reason == (
        f"confluent-kafka {installed_version()} is not one the handle layout was checked with"
    )


def test_a_closed_consumer_has_no_handle_to_read() -> None:
    c = confluent_kafka.Consumer({**PROPS, "client.id": "layout-check"})
    c.close()
    assert queue_signal(c, "layout-check") == "the consumer has no librdkafka handle (closed)"
