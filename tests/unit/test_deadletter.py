"""The DLQ step (sidecar.core.deadletter): archived record → plan → FailedRecord → DLQ record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.deadletter import ArchiveOutcome, DeadLetterPlan, archived_log_fields, dead_letter
from sidecar.core.outcome import DELIVERY_COUNT_EXCEEDED, ArchiveReason, ErrorInfo
from sidecar.core.record import CustomDeadLetter, SourceRecord, Tracked
from sidecar.kafka.dlq import H_EXC_CLASS, H_MESSAGE, build_dlq_record

REC = SourceRecord(
    topic="orders",
    partition=3,
    offset=42,
    key=b"k",
    value=b"secret payload",
    headers=(("h", b"1"),),
    timestamp_ms=None,
    timestamp_type="none",
)


def plan(
    reason: ArchiveReason,
    error: ErrorInfo | None = None,
    *,
    dlq_topic: str | None = "dlq.orders",
    tolerate: bool = True,
    consequence: str = "stopping",
) -> DeadLetterPlan:
    return dead_letter(
        Tracked(REC),
        5,
        reason,
        error,
        group="g",
        dlq_topic=dlq_topic,
        tolerate=tolerate,
        consequence=consequence,
    )


def test_a_reject_becomes_a_failed_record_with_the_apps_error_and_kafkas_cause() -> None:
    p = plan(ArchiveReason.REJECTED, ErrorInfo("app.Poison", "cannot parse", "tb"))
    assert p.stop is None and p.dlq_topic == "dlq.orders" and p.failed is not None
    f = p.failed
    assert (f.topic, f.partition, f.offset, f.group, f.delivery_count) == ("orders", 3, 42, "g", 5)
    assert f.cause == "Offset rejected by client."
    assert (f.exception_class, f.exception_message, f.stacktrace) == (
        "app.Poison",
        "cannot parse",
        "tb",
    )
    record = build_dlq_record(f, "dlq.orders", 1, False, 1000)
    headers = dict(record.headers)
    assert headers[H_MESSAGE] == b"Offset rejected by client."
    assert headers[H_EXC_CLASS] == b"app.Poison"


def test_the_limit_without_an_error_carries_the_sidecars_class() -> None:
    p = plan(ArchiveReason.DELIVERY_COUNT_EXCEEDED)
    assert p.failed is not None
    assert p.failed.cause == "Offset delivery count exceeded the threshold."
    assert p.failed.exception_class == DELIVERY_COUNT_EXCEEDED


def test_custom_parts_of_the_reject_are_carried() -> None:
    tracked = Tracked(REC, custom=CustomDeadLetter((("x-why", b"bad"),), b"new", True))
    p = dead_letter(
        tracked,
        1,
        ArchiveReason.REJECTED,
        None,
        group="g",
        dlq_topic="d",
        tolerate=True,
        consequence="",
    )
    assert p.failed is not None
    assert p.failed.extra_headers == (("x-why", b"bad"),)
    assert (p.failed.replacement_value, p.failed.replacement_value_set) == (b"new", True)


def test_no_dlq_topic_plans_a_skip_and_tolerance_none_a_stop() -> None:
    skip = plan(ArchiveReason.REJECTED, dlq_topic=None)
    assert skip.failed is None and skip.stop is None
    stop = plan(ArchiveReason.REJECTED, ErrorInfo("app.Boom"), tolerate=False, consequence="halt")
    assert stop.failed is None
    assert stop.stop == (
        "errors.tolerance is none and orders[3]@42 was archived (rejected: app.Boom); halt"
    )


def test_only_written_and_skipped_records_are_done() -> None:
    assert {o for o in ArchiveOutcome if o.done} == {ArchiveOutcome.WRITTEN, ArchiveOutcome.NO_DLQ}


def test_the_log_line_shows_payloads_only_when_asked() -> None:
    p = plan(ArchiveReason.REJECTED, ErrorInfo("app.Boom", "m"))
    quiet = archived_log_fields(Tracked(REC), 5, p, include_messages=False)
    assert "value" not in quiet and "key" not in quiet
    assert quiet["reason"] == "rejected" and quiet["exception_class"] == "app.Boom"
    loud = archived_log_fields(Tracked(REC), 5, p, include_messages=True)
    assert loud["value"] == "secret payload"


@given(
    reason=st.sampled_from(list(ArchiveReason)),
    cls=st.none() | st.text(min_size=1, max_size=20),
    msg=st.none() | st.text(max_size=20),
    tolerate=st.booleans(),
    topic=st.none() | st.just("dlq.x"),
)
def test_exactly_one_of_stop_skip_write(
    reason: ArchiveReason, cls: str | None, msg: str | None, tolerate: bool, topic: str | None
) -> None:
    error = None if cls is None and msg is None else ErrorInfo(cls, msg)
    p = plan(reason, error, tolerate=tolerate, dlq_topic=topic)
    assert (p.stop is not None) + (p.failed is not None) <= 1
    assert (p.stop is not None) == (not tolerate)
    assert (p.failed is not None) == (tolerate and topic is not None)
    if p.failed is not None:
        assert p.failed.cause == reason.cause
