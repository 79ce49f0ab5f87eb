"""The wire contract: request bytes, answer interpretation, the ack API body, and openapi.yaml.

Requests are parsed back with httptools (an independent HTTP parser) rather than by string
splitting, so a malformed head would fail here and not only against a real app.
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import httptools
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.core.wire import (
    MAX_RETRY_AFTER_MS,
    AckItem,
    Answer,
    AppError,
    CloudEventsFormat,
    RecordView,
    WireError,
    decode_kafka_header,
    decode_key,
    encode_kafka_header,
    format_ack_response,
    format_batch_request,
    format_single_request,
    interpret_batch,
    interpret_single,
    parse_ack_request,
    parse_retry_after_ms,
    route_missing,
    route_missing_statuses,
    validate_status_mapping,
)

OPENAPI_PATH = pathlib.Path(__file__).resolve().parents[2] / "openapi.yaml"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def make_record(**changes: Any) -> RecordView:
    fields: dict[str, Any] = {
        "topic": "orders",
        "partition": 3,
        "offset": 42,
        "key": b"customer-7",
        "value": b'{"qty": 1}',
        "timestamp_ms": 1_700_000_000_123,
        "timestamp_type": "create",
        "headers": (("source", b"web"),),
        "delivery_count": 2,
        "delivery_id": "orders-3-42-2",
        "traceparent": None,
        "tracestate": None,
    }
    fields.update(changes)
    return RecordView(**fields)


class ParsedRequest:
    """A request parsed by httptools; header names kept as sent."""

    def __init__(self, raw: bytes) -> None:
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.complete = False
        parser = httptools.HttpRequestParser(self)
        parser.feed_data(raw)
        self.method = parser.get_method().decode()
        assert self.complete, "the request must be one complete HTTP message"

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def value(self, name: str) -> str | None:
        found = self.values(name)
        assert len(found) <= 1, f"{name} repeated"
        return found[0] if found else None


def parse_single(record: RecordView, **kwargs: Any) -> ParsedRequest:
    return ParsedRequest(format_single_request(record, "127.0.0.1:8080", "/records", **kwargs))


# ---------------------------------------------------------------------------------------------
# Single-mode request


def test_single_request_carries_metadata_headers_and_exact_body() -> None:
    record = make_record(traceparent=TRACEPARENT, tracestate="vendor=1")
    request = parse_single(record, extra_headers=(("Authorization", "Bearer t0k"),))
    assert request.method == "POST"
    assert request.url == b"/records"
    assert request.body == b'{"qty": 1}'
    assert request.value("Host") == "127.0.0.1:8080"
    assert request.value("Content-Length") == str(len(b'{"qty": 1}'))
    assert request.value("Content-Type") == "application/octet-stream"
    assert request.value("Authorization") == "Bearer t0k"
    assert request.value("Kafka-Topic") == "orders"
    assert request.value("Kafka-Partition") == "3"
    assert request.value("Kafka-Offset") == "42"
    assert request.value("Kafka-Key") == "customer-7"
    assert request.value("Kafka-Key-Encoding") is None
    assert request.value("Kafka-Timestamp") == "1700000000123"
    assert request.value("Kafka-Timestamp-Type") == "create"
    assert request.value("Kafka-Delivery-Count") == "2"
    assert request.value("Kafka-Delivery-Id") == "orders-3-42-2"
    assert request.value("Kafka-Value-Null") is None
    assert request.values("Kafka-Header") == ["source=web"]
    assert request.value("traceparent") == TRACEPARENT
    assert request.value("tracestate") == "vendor=1"


def test_null_value_is_distinct_from_empty_value() -> None:
    null = parse_single(make_record(value=None))
    empty = parse_single(make_record(value=b""))
    assert null.body == empty.body == b""
    assert null.value("Content-Length") == empty.value("Content-Length") == "0"
    assert null.value("Kafka-Value-Null") == "true"
    assert empty.value("Kafka-Value-Null") is None


def test_binary_value_is_byte_exact() -> None:
    value = bytes(range(256)) * 3 + b"\r\n\r\nPOST / HTTP/1.1\r\n"
    assert parse_single(make_record(value=value)).body == value


@pytest.mark.parametrize(
    ("key", "sent", "encoding"),
    [
        (None, None, None),
        (b"", "", None),
        (b"order 7", "order 7", None),
        (b"~!@#$%^&*()=+[]{}|;:'\",.<>/?`", "~!@#$%^&*()=+[]{}|;:'\",.<>/?`", None),
        (b" leading", base64.b64encode(b" leading").decode(), "base64"),
        (b"trailing ", base64.b64encode(b"trailing ").decode(), "base64"),
        (b"tab\there", base64.b64encode(b"tab\there").decode(), "base64"),
        ("caf\u00e9".encode(), base64.b64encode("caf\u00e9".encode()).decode(), "base64"),
        (b"\x00\xff\r\n", base64.b64encode(b"\x00\xff\r\n").decode(), "base64"),
    ],
    ids=["null", "empty", "plain", "punctuation", "leading", "trailing", "tab", "utf8", "bin"],
)
def test_key_encoding(key: bytes | None, sent: str | None, encoding: str | None) -> None:
    request = parse_single(make_record(key=key))
    assert request.value("Kafka-Key") == sent
    assert request.value("Kafka-Key-Encoding") == encoding
    assert decode_key(request.value("Kafka-Key"), request.value("Kafka-Key-Encoding")) == key


def test_no_timestamp_omits_the_header() -> None:
    request = parse_single(make_record(timestamp_ms=None, timestamp_type="none"))
    assert request.value("Kafka-Timestamp") is None
    assert request.value("Kafka-Timestamp-Type") == "none"


def test_record_headers_keep_order_repeats_null_and_empty() -> None:
    headers = (("b", b"2"), ("a", None), ("b", b""), ("a", b"x=y&z%"), ("", b"anon"))
    request = parse_single(make_record(headers=headers))
    lines = request.values("Kafka-Header")
    assert lines == ["b=2", "a", "b=", "a=x%3Dy%26z%25", "=anon"]
    assert tuple(decode_kafka_header(line) for line in lines) == headers


@given(
    st.lists(
        st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40))),
        max_size=8,
    )
)
def test_kafka_header_percent_encoding_round_trips(headers: list[tuple[str, bytes | None]]) -> None:
    request = parse_single(make_record(headers=tuple(headers)))
    lines = request.values("Kafka-Header")
    assert len(lines) == len(headers)
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%=")
    for line, (name, value) in zip(lines, headers, strict=True):
        assert set(line) <= allowed
        assert line.count("=") == (0 if value is None else 1)
        assert decode_kafka_header(line) == (name, value)
        assert encode_kafka_header(name, value) == line
    if lines:
        # Frameworks that fold repeated header lines into one comma-joined value lose nothing.
        assert [part.strip() for part in ", ".join(lines).split(",")] == lines


def test_unsafe_trace_context_is_dropped_not_forwarded() -> None:
    request = parse_single(make_record(traceparent="00-x\r\nX-Evil: 1", tracestate="a=b"))
    assert request.value("traceparent") is None
    assert request.value("tracestate") is None
    assert request.value("X-Evil") is None


@pytest.mark.parametrize(
    "extra",
    [(("Bad Name", "v"),), (("X-Ok", "line\r\nbreak"),), (("", "v"),), (("X:Y", "v"),)],
)
def test_invalid_extra_headers_are_refused(extra: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(WireError):
        format_single_request(make_record(), "h", "/", extra)


def test_invalid_path_topic_or_id_is_refused() -> None:
    with pytest.raises(WireError):
        format_single_request(make_record(), "h", "no-slash")
    with pytest.raises(WireError):
        format_single_request(make_record(), "h", "/a b")
    with pytest.raises(WireError):
        format_single_request(make_record(delivery_id="id\r\nX: 1"), "h", "/")


def test_extra_headers_may_be_a_list() -> None:
    request = ParsedRequest(format_single_request(make_record(), "h", "/", [("X-A", "1")]))
    assert request.value("X-A") == "1"


# ---------------------------------------------------------------------------------------------
# Batch-mode request


def test_batch_request_is_json_with_base64_fields() -> None:
    records = [
        make_record(traceparent=TRACEPARENT),
        make_record(
            offset=43,
            key=None,
            value=None,
            headers=(("h", None), ("h", b"\x00")),
            timestamp_ms=None,
            timestamp_type="none",
            delivery_id="orders-3-43-1",
            delivery_count=1,
        ),
        make_record(offset=44, key=b"", value=b"", delivery_id="orders-3-44-1"),
    ]
    request = ParsedRequest(format_batch_request(records, "localhost", "/batch"))
    assert request.url == b"/batch"
    assert request.value("Content-Type") == "application/json"
    assert request.value("Content-Length") == str(len(request.body))
    assert request.value("Kafka-Topic") is None
    items = json.loads(request.body)["records"]
    assert [item["id"] for item in items] == ["orders-3-42-2", "orders-3-43-1", "orders-3-44-1"]
    first, second, third = items
    assert base64.b64decode(first["key"]) == b"customer-7"
    assert base64.b64decode(first["value"]) == b'{"qty": 1}'
    assert first["headers"] == [["source", base64.b64encode(b"web").decode()]]
    assert first["timestamp"] == 1_700_000_000_123
    assert first["traceparent"] == TRACEPARENT
    assert second["key"] is None
    assert second["value"] is None
    assert second["headers"] == [["h", None], ["h", "AA=="]]
    assert second["timestamp"] is None
    assert third["key"] == ""
    assert third["value"] == ""


def _reference_batch_item(record: RecordView) -> dict[str, Any]:
    """The batch schema's item, built the obvious way (json over a dict) to check the fast encoder."""

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    return {
        "id": record.delivery_id,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": b64(record.key),
        "value": b64(record.value),
        "headers": [
            [n.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), b64(v)]
            for n, v in record.headers
        ],
        "timestamp": record.timestamp_ms,
        "timestamp_type": record.timestamp_type,
        "delivery_count": record.delivery_count,
        "traceparent": record.traceparent,
        "tracestate": record.tracestate,
    }


