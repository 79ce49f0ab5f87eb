"""app.format: cloudevents — the request bytes, read back by the official CloudEvents SDK.

The requests are parsed with httptools (as in test_wire.py) and then handed to the
``cloudevents`` SDK's HTTP binding (binary mode) or JSON format (each event of a batch): the SDK,
not this module, says whether what the sidecar sends is a CloudEvent. Records carrying CloudEvents
in Kafka's binding are made with the SDK's Kafka binding.
"""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

import pytest
import yaml
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.wire import (
    CLOUDEVENTS_BATCH_CONTENT_TYPE,
    CloudEventsFormat,
    RecordView,
    cloudevent_attributes,
    cloudevents_time,
    decode_kafka_header,
    format_batch_request,
    format_single_request,
    interpret_batch,
)
from tests.unit.test_wire import (
    FRAMING,
    OPENAPI_PATH,
    ParsedRequest,
    documented_headers,
    make_record,
    schema_errors,
)

CE = CloudEventsFormat(source="kafka://broker-0:9092/{topic}", type="com.example.{topic}.record")


def http_event(record: RecordView, ce: CloudEventsFormat = CE) -> tuple[ParsedRequest, Any]:
    request = ParsedRequest(format_single_request(record, "localhost", "/events", (), ce))
    message = ce_http.HTTPMessage(dict(request.headers), request.body)
    return request, ce_http.from_binary(message, JSONFormat(), CloudEvent)


def batch_events(
    records: list[RecordView],
) -> tuple[ParsedRequest, list[dict[str, Any]], list[Any]]:
    request = ParsedRequest(format_batch_request(records, "localhost", "/events", (), CE))
    raw = json.loads(request.body)
    assert isinstance(raw, list)
    events = [JSONFormat().read(CloudEvent, json.dumps(item).encode()) for item in raw]
    return request, raw, events


# ---------------------------------------------------------------------------------------------
# Single mode: binary content mode


def test_single_mode_is_a_binary_mode_cloudevent() -> None:
    record = make_record(headers=(("content-type", b"application/json"), ("source", b"web")))
    request, event = http_event(record)
    assert event.get_specversion() == "1.0"
    assert event.get_id() == "orders/3/42"
    assert event.get_source() == "kafka://broker-0:9092/orders"
    assert event.get_type() == "com.example.orders.record"
    assert event.get_time() == datetime.datetime(
        2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC
    )
    assert event.get_extension("partitionkey") == "customer-7"
    assert event.get_datacontenttype() == "application/json"
    assert event.get_data() == {"qty": 1}
    # The sidecar's own metadata and the body stay as in raw mode.
    assert request.value("Content-Type") == "application/json"
    assert request.value("Kafka-Delivery-Id") == "orders-3-42-2"
    assert request.value("Kafka-Delivery-Count") == "2"
    assert request.body == b'{"qty": 1}'
    assert request.value("ce-datacontenttype") is None  # HTTP binding §3.1.1: MUST NOT


def test_raw_format_has_no_cloudevents_headers() -> None:
    request = ParsedRequest(format_single_request(make_record(), "h", "/"))
    assert not [name for name, _ in request.headers if name.lower().startswith("ce-")]
    assert request.value("Content-Type") == "application/octet-stream"


def test_no_content_type_header_means_opaque_bytes() -> None:
    request, event = http_event(make_record(value=b"\x00\xff"))
    assert request.value("Content-Type") == "application/octet-stream"
    assert event.get_data() == b"\x00\xff"


