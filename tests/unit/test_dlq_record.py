"""The DLQ record's header rules (`build_dlq_record`): what the app may add, and what produce() is handed.

Two invariants, for any input: every header name has a UTF-8 encoding (confluent-kafka's produce()
segfaults on a lone surrogate in a header name), and no header in the sidecar's `__dlq.` namespace
comes from the app's extra headers.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kafka.dlq import (
    CAUSE_DELIVERY_COUNT,
    CAUSE_REJECTED,
    H_DELIVERY_COUNT,
    H_EXC_CLASS,
    H_EXC_MESSAGE,
    H_OFFSET,
    H_TOPIC,
    DlqWriter,
    FailedRecord,
    build_dlq_record,
    is_reserved_header,
)

REPLAY_COUNT = "__dlq.replay.count"


def failed_record(**changes: Any) -> FailedRecord:
    fields: dict[str, Any] = {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "key": b"k",
        "value": b"v",
        "headers": (("source", b"web"), (REPLAY_COUNT, b"1")),
        "group": "g",
        "delivery_count": 3,
        "cause": CAUSE_REJECTED,
        "exception_class": "E",
        "exception_message": "m",
    }
    fields.update(changes)
    return FailedRecord(**fields)


def headers_of(failed: FailedRecord, copy_record: bool = True) -> dict[str, list[bytes | None]]:
    record = build_dlq_record(failed, "dlq.orders", 1, copy_record, 1024)
    out: dict[str, list[bytes | None]] = {}
    for name, value in record.headers:
        out.setdefault(name, []).append(value)
    return out


@pytest.mark.parametrize("copy_record", [True, False])
def test_app_headers_cannot_set_the_replay_count(copy_record: bool) -> None:
    # A replayed record (replay count 1) rejected again: the app's `__dlq.replay.count: 0` would
    # reset the loop guard that keeps `dlq replay` from replaying it forever.
    failed = failed_record(extra_headers=((REPLAY_COUNT, b"0"), ("x-app", b"1")))
    headers = headers_of(failed, copy_record)
    assert headers[REPLAY_COUNT] == [b"1"]
    assert headers["x-app"] == [b"1"]


@pytest.mark.parametrize(
    "name", [H_TOPIC, H_OFFSET, "__DLQ.errors.topic", "__Dlq.Replay.Count", "__dlq.anything"]
)
def test_app_headers_in_the_sidecar_namespace_are_dropped_in_any_case(name: str) -> None:
    failed = failed_record(extra_headers=((name, b"forged"), ("x-app", b"kept")))
    record = build_dlq_record(failed, "dlq.orders", 1, True, 1024)
    assert (name, b"forged") not in record.headers
    assert all(value != b"forged" for _, value in record.headers)
    assert ("x-app", b"kept") in record.headers
    assert record.dropped_headers == (name,)
    assert dict(record.headers)[H_TOPIC] == b"orders"
    assert dict(record.headers)[H_OFFSET] == b"41"


def test_app_headers_still_overwrite_same_named_original_headers() -> None:
    failed = failed_record(extra_headers=(("source", b"app"),))
    assert headers_of(failed)["source"] == [b"app"]


def test_reserved_header_rule() -> None:
    assert (
        is_reserved_header("__dlq.x")
        and is_reserved_header("__DLQ.")
        and is_reserved_header("__dLq.errors.topic")
    )
    for name in ("__dlq", "_dlq.x", "x__dlq.", "__dlqx", "", "traceparent", "dlq.x"):
        assert not is_reserved_header(name), name


@pytest.mark.parametrize("where", ["extra", "original"])
def test_a_lone_surrogate_in_a_header_name_never_reaches_produce(where: str) -> None:
    # Before: the name went through as is; the engine's size estimate raised UnicodeEncodeError, and
    # where the DLQ topic's size limit was unknown produce() segfaulted on it.
    header = (("\ud800x", b"v"),)
    changes = {"extra_headers": header} if where == "extra" else {"headers": header}
    record = build_dlq_record(failed_record(**changes), "dlq.orders", 1, True, 1024)
    for name, _ in record.headers:
        name.encode("utf-8")
    assert any(name.endswith("x") and name != "x" for name, _ in record.headers)


def test_unencodable_error_text_becomes_replacement_characters() -> None:
    failed = failed_record(
        exception_class="E\udc80", exception_message="m\ud800", stacktrace="s\udfff", group="g"
    )
    headers = headers_of(failed)
    assert headers[H_EXC_CLASS] == [b"E?"]
    assert headers[H_EXC_MESSAGE] == [b"m?"]


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
_NAMES = _TEXT | st.sampled_from(
    [REPLAY_COUNT, H_TOPIC, H_DELIVERY_COUNT, "__DLQ.errors.offset", "__dlq.", "traceparent"]
)
_HEADERS = st.lists(st.tuples(_NAMES, st.none() | st.binary(max_size=8)), max_size=5)


@given(
    originals=_HEADERS,
    extras=st.lists(st.tuples(_NAMES, st.binary(max_size=8)), max_size=5),
    exception=st.none() | _TEXT,
    message=st.none() | _TEXT,
    stacktrace=st.none() | _TEXT,
    copy_record=st.booleans(),
    drop_reason=st.none() | _TEXT,
    cause=st.sampled_from([CAUSE_REJECTED, CAUSE_DELIVERY_COUNT]),
)
@settings(max_examples=200, deadline=None)
def test_any_input_gives_encodable_headers_and_none_of_ours_from_the_app(
    originals: list[tuple[str, bytes | None]],
    extras: list[tuple[str, bytes]],
    exception: str | None,
    message: str | None,
    stacktrace: str | None,
    copy_record: bool,
    drop_reason: str | None,
    cause: str,
) -> None:
    failed = failed_record(
        headers=tuple(originals),
        extra_headers=tuple(extras),
        exception_class=exception,
        exception_message=message,
        stacktrace=stacktrace,
        cause=cause,
    )
    record = build_dlq_record(
        failed, "dlq.orders", 3, copy_record, 64, drop_copy_reason=drop_reason
    )
    for name, value in record.headers:
        name.encode("utf-8")
        assert value is None or isinstance(value, bytes)
    # The app's headers in our namespace have no effect at all: the record is the one built without them.
    allowed = tuple((n, v) for n, v in extras if not is_reserved_header(n))
    without = build_dlq_record(
        failed_record(
            headers=tuple(originals),
            extra_headers=allowed,
            exception_class=exception,
            exception_message=message,
            stacktrace=stacktrace,
            cause=cause,
        ),
        "dlq.orders",
        3,
        copy_record,
        64,
        drop_copy_reason=drop_reason,
    )
    assert record.headers == without.headers
    assert len(record.dropped_headers) == len(extras) - len(allowed)
    names = [name for name, _ in record.headers]
    assert names.count(H_TOPIC) == 1 and names.count(H_DELIVERY_COUNT) == 1


def test_writer_counts_every_dropped_header_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = DlqWriter({"bootstrap.servers": "127.0.0.1:1"}, "g", False, 1024, 0, False, 1, 1)
    caplog.set_level(logging.DEBUG, logger="sidecar.dlq")
    for offset in range(3):
        failed = failed_record(offset=offset, extra_headers=((REPLAY_COUNT, b"0"), (H_TOPIC, b"x")))
        record = build_dlq_record(failed, "dlq.orders", 1, False, 1024)
        writer._count_dropped_headers(record, failed)
    clean = failed_record(extra_headers=(("x-app", b"1"),))
    writer._count_dropped_headers(build_dlq_record(clean, "dlq.orders", 1, False, 1024), clean)
    assert writer.reserved_headers_dropped == 6
    lines = [r for r in caplog.records if "__dlq." in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "orders[2]@0" in lines[0].getMessage() and REPLAY_COUNT in lines[0].getMessage()