_VISIBLE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


@given(
    st.lists(
        st.builds(
            make_record,
            topic=_VISIBLE,
            offset=st.integers(0, 2**62),
            key=st.none() | st.binary(max_size=40),
            value=st.none() | st.binary(max_size=200),
            headers=st.lists(
                st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=4
            ).map(tuple),
            timestamp_ms=st.none() | st.integers(0, 2**50),
            traceparent=st.none() | _VISIBLE,
            tracestate=st.none() | st.text(max_size=20),
            delivery_count=st.integers(1, 1000),
        ),
        min_size=1,
        max_size=5,
    )
)
# Generating these records took over a second on a loaded machine: the check is of the body, not of speed.
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_batch_body_equals_json_of_the_schema_dicts(records: list[RecordView]) -> None:
    request = ParsedRequest(format_batch_request(records, "h", "/b"))
    assert request.value("Content-Length") == str(len(request.body))
    assert json.loads(request.body) == {"records": [_reference_batch_item(r) for r in records]}


# ---------------------------------------------------------------------------------------------
# Single-mode answers: docs/app-contract.md's precedence, row by row

JSON = b"application/json"


def answer(
    status: int,
    body: bytes = b"",
    content_type: bytes | None = None,
    mapping: Mapping[int, str] | None = None,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> Answer:
    headers = [(b"Content-Type", content_type)] if content_type is not None else []
    headers.extend(extra)
    return interpret_single(status, headers, body, mapping, now_epoch_s=1_000_000.0)


def error_class(result: Answer) -> str | None:
    return None if result.error is None else result.error.class_name


@pytest.mark.parametrize(
    ("status", "ack", "klass"),
    [
        (200, "accept", None),
        (201, "accept", None),
        (204, "accept", None),
        (202, "deferred", None),
        (400, "reject", "sidecar.HttpStatus400"),
        (422, "reject", "sidecar.HttpStatus422"),
        (404, "release", "sidecar.HttpStatus404"),
        (408, "release", "sidecar.HttpStatus408"),
        (409, "release", "sidecar.HttpStatus409"),
        (429, "release", "sidecar.HttpStatus429"),
        (500, "release", "sidecar.HttpStatus500"),
        (503, "release", "sidecar.HttpStatus503"),
        (302, "release", "sidecar.HttpStatus302"),
        (418, "release", "sidecar.HttpStatus418"),
    ],
)
def test_status_table(status: int, ack: str, klass: str | None) -> None:
    result = answer(status, b"")
    assert result.ack == ack
    assert error_class(result) == klass
    assert result.retry_after_ms is None


@pytest.mark.parametrize(
    ("status", "body", "ack"),
    [
        (200, b'{"ack": "reject"}', "reject"),
        (200, b'{"ack": "release"}', "release"),
        (500, b'{"ack": "accept"}', "accept"),
        (400, b'{"ack": "release"}', "release"),
        (202, b'{"ack": "accept"}', "accept"),
    ],
)
def test_json_ack_wins_over_status(status: int, body: bytes, ack: str) -> None:
    assert answer(status, body, JSON).ack == ack


@pytest.mark.parametrize(
    "body",
    [
        b'{"ack": "accept"',  # does not parse
        b"\xff\xfe{",  # not even text
        b'{"ack": "done"}',  # unknown ack word
        b'{"ack": "deferred"}',  # deferral is a status (202), not a JSON ack
        b'{"ack": "ACCEPT"}',  # ack words are exact
        b'{"ack": 1}',
        b'["accept"]',  # not an object
        b'"accept"',
        b"null",
        b'{"ack": "accept", "error": "boom"}',
        b'{"ack": "accept", "error": {"class": 7}}',
        b'{"ack": "release", "retry_after_ms": -1}',
        b'{"ack": "release", "retry_after_ms": true}',
        b'{"ack": "release", "retry_after_ms": "5"}',
        b'{"ack": "reject", "dlq": {"value_b64": "not base64!"}}',
        b'{"ack": "reject", "dlq": {"headers": {"a": 1}}}',
        b'{"ack": "reject", "dlq": []}',
        b"[" * 100_000,  # nesting deep enough to exhaust the recursion limit
    ],
)
def test_malformed_json_is_a_release_even_under_200(body: bytes) -> None:
    result = answer(200, body, JSON)
    assert result.ack == "release"
    assert error_class(result) == "sidecar.MalformedAnswer"
    assert result.error is not None and result.error.message
    assert "under status 200" in result.reason


def test_plus_json_media_types_count_as_json() -> None:
    assert answer(200, b'{"ack": "reject"}', b"application/problem+json").ack == "reject"
    assert answer(200, b'{"ack": "reject"}', b"Application/JSON; charset=utf-8").ack == "reject"


def test_json_looking_body_not_declared_json_is_ignored() -> None:
    assert answer(200, b'{"ack": "reject"}', b"text/plain").ack == "accept"
    assert answer(200, b'{"ack": "reject"}').ack == "accept"


def test_empty_json_body_falls_back_to_status() -> None:
    assert answer(200, b"", JSON).ack == "accept"
    assert answer(204, b"  \n", JSON).ack == "accept"


def test_json_object_without_ack_uses_status_but_keeps_error() -> None:
    result = answer(500, b'{"error": {"class": "db.Down", "message": "x"}}', JSON)
    assert result.ack == "release"
    assert result.error == AppError("db.Down", "x", None)
    assert answer(200, b'{"received": true}', JSON).ack == "accept"
    assert answer(422, b"{}", JSON).ack == "reject"


def test_json_error_fields() -> None:
    body = b'{"ack": "reject", "error": {"class": "E", "message": "m", "stacktrace": "s"}}'
    assert answer(200, body, JSON).error == AppError("E", "m", "s")
    partial = answer(200, b'{"ack": "reject", "error": {"message": "only"}}', JSON)
    assert partial.error == AppError("", "only", None)


def test_json_release_under_5xx_without_error_gets_the_status_error() -> None:
    result = answer(503, b'{"ack": "release"}', JSON)
    assert error_class(result) == "sidecar.HttpStatus503"
    assert answer(500, b'{"ack": "accept"}', JSON).error is None


def test_retry_after_seconds_on_429_and_503() -> None:
    assert answer(429, extra=((b"Retry-After", b"7"),)).retry_after_ms == 7000
    assert answer(503, extra=((b"retry-after", b" 2 "),)).retry_after_ms == 2000
    assert answer(503, extra=((b"Retry-After", b"0"),)).retry_after_ms == 0


def test_retry_after_http_date_relative_to_now() -> None:
    date = b"Mon, 12 Jan 1970 13:47:10 GMT"  # 1_000_030 s after the epoch
    assert answer(503, extra=((b"Retry-After", date),)).retry_after_ms == 30_000
    past = b"Thu, 01 Jan 1970 00:00:00 GMT"
    assert answer(429, extra=((b"Retry-After", past),)).retry_after_ms == 0


def test_retry_after_is_capped_and_garbage_ignored() -> None:
    assert answer(429, extra=((b"Retry-After", b"86400"),)).retry_after_ms == MAX_RETRY_AFTER_MS
    huge = b"9" * 40
    assert answer(429, extra=((b"Retry-After", huge),)).retry_after_ms == MAX_RETRY_AFTER_MS
    assert answer(429, extra=((b"Retry-After", b"soon"),)).retry_after_ms is None
    assert answer(429, extra=((b"Retry-After", b"-5"),)).retry_after_ms is None


def test_retry_after_only_on_429_and_503() -> None:
    assert answer(500, extra=((b"Retry-After", b"7"),)).retry_after_ms is None
    assert answer(200, extra=((b"Retry-After", b"7"),)).retry_after_ms is None


def test_json_retry_after_wins_over_the_header_and_is_capped() -> None:
    extra = ((b"Retry-After", b"7"),)
    assert answer(429, b'{"retry_after_ms": 250}', JSON, extra=extra).retry_after_ms == 250
    assert answer(429, b'{"ack": "release"}', JSON, extra=extra).retry_after_ms == 7000
    big = answer(200, b'{"ack": "release", "retry_after_ms": 1e12}', JSON)
    assert big.retry_after_ms == MAX_RETRY_AFTER_MS
    fractional = answer(200, b'{"ack": "release", "retry_after_ms": 1.2}', JSON)
    assert fractional.retry_after_ms == 2


def test_status_mapping_overrides_the_table() -> None:
    assert answer(500, mapping={500: "reject"}).ack == "reject"
    assert answer(200, mapping={200: "release"}).ack == "release"
    assert answer(404, mapping={404: "deferred"}).ack == "deferred"
    assert answer(409, mapping={409: "accept"}).ack == "accept"
    assert "mapped" in answer(500, mapping={500: "reject"}).reason
    # Unlisted statuses keep the default table; a JSON ack still wins over the mapping.
    assert answer(400, mapping={500: "reject"}).ack == "reject"
    assert answer(500, b'{"ack": "release"}', JSON, mapping={500: "reject"}).ack == "release"
    # A mapping cannot turn a malformed JSON answer into an accept.
    assert answer(200, b"{", JSON, mapping={200: "accept"}).ack == "release"


def test_status_error_message_is_the_start_of_a_text_body() -> None:
    result = answer(500, b"x" * 1000, b"text/html")
    assert result.error == AppError("sidecar.HttpStatus500", "x" * 200)
    binary = answer(500, b"\x89PNG" * 10, b"image/png")
    assert binary.error == AppError("sidecar.HttpStatus500", "40 bytes of image/png")
    assert answer(502).error == AppError("sidecar.HttpStatus502", "HTTP status 502")


def test_custom_dlq_record_on_reject() -> None:
    body = json.dumps(
        {
            "ack": "reject",
            "dlq": {"headers": {"x-a": "1", "x-b": "\u00e9"}, "value_b64": "AAE="},
        }
    ).encode()
    result = answer(200, body, JSON)
    assert result.ack == "reject"
    assert result.dlq_headers == (("x-a", b"1"), ("x-b", "\u00e9".encode()))
    assert result.dlq_value == b"\x00\x01"
    assert result.dlq_value_set
    null_value = answer(200, b'{"ack": "reject", "dlq": {"value_b64": null}}', JSON)
    assert null_value.dlq_value is None and null_value.dlq_value_set
    headers_only = answer(200, b'{"ack": "reject", "dlq": {"headers": {}}}', JSON)
    assert not headers_only.dlq_value_set
    assert not answer(200, b'{"ack": "reject"}', JSON).dlq_value_set


def test_validate_status_mapping() -> None:
    assert validate_status_mapping({500: "reject", 202: "deferred"}) == {
        500: "reject",
        202: "deferred",
    }
    for bad in ({500: "drop"}, {99: "accept"}, {600: "accept"}, {True: "accept"}):
        with pytest.raises(WireError):
            validate_status_mapping(bad)  # type: ignore[arg-type]
    with pytest.raises(WireError):
        answer(500, mapping={500: "drop"})


# ---------------------------------------------------------------------------------------------
# Batch answers


def batch(
    status: int,
    body: bytes,
    ids: list[str],
    content_type: bytes | None = JSON,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> dict[str, Answer]:
    headers = [(b"content-type", content_type)] if content_type is not None else []
    headers.extend(extra)
    return interpret_batch(status, headers, body, ids, now_epoch_s=0.0)


def test_batch_results_per_record_and_missing_released() -> None:
    body = json.dumps(
        {
            "results": [
                {"id": "a", "ack": "accept"},
                {"id": "b", "ack": "reject", "error": {"class": "E", "message": "m"}},
                {"id": "c", "ack": "release", "retry_after_ms": 100},
                {"id": "zzz", "ack": "accept"},
                {"id": "a", "ack": "reject"},
                "garbage",
                {"ack": "accept"},
                {"id": "e", "ack": "nope"},
                {"id": "f"},
            ]
        }
    ).encode()
    result = batch(200, body, ["a", "b", "c", "d", "e", "f"])
    assert list(result) == ["a", "b", "c", "d", "e", "f"]
    assert result["a"].ack == "accept"  # the first entry for a repeated id wins
    assert result["b"].ack == "reject" and result["b"].error == AppError("E", "m")
    assert result["c"].ack == "release" and result["c"].retry_after_ms == 100
    assert result["d"].ack == "release" and result["d"].error is None
    assert result["e"].ack == "release" and error_class(result["e"]) == "sidecar.MalformedAnswer"
    assert result["f"].ack == "release" and error_class(result["f"]) == "sidecar.MalformedAnswer"


@pytest.mark.parametrize(
    ("status", "ack", "klass"),
    [
        (500, "release", "sidecar.HttpStatus500"),
        (404, "release", "sidecar.HttpStatus404"),
        (400, "reject", "sidecar.HttpStatus400"),
        (422, "reject", "sidecar.HttpStatus422"),
        (202, "deferred", None),
        (200, "accept", None),
    ],
)
def test_batch_without_json_answers_all_by_status(status: int, ack: str, klass: str | None) -> None:
    result = batch(status, b"plain words", ["a", "b"], content_type=b"text/plain")
    assert {k: v.ack for k, v in result.items()} == {"a": ack, "b": ack}
    assert {error_class(v) for v in result.values()} == {klass}


def test_batch_non_2xx_json_body_still_answers_all_by_status() -> None:
    body = b'{"results": [{"id": "a", "ack": "accept"}]}'
    result = batch(503, body, ["a"], extra=((b"Retry-After", b"4"),))
    assert result["a"].ack == "release"
    assert result["a"].retry_after_ms == 4000


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"results": {}}', b'{"result": []}'])
def test_batch_malformed_answer_releases_all(body: bytes) -> None:
    result = batch(200, body, ["a", "b"])
    assert all(v.ack == "release" for v in result.values())
    assert {error_class(v) for v in result.values()} == {"sidecar.MalformedAnswer"}


def test_batch_with_custom_dlq_record() -> None:
    body = b'{"results": [{"id": "a", "ack": "reject", "dlq": {"value_b64": "eA=="}}]}'
    result = batch(200, body, ["a"])
    assert result["a"].dlq_value == b"x" and result["a"].dlq_value_set


# ---------------------------------------------------------------------------------------------
# The sidecar's ack API


def test_parse_ack_request_object_and_bare_list() -> None:
    body = json.dumps(
        {
            "acks": [
                {"id": "d1", "ack": "accept"},
                {"id": "d2", "ack": "reject", "error": {"class": "E", "message": "m"}},
                {"id": "d3", "ack": "release", "retry_after_ms": 10},
                {"id": "d4", "ack": "renew"},
                {"id": "d5", "ack": "reject", "dlq": {"headers": {"k": "v"}, "value_b64": "eQ=="}},
            ]
        }
    ).encode()
    items = parse_ack_request(body)
    assert items[0] == AckItem("d1", "accept")
    assert items[1] == AckItem("d2", "reject", AppError("E", "m"))
    assert items[2] == AckItem("d3", "release", retry_after_ms=10)
    assert items[3] == AckItem("d4", "renew")
    assert items[4] == AckItem("d5", "reject", None, None, (("k", b"v"),), b"y", True)
    assert parse_ack_request(b'[{"id": "x", "ack": "accept"}]') == [AckItem("x", "accept")]
    assert parse_ack_request(b'{"acks": []}') == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "invalid JSON"),
        (b'{"ack": "accept"}', "'acks'"),
        (b'{"acks": {}}', "'acks' must be a list"),
        (b'"x"', "must be a list"),
        (b'{"acks": [1]}', "acks[0] must be an object"),
        (b'{"acks": [{"ack": "accept"}]}', "acks[0].id"),
        (b'{"acks": [{"id": "", "ack": "accept"}]}', "acks[0].id"),
        (b'[{"id": "a", "ack": "accept"}, {"id": "b", "ack": "ok"}]', "[1].ack"),
        (b'{"acks": [{"id": "a", "ack": "reject", "error": []}]}', "acks[0].error"),
        (b'{"acks": [{"id": "a", "ack": "release", "retry_after_ms": -2}]}', "retry_after_ms"),
        (b'{"acks": [{"id": "a", "ack": "reject", "dlq": {"value_b64": 5}}]}', "dlq.value_b64"),
    ],
)
def test_parse_ack_request_errors_name_the_field(body: bytes, fragment: str) -> None:
    with pytest.raises(WireError, match=None) as caught:
        parse_ack_request(body)
    assert fragment in str(caught.value)


