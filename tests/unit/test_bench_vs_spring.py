"""The pure parts of the side-by-side bench with Spring's retry topics (bench/vs_spring.py): reading a
retry record's original and due time from either writer's headers, and a run's outcome."""

from __future__ import annotations

import pytest

from bench.vs_spring import outcome, retry_due, retry_origin


def test_spring_headers_are_big_endian_binary() -> None:
    headers = [
        ("kafka_original-topic", b"orders"),
        ("kafka_original-partition", (3).to_bytes(4, "big")),
        ("kafka_original-offset", (1234567890123).to_bytes(8, "big")),
        # a Java BigInteger's bytes: as few as the value needs
        ("retry_topic-backoff-timestamp", b"\x01\xa2<-\xf6\x80"),
    ]
    assert retry_origin(headers) == (3, 1234567890123)
    assert retry_due(headers) == 0x01A23C2DF680


def test_sidecar_headers_are_text_and_the_last_counts() -> None:
    headers = [
        ("__dlq.retry.partition", b"5"),
        ("__dlq.retry.offset", b"41"),
        ("__dlq.retry.due", b"1000"),
        ("__dlq.retry.due", b"2000"),
    ]
    assert retry_origin(headers) == (5, 41)
    assert retry_due(headers) == 2000


def test_no_original_and_a_bad_width() -> None:
    assert retry_origin([("seq", b"1")]) is None
    assert retry_due([]) is None
    with pytest.raises(ValueError, match="bytes"):
        retry_origin(
            [("kafka_original-partition", b"\x00\x01"), ("kafka_original-offset", b"\x00" * 8)]
        )


def test_outcome_counts_lost_doubled_and_lateness() -> None:
    ends = {0: 3, 1: 1}
    trace = [
        [0, 0, 1, 1, 0],  # clean
        [0, 1, 2, 1, 12_100_000],  # retried, received 100 ms after written + 2 s
        [0, 2, 2, 2, 0],  # clean but delivered and accepted twice
        # (1, 0) never seen: lost
    ]
    written = {(0, 1): 10_000}
    found = outcome(ends, trace, written, {(0, 1): 10_050 + 2000}, delay_ms=2000)
    assert found["lost"] == 1
    assert found["doubled"] == 1
    assert found["retried"] == 1
    assert found["late_p50_ms"] == pytest.approx(100.0)
    assert found["late_max_ms"] == pytest.approx(100.0)
    assert found["own_late_min_ms"] == pytest.approx(50.0)
