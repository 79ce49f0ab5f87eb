"""librdkafka's log summary (sidecar.kafka.logsummary) on lines shaped as confluent-kafka logs them,
with a fake clock: one line per condition per interval, the count, the level, the sidecar's own line."""

from __future__ import annotations

import logging

import pytest

from sidecar.kafka.logsummary import _Summary


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _line(client: str, text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(
        "sidecar.librdkafka", level, "x", 1, "%s [%s] %s", ("FAIL", client, text), None
    )


REFUSED = (
    "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
    "(after {ms}ms in state CONNECT)"
)


def test_repeats_are_counted_and_shown_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    summary = _Summary(30.0, clock)
    caplog.set_level(logging.DEBUG)
    passed = []
    for i in range(100):
        clock.now = i * 0.05  # 20 a second, from two clients, as librdkafka does
        record = _line(f"rdkafka#consumer-{3 + i % 2}", REFUSED.format(ms=i % 5))
        if summary.filter(record):
            passed.append(record)
    assert len(passed) == 1
    first = passed[0]
    assert first.levelno == logging.WARNING  # retried by librdkafka: not an error of its own
    assert "(after" not in first.getMessage() and "[thrd:" not in first.getMessage()
    own = [r for r in caplog.records if r.name == "sidecar.kafka"]
    assert len(own) == 1
    assert "127.0.0.1:1 refuses connections" in own[0].getMessage()
    assert "not ready" in own[0].getMessage()
    clock.now = 31.0
    record = _line("rdkafka#consumer-3", REFUSED.format(ms=0))
    assert summary.filter(record)
    assert "(and 99 more like it in the last 30 s)" in record.getMessage()
    assert record.__dict__["fields"] == {"repeats": 99, "interval_s": 30.0}


def test_distinct_conditions_each_get_a_line_and_the_right_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    summary = _Summary(30.0, clock)
    caplog.set_level(logging.DEBUG)
    dns = "b.invalid:9092/bootstrap: Failed to resolve 'b.invalid:9092': Name or service not known"
    tls = "ssl://k:9093/bootstrap: SSL handshake failed: certificate verify failed"
    for text in (dns, dns, tls, tls):
        summary.filter(_line("rdkafka#producer-1", text))
    said = [r.getMessage() for r in caplog.records if r.name == "sidecar.kafka"]
    assert len(said) == 2
    assert "b.invalid:9092 does not resolve (DNS)" in said[0]
    assert said[1].startswith("TLS with the Kafka broker k:9093 failed")
    assert summary.problem() == said[1].split(";")[0]


def test_other_lines_keep_their_level_and_memory_is_bounded() -> None:
    clock = _Clock()
    summary = _Summary(30.0, clock)
    record = logging.LogRecord(
        "sidecar.librdkafka", logging.ERROR, "x", 1, "%s [%s] %s", ("COMMITFAIL", "c", "x"), None
    )
    assert summary.filter(record) and record.levelno == logging.ERROR
    for i in range(5000):
        summary.filter(_line("c", f"distinct condition {i}", logging.WARNING))
    assert len(summary._seen) <= 256


def test_debug_lines_asked_for_go_out_as_they_are() -> None:
    summary = _Summary(30.0, _Clock())
    text = "[thrd:main]: Share assignment served: 1 partition(s)"
    for _ in range(3):
        record = _line("rdkafka#consumer-1", text, logging.DEBUG)
        assert summary.filter(record)
        assert record.getMessage() == f"FAIL [rdkafka#consumer-1] {text}"


def test_the_stop_says_the_repeats_not_said_yet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = _Clock()
    summary = _Summary(30.0, clock)
    for i in range(5):
        clock.now = i * 0.5
        summary.filter(_line("rdkafka#consumer-3", REFUSED.format(ms=i)))
    clock.now = 4.0
    summary.flush()
    final = [r for r in caplog.records if r.name == "sidecar.librdkafka.summary"]
    assert len(final) == 1
    assert final[0].levelno == logging.WARNING
    assert "(and 4 more like it in the last 4 s)" in final[0].getMessage()
    summary.flush()  # said once
    assert len([r for r in caplog.records if r.name == "sidecar.librdkafka.summary"]) == 1