def test_kafka_binding_headers_win_over_the_derived_attributes() -> None:
    produced = CloudEvent(
        {
            "id": "evt-1",
            "source": "/producer/checkout",
            "type": "com.shop.order.placed",
            "subject": "order 17 €",
            "time": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
            "datacontenttype": "application/json",
            "tenant": "acme",
        },
        {"order": 17},
    )
    message = ce_kafka.to_binary(produced, JSONFormat())
    record = make_record(
        key=b"order-17",
        value=message.value,
        headers=tuple((name, value) for name, value in message.headers.items()),
    )
    request, event = http_event(record)
    assert event.get_id() == "evt-1"
    assert event.get_source() == "/producer/checkout"
    assert event.get_type() == "com.shop.order.placed"
    assert event.get_subject() == "order 17 €"
    assert event.get_time() == datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    assert event.get_extension("tenant") == "acme"
    assert event.get_extension("partitionkey") == "order-17"
    assert event.get_data() == {"order": 17}
    assert request.value("ce-subject") == "order%2017%20%E2%82%AC"  # §3.1.3.2 percent-encoding
    # Each header still arrives as a Kafka-Header too, byte-exact.
    forwarded = dict(decode_kafka_header(v) for v in request.values("Kafka-Header"))
    assert forwarded["ce_id"] == b"evt-1"


def test_a_record_header_cannot_change_the_specversion_or_break_the_header_block() -> None:
    record = make_record(
        headers=(
            ("ce_specversion", b"0.3"),
            ("ce_Bad-Name", b"x"),
            ("ce_note", b"line\r\nX-Injected: 1"),
            ("ce_blob", b"\xff\xfe"),
            ("content-type", b"text/plain\r\nX: 1"),
        )
    )
    request, event = http_event(record)
    assert event.get_specversion() == "1.0"
    assert request.value("X-Injected") is None
    assert request.value("ce-note") is None  # a control character: not a CloudEvents String
    assert request.value("ce-blob") is None  # not UTF-8
    assert request.value("ce-bad-name") is None
    assert request.value("Content-Type") == "application/octet-stream"


def test_a_record_header_that_would_make_the_event_invalid_is_left_out() -> None:
    record = make_record(
        headers=(
            ("ce_id", b""),
            ("ce_time", b"yesterday"),
            ("ce_source", b"not a uri"),
            ("ce_data", b"x"),
            ("ce_subject", b"kept"),
        )
    )
    attributes = cloudevent_attributes(record, CE)
    assert attributes["id"] == "orders/3/42"
    assert attributes["time"] == "2023-11-14T22:13:20.123Z"
    assert attributes["source"] == "kafka://broker-0:9092/orders"
    assert "data" not in attributes
    assert attributes["subject"] == "kept"
    for good in (b"2024-02-29T23:59:59Z", b"2024-01-01t00:00:00.5+05:30"):
        assert cloudevent_attributes(make_record(headers=(("ce_time", good),)), CE)["time"] == (
            good.decode()
        )
    for bad in (b"2023-02-29T00:00:00Z", b"2024-01-01 00:00:00Z", b"2024-01-01T00:00:00"):
        attributes = cloudevent_attributes(make_record(headers=(("ce_time", bad),)), CE)
        assert attributes["time"] == "2023-11-14T22:13:20.123Z", bad


def test_a_structured_mode_record_goes_through_as_it_is() -> None:
    produced = CloudEvent({"id": "s-1", "source": "/p", "type": "t"}, {"a": 1})
    body = JSONFormat().write(produced)
    record = make_record(value=body, headers=(("content-type", b"application/cloudevents+json"),))
    request = ParsedRequest(format_single_request(record, "h", "/", (), CE))
    assert request.value("Content-Type") == "application/cloudevents+json"
    assert not [name for name, _ in request.headers if name.lower().startswith("ce-")]
    assert request.body == body
    message = ce_http.HTTPMessage(dict(request.headers), request.body)
    event = ce_http.from_http(message, JSONFormat(), CloudEvent)
    assert event.get_id() == "s-1"


def test_a_structured_content_type_over_a_null_value_is_binary_mode() -> None:
    record = make_record(value=None, headers=(("content-type", b"application/cloudevents+json"),))
    request, event = http_event(record)
    assert request.value("Content-Type") == "application/octet-stream"
    assert event.get_id() == "orders/3/42"
    assert request.value("Kafka-Value-Null") == "true"


def test_keys_that_are_not_strings_are_not_a_partitionkey() -> None:
    for key in (None, b"", b"\xff\x00", b"tab\there"):
        attributes = cloudevent_attributes(make_record(key=key), CE)
        assert "partitionkey" not in attributes, key


