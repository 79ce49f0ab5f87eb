"""The per-burst DLQ log line (sidecar.engines.dlq_summary) with a fake clock."""

from __future__ import annotations

import logging

import pytest

from sidecar.engines.dlq_summary import EVERY_S, QUIET_S, DlqSummary


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("dead-lettered")]


def test_a_burst_is_said_once_when_it_is_over(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = _Clock()
    summary = DlqSummary(clock)
    for i, name in enumerate(["A"] * 5 + ["B"] * 3 + ["C"] * 2 + ["D"]):
        clock.now = 100.0 + i * 0.01
        summary.written("orders", "dlq.orders", "rejected", name)
        summary.flush()
    assert not _said(caplog)  # still going
    clock.now += QUIET_S
    summary.flush()
    (line,) = _said(caplog)
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert text.startswith("dead-lettered 11 records of orders to dlq.orders in 0.1 s")
    assert "reasons: rejected 11" in text
    assert "exception classes: A 5, B 3, C 2, others 1" in text
    assert line.__dict__["fields"]["exception_classes"] == {"A": 5, "B": 3, "C": 2}
    summary.flush(everything=True)
    assert len(_said(caplog)) == 1  # nothing left


def test_a_long_burst_is_said_every_interval_per_topic(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = _Clock()
    summary = DlqSummary(clock)
    steps = int(3 * EVERY_S / 0.1)
    for _ in range(steps):  # 10 a second for 30 s, on two topics
        clock.now += 0.1
        summary.written("a", "dlq.a", "delivery_limit", "none")
        summary.written("b", "dlq.b", "rejected", "E")
        summary.flush()
    summary.flush(everything=True)
    lines = _said(caplog)
    assert 4 <= len(lines) <= 8, [r.getMessage() for r in lines]
    assert sum(r.__dict__["fields"]["count"] for r in lines) == 2 * steps
    assert {r.__dict__["fields"]["topic"] for r in lines} == {"a", "b"}


def test_a_burst_spread_by_routes_names_every_dlq_topic(caplog: pytest.LogCaptureFixture) -> None:
    """38 records of one source to five DLQ topics: the line names the five, not the first one."""
    caplog.set_level(logging.INFO)
    clock = _Clock()
    summary = DlqSummary(clock)
    spread = {"dlq.r1.a": 10, "dlq.r1.b": 10, "dlq.r1.c": 8, "dlq.r1.d": 6, "dlq.r1": 4}
    for dlq_topic, n in spread.items():
        for _ in range(n):
            summary.written("r1", dlq_topic, "rejected", "E")
    summary.flush(everything=True)
    (line,) = _said(caplog)
    text = line.getMessage()
    assert text.startswith(
        "dead-lettered 38 records of r1 to 5 DLQ topics "
        "(dlq.r1.a 10, dlq.r1.b 10, dlq.r1.c 8, dlq.r1.d 6, dlq.r1 4)"
    ), text
    fields = line.__dict__["fields"]
    assert fields["dlq_topics"] == spread and "dlq_topic" not in fields