def test_format_ack_response() -> None:
    body = format_ack_response([("a", "ok"), ("b", "expired")])
    assert json.loads(body) == {
        "results": [{"id": "a", "result": "ok"}, {"id": "b", "result": "expired"}]
    }


# ---------------------------------------------------------------------------------------------
# Inputs that must not crash the parsers: every string that becomes bytes is checked here

# JSON text (what json.dumps writes for these strings) carrying a lone surrogate: valid JSON,
# but no UTF-8 encoding exists, so it can never become a Kafka header or a header value.
_LONE = "\ud800"
_UNENCODABLE_ANSWERS = [
    pytest.param({"dlq": {"headers": {_LONE: "v"}}}, "dlq.headers", id="header-name"),
    pytest.param({"dlq": {"headers": {"x-a": "a" + _LONE}}}, "dlq.headers", id="header-value"),
    pytest.param({"error": {"class": _LONE, "message": "m"}}, "error.class", id="class"),
    pytest.param({"error": {"class": "E", "message": _LONE}}, "error.message", id="message"),
    pytest.param({"error": {"class": "E", "stacktrace": "\udfff"}}, "stacktrace", id="stack"),
]


@pytest.mark.parametrize(("fields", "where"), _UNENCODABLE_ANSWERS)
def test_single_answer_with_a_lone_surrogate_is_malformed(
    fields: dict[str, object], where: str
) -> None:
    body = json.dumps({"ack": "reject", **fields}).encode()
    result = answer(200, body, JSON)
    assert result.ack == "release"
    assert error_class(result) == "sidecar.MalformedAnswer"
    assert result.error is not None and where in result.error.message
    assert result.error.message.encode("utf-8")  # the reason itself is encodable
    assert result.dlq_headers == ()