@pytest.mark.parametrize(
    ("timestamp_ms", "expected"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        (253_402_300_800_000, None),
        (2**63 - 1, None),
    ],
)
def test_time_is_rfc3339_utc_with_milliseconds(timestamp_ms: int, expected: str | None) -> None:
    assert cloudevents_time(timestamp_ms) == expected


@given(st.integers(-62_135_596_800_000, 253_402_300_799_999))
def test_time_agrees_with_datetime(timestamp_ms: int) -> None:
    seconds, millis = divmod(timestamp_ms, 1000)
    when = datetime.datetime(1, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
        seconds=seconds + 62_135_596_800, milliseconds=millis
    )
    assert cloudevents_time(timestamp_ms) == when.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
    assert cloudevents_time(-62_135_596_800_001) is None  # before year 1


def test_no_timestamp_no_time() -> None:
    assert "time" not in cloudevent_attributes(make_record(timestamp_ms=None), CE)


# ---------------------------------------------------------------------------------------------
# Batch mode: the JSON batch format


def test_batch_mode_is_a_cloudevents_json_batch() -> None:
    records = [
        make_record(offset=7, delivery_id="d-7", headers=(("content-type", b"text/plain"),)),
        make_record(offset=8, delivery_id="d-8", key=None, value=None),
        make_record(offset=9, delivery_id="d-9", value=b""),
    ]
    request, raw, events = batch_events(records)
    assert request.value("Content-Type") == CLOUDEVENTS_BATCH_CONTENT_TYPE
    assert [e.get_id() for e in events] == ["orders/3/7", "orders/3/8", "orders/3/9"]
    assert {e.get_specversion() for e in events} == {"1.0"}  # HTTP binding §3.3.2
    assert [e.get_extension("deliveryid") for e in events] == ["d-7", "d-8", "d-9"]
    assert events[0].get_extension("deliverycount") == 2
    assert events[0].get_extension("kafkaoffset") == "7"
    assert events[0].get_extension("kafkapartition") == 3
    assert events[0].get_extension("kafkatopic") == "orders"
    assert events[0].get_datacontenttype() == "text/plain"
    assert base64.b64decode(raw[0]["data_base64"]) == b'{"qty": 1}'
    assert "data_base64" not in raw[1] and "data" not in raw[1]  # null value: no data
    assert "partitionkey" not in raw[1]
    assert raw[2]["data_base64"] == ""  # empty value: empty data, distinct from null


def test_the_batch_answer_names_events_by_deliveryid() -> None:
    records = [make_record(offset=1, delivery_id="d-1"), make_record(offset=2, delivery_id="d-2")]
    _, raw, _ = batch_events(records)
    answer = json.dumps(
        {"results": [{"id": raw[0]["deliveryid"], "ack": "reject"}, {"id": "d-2", "ack": "accept"}]}
    ).encode()
    answers = interpret_batch(200, [(b"content-type", b"application/json")], answer, ["d-1", "d-2"])
    assert answers["d-1"].ack == "reject"
    assert answers["d-2"].ack == "accept"


def test_a_structured_record_in_a_batch_is_its_event_with_the_sidecar_extensions() -> None:
    body = json.dumps(
        {"specversion": "1.0", "id": "s-9", "source": "/p", "type": "t", "deliveryid": "forged"}
    ).encode()
    structured = make_record(
        delivery_id="d-1", value=body, headers=(("content-type", b"application/cloudevents+json"),)
    )
    broken = make_record(
        offset=43,
        delivery_id="d-2",
        value=b"not json",
        headers=(("content-type", b"application/cloudevents+json"),),
    )
    _, raw, events = batch_events([structured, broken])
    assert events[0].get_id() == "s-9"
    assert events[0].get_extension("deliveryid") == "d-1"  # the sidecar's own wins
    assert events[1].get_id() == "orders/3/43"  # not an event: carried as data
    assert base64.b64decode(raw[1]["data_base64"]) == b"not json"


def test_batch_carries_the_trace_context_as_the_tracing_extension() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    _, _, events = batch_events([make_record(traceparent=traceparent, tracestate="v=1")])
    assert events[0].get_extension("traceparent") == traceparent
    assert events[0].get_extension("tracestate") == "v=1"


