"""How the source reads librdkafka's global errors: an authentication or TLS failure makes the broker
unreachable for readiness, with the cause kept and logged once, and a later connection error does not
hide it; records or a commit clear it."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from sidecar.kafka.source import KafkaSource, broker_error_reason

AUTH = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials")
TLS = KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed")
DOWN = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
TRANSPORT = KafkaError(KafkaError._TRANSPORT, "Connection refused")


class NoListener:
    pass


def source() -> KafkaSource:
    return KafkaSource({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, ["t"], NoListener())  # type: ignore[arg-type]


def test_reasons_name_the_cause_and_what_to_check() -> None:
    assert broker_error_reason(AUTH) == (
        "authentication failed (check sasl.mechanism, sasl.username and sasl.password): "
        "SASL authentication error: invalid credentials"
    )
    assert "TLS failed (check ssl.ca.location" in (broker_error_reason(TLS) or "")
    assert "cannot connect" in (broker_error_reason(TRANSPORT) or "")
    assert broker_error_reason(DOWN) is None
    assert broker_error_reason(KafkaError(KafkaError._MSG_TIMED_OUT, "x")) is None


def test_an_authentication_failure_is_kept_logged_once_and_not_hidden(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = source()
    with caplog.at_level(logging.WARNING, logger="sidecar.source"):
        for err in (AUTH, DOWN, AUTH, TRANSPORT, AUTH):
            src._on_error(err)
    assert src.broker_ok is False
    assert src.broker_error is not None and src.broker_error.startswith("authentication failed")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"kafka: {broker_error_reason(AUTH)}"]

    # A different cause is logged (once) and replaces it.
    src._on_error(TLS)
    src._on_error(TLS)
    assert src.broker_error is not None and src.broker_error.startswith("TLS failed")
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 2

    # The broker answered (records, a commit): the reason goes, and a new failure is logged again.
    src._broker_usable()
    assert (src.broker_ok, src.broker_error) == (True, None)
    with caplog.at_level(logging.WARNING, logger="sidecar.source"):
        src._on_error(AUTH)
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 3


def test_a_connection_failure_alone_gives_its_own_reason() -> None:
    src = source()
    src._on_error(TRANSPORT)
    assert src.broker_ok is False
    assert src.broker_error is not None and src.broker_error.startswith("cannot connect")