def test_raw_utf8_encoded_surrogate_bytes_are_malformed_too() -> None:
    # json.loads decodes bytes with 'surrogatepass': ED A0 80 becomes a lone surrogate.
    body = b'{"ack": "reject", "dlq": {"headers": {"\xed\xa0\x80": "v"}}}'
    assert error_class(answer(200, body, JSON)) == "sidecar.MalformedAnswer"


@pytest.mark.parametrize(("fields", "where"), _UNENCODABLE_ANSWERS)
def test_batch_entry_with_a_lone_surrogate_releases_only_that_record(
    fields: dict[str, object], where: str
) -> None:
    body = json.dumps(
        {"results": [{"id": "a", "ack": "reject", **fields}, {"id": "b", "ack": "accept"}]}
    ).encode()
    result = batch(200, body, ["a", "b"])
    assert result["a"].ack == "release"
    assert error_class(result["a"]) == "sidecar.MalformedAnswer"
    assert result["a"].error is not None and where in result["a"].error.message
    assert result["b"].ack == "accept"


@pytest.mark.parametrize(("fields", "where"), _UNENCODABLE_ANSWERS)
def test_ack_request_with_a_lone_surrogate_is_a_wire_error(
    fields: dict[str, object], where: str
) -> None:
    body = json.dumps({"acks": [{"id": "d1", "ack": "reject", **fields}]}).encode()
    with pytest.raises(WireError) as caught:
        parse_ack_request(body)
    assert "acks[0]" in str(caught.value) and where in str(caught.value)
    str(caught.value).encode("utf-8")