# ---------------------------------------------------------------------------------------------
# Properties: any record becomes a CloudEvent the SDK reads, with the record's identity

topics = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
    min_size=1,
    max_size=40,
)
header_names = st.one_of(
    st.text(max_size=12),
    st.builds(lambda s: "ce_" + s, st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123", max_size=8)),
    st.sampled_from(["content-type", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject"]),
)
header_values = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.text(max_size=12).map(str.encode),
    st.sampled_from([b"2024-05-06T07:08:09Z", b"/a/b", b"application/json", b"text/plain"]),
)
records = st.builds(
    lambda topic, partition, offset, key, value, ts, headers: make_record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        timestamp_ms=ts,
        headers=tuple(headers),
    ),
    topics,
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.one_of(st.none(), st.binary(max_size=20), st.text(max_size=10).map(str.encode)),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.lists(
        st.tuples(header_names, header_values),
        max_size=6,
    ),
)


def _kafka_ce_headers(record: RecordView) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in record.headers:
        if name.lower().startswith("ce_") and value is not None:
            found[name.lower()[3:]] = value.decode("utf-8", "replace")
    return found


@given(records)
def test_any_record_is_a_cloudevent_the_sdk_reads_in_single_mode(record: RecordView) -> None:
    request, event = http_event(record)
    assert event.get_specversion() == "1.0"
    assert request.body == (record.value or b"")
    assert event.get_source() and event.get_type() and event.get_id()
    overridden = _kafka_ce_headers(record)
    if "id" not in overridden:
        assert event.get_id() == f"{record.topic}/{record.partition}/{record.offset}"
    assert request.value("Kafka-Offset") == str(record.offset)


@given(records)
def test_any_record_is_a_cloudevent_the_sdk_reads_in_batch_mode(record: RecordView) -> None:
    _, raw, events = batch_events([record])
    assert events[0].get_specversion() == "1.0"
    assert raw[0]["deliveryid"] == record.delivery_id
    if "data_base64" in raw[0]:
        assert base64.b64decode(raw[0]["data_base64"]) == record.value


@given(st.lists(st.tuples(topics, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1))))
def test_the_derived_id_is_unique_per_topic_partition_offset(
    coordinates: list[tuple[str, int, int]],
) -> None:
    ids = {}
    for topic, partition, offset in coordinates:
        record = make_record(topic=topic, partition=partition, offset=offset, headers=())
        ids[cloudevent_attributes(record, CE)["id"]] = (topic, partition, offset)
    assert len(ids) == len(set(coordinates))


def test_the_same_record_redelivered_keeps_its_id() -> None:
    first = cloudevent_attributes(make_record(delivery_count=1, delivery_id="a"), CE)
    again = cloudevent_attributes(make_record(delivery_count=2, delivery_id="b"), CE)
    assert first == again


# ---------------------------------------------------------------------------------------------
# openapi.yaml documents what is sent


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))
    return document


@pytest.mark.parametrize(
    "record",
    [
        make_record(),
        make_record(key=None, value=None, timestamp_ms=None, timestamp_type="none", headers=()),
        make_record(headers=(("content-type", b"application/json"), ("ce_id", b"x"))),
    ],
)
def test_binary_mode_sends_only_documented_headers(
    openapi: dict[str, Any], record: RecordView
) -> None:
    request, _ = http_event(record)
    sent = {name.lower() for name, _ in request.headers}
    assert sent - FRAMING <= set(documented_headers(openapi))


def test_cloudevents_batch_matches_the_documented_schema(openapi: dict[str, Any]) -> None:
    records = [
        make_record(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        make_record(key=None, value=None, timestamp_ms=None, timestamp_type="none"),
        make_record(headers=(("content-type", b"text/plain"), ("ce_subject", b"s"))),
    ]
    _, raw, _ = batch_events(records)
    content = openapi["webhooks"]["deliverBatch"]["post"]["requestBody"]["content"]
    schema = content[CLOUDEVENTS_BATCH_CONTENT_TYPE]["schema"]
    assert schema_errors(openapi, schema, raw) == []
    assert schema_errors(openapi, schema, [{"id": "x"}])  # the schema can fail
