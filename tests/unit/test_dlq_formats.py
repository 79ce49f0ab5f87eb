"""Recognising a DLQ record's format and decoding its context (sidecar/ops/dlq/formats.py), pure.

The real writers are exercised in tests/integration/test_dlq_{connect,streams,spring}.py; these cases are
the corners they do not reach, with the headers built as each writer's source builds them:
Spring's `DeadLetterRecordManager.maybeAddOriginalHeaders` (spring-kafka 4.1.2: `ByteBuffer.putInt` /
`putLong`, appended again on a further dead-lettering), Kafka Connect's `DeadLetterQueueReporter`
(never replaces a header already there), Kafka Streams' `ExceptionHandlerUtils` (Kafka 4.2 wrote
`Throwable.toString()` into `__streams.errors.exception`).
"""

from __future__ import annotations

import io
import struct
from collections import Counter

import pytest
from rich.console import Console

from sidecar.kafka.dlq import (
    CAUSE_REJECTED,
    H_COPY_DROPPED,
    H_EXC_CLASS,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    FailedRecord,
    build_dlq_record,
)
from sidecar.ops.dlq.entries import H_REPLAY_COUNT, H_REPLAY_NAME, DlqEntry
from sidecar.ops.dlq.filters import Filters
from sidecar.ops.dlq.formats import (
    C_CONNECTOR,
    C_EXC_CLASS,
    C_OFFSET,
    C_PARTITION,
    C_STAGE,
    C_TASK,
    C_TOPIC,
    FORMAT_CONNECT,
    FORMAT_DLQ,
    FORMAT_SPRING,
    FORMAT_STREAMS,
    FORMAT_UNKNOWN,
    S_EXCEPTION,
    S_OFFSET,
    S_PARTITION,
    S_TOPIC,
    SP_CAUSE_CLASS,
    SP_EXC_CLASS,
    SP_GROUP,
    SP_OFFSET,
    SP_PARTITION,
    SP_TIMESTAMP,
    SP_TOPIC,
    decode_context,
    detect_format,
)
from sidecar.ops.dlq.inspect import InspectResult
from sidecar.ops.dlq.render import render_inspect

Headers = tuple[tuple[str, bytes | None], ...]


def entry(headers: Headers, key: bytes | None = b"k", value: bytes | None = b"v") -> DlqEntry:
    return DlqEntry("dlq.x", 0, 7, 1_700_000_000_000, key, value, headers)


def spring_original(topic: str, partition: int, offset: int, group: str) -> Headers:
    return (
        (SP_TOPIC, topic.encode()),
        (SP_PARTITION, struct.pack(">i", partition)),
        (SP_OFFSET, struct.pack(">q", offset)),
        (SP_TIMESTAMP, struct.pack(">q", 1_700_000_000_123)),
        (SP_GROUP, group.encode()),
    )


def test_spring_binary_ints_and_longs_and_the_first_source_of_a_chain() -> None:
    headers = (
        ("app", b"\x00\x01"),
        (SP_EXC_CLASS, b"org.springframework.kafka.listener.ListenerExecutionFailedException"),
        (SP_CAUSE_CLASS, b"java.lang.NumberFormatException"),
        *spring_original("orders", 3, 2**40 + 5, "billing"),
        # Dead-lettered once more from the DLT itself (appendOriginalHeaders, Spring's default).
        *spring_original("orders-dlt", 0, 9, "dlt-reader"),
    )
    e = entry(headers)
    assert e.format == FORMAT_SPRING
    assert (e.source_topic, e.source_partition, e.source_offset, e.group) == (
        "orders",
        3,
        2**40 + 5,
        "billing",
    )
    assert e.context.source_timestamp_ms == 1_700_000_000_123
    assert e.context.cause_class == "java.lang.NumberFormatException"
    assert e.original_headers() == [("app", b"\x00\x01")]
    # A filter on the root cause finds it; on an unrelated class does not.
    assert Filters(exception_classes=("java.lang.NumberFormatException",)).mismatch(e, 0) is None
    assert Filters(exception_classes=("x.Y",)).mismatch(e, 0) == "exception-class"


def test_spring_partition_of_the_wrong_size_is_unknown_not_an_error() -> None:
    e = entry(((SP_TOPIC, b"t"), (SP_PARTITION, b"\x00\x01"), (SP_OFFSET, b"12")))
    assert (e.source_topic, e.source_partition, e.source_offset) == ("t", None, 12)