def test_ack_request_with_an_unencodable_id_is_a_wire_error() -> None:
    with pytest.raises(WireError, match=r"acks\[0\]\.id"):
        parse_ack_request(json.dumps({"acks": [{"id": "d" + _LONE, "ack": "accept"}]}).encode())


def test_valid_non_ascii_text_is_still_accepted() -> None:
    # Paired surrogates in JSON are one real character, and stay allowed.
    body = b'{"ack": "reject", "error": {"class": "\\ud83d\\ude00", "message": "\xc3\xa9"},'
    body += b' "dlq": {"headers": {"\\u00e9": "\\ud83d\\ude00"}}}'
    result = answer(200, body, JSON)
    assert result.ack == "reject"
    assert result.error == AppError("\U0001f600", "\u00e9")
    assert result.dlq_headers == (("\u00e9", "\U0001f600".encode()),)


@pytest.mark.parametrize(
    "value",
    ["\u00b2".encode("latin-1"), "\u00b9\u00b3".encode("latin-1"), b"1\xb2", "²".encode()],
)
def test_retry_after_with_non_ascii_digits_is_ignored(value: bytes) -> None:
    # str.isdigit() is true for '²', but int('²') raises: only ASCII digits are delay-seconds.
    for status in (429, 503):
        assert answer(status, extra=((b"Retry-After", value),)).retry_after_ms is None
        result = batch(status, b"", ["a"], extra=((b"Retry-After", value),))
        assert result["a"].retry_after_ms is None
    assert parse_retry_after_ms(value) is None


@pytest.mark.parametrize(
    "value", [b"Mon, 99 Jan 1970 13:47:10 GMT", b"Mon, 12 Jan 99999 13:47:10 GMT", b"\xff\xfe"]
)
def test_retry_after_with_a_bad_date_is_ignored(value: bytes) -> None:
    assert parse_retry_after_ms(value, now_epoch_s=0.0) is None


def test_extra_header_names_must_be_tokens() -> None:
    for name in ("X(A)", "X@A", "X\u00e9", 'X"A', "X/A", "X,A"):
        with pytest.raises(WireError):
            format_single_request(make_record(), "h", "/", ((name, "v"),))
        with pytest.raises(WireError):
            format_batch_request([make_record()], "h", "/", ((name, "v"),))
    for value in ("a\tb", "caf\u00e9", "a\x7fb"):
        with pytest.raises(WireError):
            format_single_request(make_record(), "h", "/", (("X-A", value),))


# ---------------------------------------------------------------------------------------------
# openapi.yaml is the contract: the code must do what it says


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    with OPENAPI_PATH.open(encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


def resolve(document: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        target: Any = document
        for part in ref[2:].split("/"):
            target = target[part]
        node = target
    return node


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_errors(document: dict[str, Any], schema: Any, value: Any, where: str = "$") -> list[str]:
    """The subset of JSON Schema 2020-12 that openapi.yaml uses, checked by hand."""
    schema = resolve(document, schema)
    errors: list[str] = []
    if "oneOf" in schema:
        matches = [s for s in schema["oneOf"] if not schema_errors(document, s, value, where)]
        if len(matches) != 1:
            errors.append(f"{where}: matches {len(matches)} of oneOf")
        return errors
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(
            isinstance(value, _JSON_TYPES[t]) and not (t in ("integer", "number") and value is True)
            for t in types
        )
        if isinstance(value, bool) and "boolean" not in types:
            ok = False
        if not ok:
            return [f"{where}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(value, int) and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "minLength" in schema and isinstance(value, str) and len(value) < schema["minLength"]:
        errors.append(f"{where}: shorter than {schema['minLength']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required {name!r}")
        for name, item in value.items():
            if name in properties:
                errors += schema_errors(document, properties[name], item, f"{where}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unexpected property {name!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                extra = schema["additionalProperties"]
                errors += schema_errors(document, extra, item, f"{where}.{name}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: more than {schema['maxItems']} items")
        prefix = schema.get("prefixItems", [])
        for index, item in enumerate(value):
            if index < len(prefix):
                errors += schema_errors(document, prefix[index], item, f"{where}[{index}]")
            elif "items" in schema:
                errors += schema_errors(document, schema["items"], item, f"{where}[{index}]")
    return errors


def test_schema_checker_catches_violations(openapi: dict[str, Any]) -> None:
    # The hand-written checker must be able to fail, or the tests below prove nothing.
    record_schema = {"$ref": "#/components/schemas/BatchRecord"}
    assert schema_errors(openapi, record_schema, {"id": "x"})
    assert schema_errors(openapi, {"$ref": "#/components/schemas/AckItem"}, {"id": 1, "ack": "x"})
    assert schema_errors(openapi, {"type": "integer"}, True)
    assert schema_errors(openapi, {"$ref": "#/components/schemas/AckRequest"}, {"acks": 1})


def documented_headers(openapi: dict[str, Any]) -> dict[str, bool]:
    """Documented request header names (lower-case) → required."""
    operation = openapi["webhooks"]["deliverRecord"]["post"]
    headers: dict[str, bool] = {}
    for reference in operation["parameters"]:
        parameter = resolve(openapi, reference)
        assert parameter["in"] == "header"
        headers[parameter["name"].lower()] = bool(parameter.get("required", False))
    return headers


# Framing headers are described by OpenAPI's requestBody, not as parameters.
FRAMING = {"host", "content-length", "content-type"}


@pytest.mark.parametrize(
    "record",
    [
        make_record(),
        make_record(traceparent=TRACEPARENT, tracestate="a=1"),
        make_record(key=None, value=None, timestamp_ms=None, timestamp_type="none", headers=()),
        make_record(key=b"\x00", headers=(("a", None), ("a", b""), ("b", b"\xff"))),
        make_record(timestamp_type="log-append", key=b""),
    ],
)
def test_single_request_uses_exactly_the_documented_headers(
    openapi: dict[str, Any], record: RecordView
) -> None:
    documented = documented_headers(openapi)
    request = parse_single(record)
    sent = {name.lower() for name, _ in request.headers}
    assert sent >= FRAMING
    assert sent - FRAMING <= set(documented), f"undocumented: {sent - FRAMING - set(documented)}"
    required = {name for name, needed in documented.items() if needed}
    assert required <= sent, f"required but missing: {required - sent}"
    enums = {
        resolve(openapi, p)["name"].lower(): resolve(openapi, p)["schema"].get("enum")
        for p in openapi["webhooks"]["deliverRecord"]["post"]["parameters"]
    }
    for name, value in request.headers:
        if enums.get(name.lower()):
            assert value in enums[name.lower()], (name, value)


def test_documented_headers_are_all_produced_by_some_record(openapi: dict[str, Any]) -> None:
    records = [
        make_record(traceparent=TRACEPARENT, tracestate="a=1", key=b"\x00", value=None),
        make_record(),
    ]
    sent = {name.lower() for r in records for name, _ in parse_single(r).headers}
    # The ce-* headers come with app.format: cloudevents.
    cloudevents = CloudEventsFormat("kafka://b:9092/{topic}", "t")
    sent |= {
        name.lower() for name, _ in parse_single(make_record(), cloudevents=cloudevents).headers
    }
    assert set(documented_headers(openapi)) <= sent


def test_batch_request_matches_the_documented_schema(openapi: dict[str, Any]) -> None:
    records = [
        make_record(traceparent=TRACEPARENT, tracestate="s"),
        make_record(key=None, value=None, timestamp_ms=None, timestamp_type="none"),
        make_record(headers=(("n", None), ("n", b"\x00\x01"))),
    ]
    request = ParsedRequest(format_batch_request(records, "h", "/b"))
    operation = openapi["webhooks"]["deliverBatch"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema_errors(openapi, schema, json.loads(request.body)) == []


def example_cases(
    openapi: dict[str, Any], webhook: str
) -> list[tuple[str, int, str, dict[str, Any], dict[str, Any]]]:
    """(name, status, media type, example, schema) for every documented answer example."""
    cases = []
    responses = openapi["webhooks"][webhook]["post"]["responses"]
    for status_key, response in responses.items():
        for media, content in response.get("content", {}).items():
            for name, example in content.get("examples", {}).items():
                status = example.get("x-status", status_key)
                assert str(status).isdigit(), f"{name}: give 'default' examples an x-status"
                cases.append((name, int(status), media, example, content.get("schema", {})))
    return cases


def example_body(media: str, example: dict[str, Any]) -> bytes:
    if "x-raw-body" in example:
        return str(example["x-raw-body"]).encode()
    if media == "application/json":
        return json.dumps(example["value"]).encode()
    return str(example["value"]).encode()


def check_answer(result: Answer, expected: dict[str, Any], name: str) -> None:
    assert result.ack == expected["ack"], name
    if "error_class" in expected:
        assert error_class(result) == expected["error_class"], name
    if "retry_after_ms" in expected:
        assert result.retry_after_ms == expected["retry_after_ms"], name
    if "dlq_headers" in expected:
        wanted = tuple((k, v.encode()) for k, v in expected["dlq_headers"].items())
        assert result.dlq_headers == wanted, name
    if "dlq_value_b64" in expected:
        assert result.dlq_value_set, name
        assert result.dlq_value == base64.b64decode(expected["dlq_value_b64"]), name


def check_example_schema(
    openapi: dict[str, Any], schema: Any, example: dict[str, Any], name: str
) -> None:
    # Examples of malformed answers say so (x-valid: false) and must really be invalid.
    errors = schema_errors(openapi, schema, example["value"])
    if example.get("x-valid", True):
        assert errors == [], name
    else:
        assert errors, f"{name} is marked invalid but matches the schema"


def test_documented_single_answers_interpret_as_documented(openapi: dict[str, Any]) -> None:
    cases = example_cases(openapi, "deliverRecord")
    assert len(cases) >= 15
    statuses = {status for _, status, _, _, _ in cases}
    assert {200, 202, 400, 422, 429, 500, 503} <= statuses
    for name, status, media, example, schema in cases:
        headers = [(b"content-type", media.encode())]
        for key, value in example.get("x-response-headers", {}).items():
            headers.append((key.encode(), str(value).encode()))
        body = example_body(media, example)
        expected = example["x-interpretation"]
        # A route-missing answer is no answer: the app client turns it away before interpreting.
        assert route_missing(status, headers, body) is expected.get("route_missing", False), name
        if route_missing(status, headers, body):
            continue
        result = interpret_single(status, headers, body, None)
        check_answer(result, expected, name)
        if media == "application/json" and "x-raw-body" not in example:
            check_example_schema(openapi, schema, example, name)


def test_documented_batch_answers_interpret_as_documented(openapi: dict[str, Any]) -> None:
    cases = example_cases(openapi, "deliverBatch")
    assert len(cases) >= 3
    for name, status, media, example, schema in cases:
        headers = [(b"content-type", media.encode())]
        result = interpret_batch(status, headers, example_body(media, example), example["x-ids"])
        expected = example["x-interpretation"]
        assert set(result) == set(expected), name
        for delivery_id, wanted in expected.items():
            check_answer(result[delivery_id], wanted, f"{name}/{delivery_id}")
        if "x-raw-body" not in example:
            check_example_schema(openapi, schema, example, name)


def test_documented_ack_requests_parse(openapi: dict[str, Any]) -> None:
    content = openapi["paths"]["/v1/acks"]["post"]["requestBody"]["content"]["application/json"]
    assert content["examples"]
    for name, example in content["examples"].items():
        assert schema_errors(openapi, content["schema"], example["value"]) == [], name
        items = parse_ack_request(json.dumps(example["value"]).encode())
        entries = (
            example["value"]["acks"] if isinstance(example["value"], dict) else example["value"]
        )
        assert [(item.delivery_id, item.ack) for item in items] == [
            (entry["id"], entry["ack"]) for entry in entries
        ], name


def test_ack_response_matches_the_documented_schema(openapi: dict[str, Any]) -> None:
    response = openapi["paths"]["/v1/acks"]["post"]["responses"]["200"]
    schema = response["content"]["application/json"]["schema"]
    body = format_ack_response([("a", "ok"), ("b", "unknown"), ("c", "expired")])
    assert schema_errors(openapi, schema, json.loads(body)) == []
    bad = json.loads(format_ack_response([("a", "maybe")]))
    assert schema_errors(openapi, schema, bad)


def test_local_api_paths_are_documented(openapi: dict[str, Any]) -> None:
    from sidecar.service.api import LocalApi

    assert openapi["openapi"].startswith("3.1")
    routes = LocalApi(None, None)._routes  # type: ignore[arg-type]
    assert set(openapi["paths"]) == {path for _method, path in routes}
    for method, path in routes:
        assert method.lower() in openapi["paths"][path], (method, path)


def test_route_missing_is_a_framework_page_under_404_405_415_or_a_mapped_status() -> None:
    text = [(b"content-type", b"text/plain")]
    js = [(b"content-type", b"application/json")]
    for status in (404, 405, 415):
        assert route_missing(status, text, b"404 page not found")
        assert route_missing(status, [], b"")
        assert route_missing(status, js, b'{"detail": "Not Found"}')  # JSON, but no answer
        assert route_missing(status, js, b"<html>")  # declared JSON, is not
        assert route_missing(status, js, b"[1]")
        assert not route_missing(status, js, b'{"ack": "reject"}')  # an answer: read as one
    assert route_missing(404, js, b'{"results": []}')  # single mode: no ack, no answer
    assert not route_missing(404, js, b'{"results": []}', batch=True)
    for status in (200, 400, 410, 500, 503):
        assert not route_missing(status, text, b"Not Found")
    # The mapping decides first: a mapped 404 is what it is mapped to, a mapped 410 is missing.
    assert not route_missing(404, text, b"", {404: "reject"})
    assert route_missing(410, text, b"gone", {410: "route-missing"})
    assert not route_missing(410, js, b'{"ack": "accept"}', {410: "route-missing"})
    # Behind a JSON answer a route-missing mapping leaves the status to the default table.
    answer = interpret_single(410, js, b'{"error": {"class": "a.B"}}', {410: "route-missing"})
    assert answer.ack == "release"


@given(
    status=st.integers(100, 599),
    mapping=st.dictionaries(
        st.integers(100, 599), st.sampled_from(["accept", "release", "reject", "route-missing"])
    ),
)
def test_route_missing_says_yes_only_to_its_statuses(status: int, mapping: dict[int, str]) -> None:
    # The app client asks route_missing only for these statuses: a yes outside them would be lost.
    statuses = route_missing_statuses(mapping)
    if status not in statuses:
        assert not route_missing(status, [], b"", mapping)
    assert route_missing_statuses() == {404, 405, 415}
    assert route_missing_statuses({404: "reject", 503: "route-missing"}) == {405, 415, 503}


def test_validate_status_mapping_takes_route_missing() -> None:
    assert validate_status_mapping({410: "route-missing"}) == {410: "route-missing"}