def test_connect_keeps_the_first_value_and_maps_no_record_to_none() -> None:
    headers = (
        (C_TOPIC, b"payments"),
        (C_PARTITION, b"1"),
        (C_OFFSET, b"42"),
        (C_CONNECTOR, b"jdbc-sink"),
        (C_TASK, b"2"),
        (C_STAGE, b"VALUE_CONVERTER"),
        (C_EXC_CLASS, b"org.apache.kafka.connect.errors.DataException"),
        (C_TOPIC, b"ignored"),  # Connect logs an error and adds nothing: the first value stands
    )
    e = entry(headers)
    assert (e.format, e.source_topic, e.source_partition, e.source_offset, e.group) == (
        FORMAT_CONNECT,
        "payments",
        1,
        42,
        "jdbc-sink",
    )
    assert e.context.detail == "task 2, stage VALUE_CONVERTER"
    none = entry(((C_TOPIC, b""), (C_PARTITION, b"-1"), (C_OFFSET, b"-1")))
    assert (none.source_topic, none.source_partition, none.source_offset) == (None, None, None)
    assert none.is_dlq_record


@pytest.mark.parametrize(
    ("written", "cls"),
    [
        (b"java.lang.IllegalStateException", "java.lang.IllegalStateException"),  # Kafka 4.4
        (b"java.lang.IllegalStateException: boom: twice", "java.lang.IllegalStateException"),  # 4.2
    ],
)
def test_streams_exception_class_from_either_version(written: bytes, cls: str) -> None:
    e = entry(((S_EXCEPTION, written), (S_TOPIC, b"in"), (S_PARTITION, b"0"), (S_OFFSET, b"5")))
    assert (e.format, e.exception_class, e.source_offset) == (FORMAT_STREAMS, cls, 5)


def test_the_last_context_header_names_the_writer() -> None:
    # A record our sidecar dead-lettered, consumed by Connect and dead-lettered there: Connect wrote last.
    ours = ((H_TOPIC, b"a"), (H_PARTITION, b"0"), (H_OFFSET, b"1"), (H_EXC_CLASS, b"x.Ours"))
    theirs = ((C_TOPIC, b"dlq.a"), (C_PARTITION, b"0"), (C_OFFSET, b"8"))
    e = entry((*ours, *theirs))
    assert (e.format, e.source_topic, e.source_offset) == (FORMAT_CONNECT, "dlq.a", 8)
    # What a replay restores: the record Connect read, our context included.
    assert e.original_headers() == list(ours)
    assert detect_format((*theirs, *ours)) == FORMAT_DLQ


def test_replay_markers_are_not_a_format_and_survive_as_history() -> None:
    headers = ((H_REPLAY_NAME, b"fix-1"), (H_REPLAY_COUNT, b"1"), ("h", b"1"))
    e = entry((*headers, (S_TOPIC, b"in"), (S_PARTITION, b"0"), (S_OFFSET, b"0")))
    assert e.format == FORMAT_STREAMS and e.replay_count == 1
    assert e.original_headers() == [("h", b"1")]  # the markers are put back counted up
    plain = entry(headers)
    assert plain.format == FORMAT_UNKNOWN and not plain.is_dlq_record
    assert decode_context(headers).source_topic is None


def test_copy_dropped_is_ours_only() -> None:
    foreign = entry(((H_COPY_DROPPED, b"x"), (C_TOPIC, b"t"), (C_PARTITION, b"0")))
    assert foreign.format == FORMAT_CONNECT and not foreign.headers_only


def test_unknown_records_are_shown_raw_with_the_format_filter() -> None:
    unknown = entry((("foo", b"bar"),), value=b"\xff\xfe")
    spring = entry(spring_original("orders", 0, 1, "g"))
    assert Filters(formats=("unknown",)).mismatch(unknown, 0) is None
    assert Filters(formats=("unknown",)).mismatch(spring, 0) == "format"
    assert unknown.to_json()["format"] == "unknown"
    result = InspectResult(
        entries=[unknown, spring],
        scanned=2,
        matched=2,
        by_writer=Counter({unknown.context.writer: 1, spring.context.writer: 1}),
    )
    out = io.StringIO()
    render_inspect(Console(file=out, width=200), result, "dlq.x")
    text = out.getvalue()
    assert "(not a DLQ record)" in text and "spring g" in text and "0xfffe" in text


def test_our_records_stay_ours_whatever_headers_the_original_or_the_app_brings() -> None:
    """Our writer appends its context last, so a source record or an app's extra DLQ headers in another
    format's namespace cannot make our record look like Spring's or Connect's (nor redirect its replay)."""
    failed = FailedRecord(
        topic="orders",
        partition=2,
        offset=7,
        key=b"k",
        value=b"v",
        headers=((SP_TOPIC, b"elsewhere"), ("trace", b"t")),
        group="g",
        delivery_count=3,
        cause=CAUSE_REJECTED,
        extra_headers=((C_TOPIC, b"forged"), (C_PARTITION, b"0")),
    )
    record = build_dlq_record(failed, "dlq.orders", 1, True, 100)
    e = entry(record.headers, record.key, record.value)
    assert (e.format, e.source_topic, e.source_partition, e.delivery_count) == (
        FORMAT_DLQ,
        "orders",
        2,
        3,
    )
    assert e.original_headers() == [
        (SP_TOPIC, b"elsewhere"),
        ("trace", b"t"),
        (C_TOPIC, b"forged"),
        (C_PARTITION, b"0"),
    ]
