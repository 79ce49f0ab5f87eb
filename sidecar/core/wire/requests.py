"""Requests to the app (docs/app-contract.md): the exact bytes of single and batch requests in the sidecar's raw
format (CloudEvents requests are built by `sidecar.core.wire.cloudevents`), the `X-Kafka-*`
header encodings, and the pull API's response body.

Pure functions and frozen values (see `sidecar.core.wire`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import time
from collections.abc import Iterable, Sequence
from urllib.parse import quote_from_bytes, unquote_to_bytes

from sidecar.core.wire.cloudevents import (
    CLOUDEVENTS_BATCH_CONTENT_TYPE,
    CloudEventsFormat,
    binary_mode,
    format_cloudevents_batch_body,
)
from sidecar.core.wire.values import RecordView, SchemaRef, WireError, is_header_safe

__all__ = [
    "decode_kafka_header",
    "decode_key",
    "encode_kafka_header",
    "format_batch_request",
    "format_pull_response",
    "format_single_request",
]

# RFC 9110 token: the only characters a header field name may have.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))
_UNRESERVED = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"


def _is_plain_key(key: bytes) -> bool:
    # A key goes into the header as is only when a header round trip cannot alter it: printable
    # ASCII, and no leading/trailing space (HTTP parsers strip optional whitespace around values).
    # bytes.translate(None, keep) deletes the allowed bytes in C: anything left is disallowed.
    return not key.translate(None, _PRINTABLE_ASCII) and key[:1] != b" " and key[-1:] != b" "


def _pct(data: bytes) -> str:
    if not data.translate(None, _UNRESERVED):
        return data.decode("ascii")  # the common case: a plain token needs no escaping
    return quote_from_bytes(data, safe="")


def encode_kafka_header(name: str, value: bytes | None) -> str:
    """One ``Kafka-Header`` field value: ``pct(name)=pct(value)``, or ``pct(name)`` for null.

    Percent-encoding is RFC 3986 over the raw bytes (the name's UTF-8), with everything but the
    unreserved set ``ALPHA / DIGIT / - . _ ~`` encoded, so ``=`` and ``%`` are unambiguous.
    """
    encoded_name = _pct(name.encode("utf-8", "surrogateescape"))
    if value is None:
        return encoded_name
    return encoded_name + "=" + _pct(value)


def decode_kafka_header(field: str) -> tuple[str, bytes | None]:
    """Inverse of :func:`encode_kafka_header` (what an app does with each ``Kafka-Header``)."""
    name, sep, value = field.partition("=")
    decoded_name = unquote_to_bytes(name).decode("utf-8", "surrogateescape")
    return decoded_name, (unquote_to_bytes(value) if sep else None)


def decode_key(key_header: str | None, encoding_header: str | None) -> bytes | None:
    """The record key from ``Kafka-Key`` / ``Kafka-Key-Encoding`` (None when the key is null)."""
    if key_header is None:
        return None
    if encoding_header is not None and encoding_header.strip().lower() == "base64":
        return base64.b64decode(key_header, validate=True)
    return key_header.encode("ascii")


@functools.lru_cache(maxsize=64)
def _request_prefix(
    host: str, path: str, extra_headers: tuple[tuple[str, str], ...], content_type: str
) -> bytes:
    # Everything that does not depend on the record, built once per (target, mode).
    if not path.startswith("/") or " " in path or not is_header_safe(path):
        raise WireError(f"request path must be an absolute visible-ASCII path, got {path!r}")
    if not is_header_safe(host) or not host:
        raise WireError(f"Host header value is not visible ASCII: {host!r}")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Type: {content_type}"]
    for name, value in extra_headers:
        if not _TOKEN.fullmatch(name):
            raise WireError(f"extra header name is not a valid token: {name!r}")
        if not is_header_safe(value):
            raise WireError(f"extra header {name!r} has a value that is not visible ASCII")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n").encode("ascii")


def _extra_tuple(extra_headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return extra_headers if isinstance(extra_headers, tuple) else tuple(extra_headers)


def format_single_request(
    record: RecordView,
    host: str,
    path: str,
    extra_headers: Iterable[tuple[str, str]] = (),
    cloudevents: CloudEventsFormat | None = None,
) -> bytes:
    """The complete HTTP/1.1 request (head and body) that delivers ``record`` in single mode.

    With ``cloudevents`` the request is also a CloudEvent in the HTTP binding's binary mode
    (see :func:`cloudevent_attributes`); the ``Kafka-*`` headers stay as they are.
    """
    content_type = "application/octet-stream" if record.value_schema is None else "application/json"
    ce_lines = b""
    if cloudevents is not None:
        content_type, ce_lines = binary_mode(record, cloudevents)
    prefix = _request_prefix(host, path, _extra_tuple(extra_headers), content_type)
    topic = record.topic
    delivery_id = record.delivery_id
    if not (is_header_safe(topic) and is_header_safe(delivery_id)):
        raise WireError("topic and delivery id must be visible ASCII")
    value = record.value
    body = b"" if value is None else value
    parts = [
        prefix,
        b"Content-Length: %d\r\nKafka-Topic: %s\r\nKafka-Partition: %d\r\nKafka-Offset: %d\r\n"
        b"Kafka-Delivery-Count: %d\r\nKafka-Delivery-Id: %s\r\nKafka-Timestamp-Type: %s\r\n"
        % (
            len(body),
            topic.encode("ascii"),
            record.partition,
            record.offset,
            record.delivery_count,
            delivery_id.encode("ascii"),
            record.timestamp_type.encode("ascii"),
        ),
    ]
    if record.timestamp_ms is not None:
        parts.append(b"Kafka-Timestamp: %d\r\n" % record.timestamp_ms)
    key = record.key
    if key is not None:
        if _is_plain_key(key):
            parts.append(b"Kafka-Key: %s\r\n" % key)
        else:
            parts.append(
                b"Kafka-Key: %s\r\nKafka-Key-Encoding: base64\r\n"
                % binascii.b2a_base64(key, newline=False)
            )
    if value is None:
        parts.append(b"Kafka-Value-Null: true\r\n")
    for name, header_value in record.headers:
        parts.append(b"Kafka-Header: %s\r\n" % encode_kafka_header(name, header_value).encode())
    if record.key_schema is not None:
        parts.append(_schema_lines(b"Key", record.key_schema))
    if record.value_schema is not None:
        parts.append(_schema_lines(b"Value", record.value_schema))
    if ce_lines:
        parts.append(ce_lines)
    # Trace context comes from record headers a producer wrote, so it is untrusted: a value
    # that could break the header block is dropped rather than forwarded.
    if record.traceparent is not None and is_header_safe(record.traceparent):
        parts.append(b"traceparent: %s\r\n" % record.traceparent.encode("ascii"))
        if record.tracestate is not None and is_header_safe(record.tracestate):
            parts.append(b"tracestate: %s\r\n" % record.tracestate.encode("ascii"))
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


def _schema_lines(field: bytes, schema: SchemaRef) -> bytes:
    """``Kafka-<Field>-Schema-*`` lines: the schema a decoded key or value was read with. A subject
    that is not visible ASCII is left out (the id names the schema all the same)."""
    lines = b"Kafka-%s-Schema-Id: %d\r\nKafka-%s-Schema-Type: %s\r\n" % (
        field,
        schema.schema_id,
        field,
        schema.schema_type.encode("ascii", "replace"),
    )
    if schema.subject and is_header_safe(schema.subject):
        lines += b"Kafka-%s-Schema-Subject: %s\r\nKafka-%s-Schema-Version: %d\r\n" % (
            field,
            schema.subject.encode("ascii"),
            field,
            schema.version,
        )
    return lines


def _schema_json(schema: SchemaRef) -> bytes:
    return b'{"subject":%s,"version":%d,"id":%d,"type":%s}' % (
        _jstr(schema.subject),
        schema.version,
        schema.schema_id,
        _jstr(schema.schema_type),
    )


_NULL = b"null"
_json_str = json.encoder.encode_basestring_ascii  # C-accelerated: a quoted, escaped JSON string


def _jstr(text: str | None) -> bytes:
    return _NULL if text is None else _json_str(text).encode("ascii")


def _b64json(data: bytes | None) -> bytes:
    # Base64 text needs no JSON escaping, so it goes in between quotes as is.
    # binascii directly: base64.b64encode is a Python wrapper around it (a call per value).
    return _NULL if data is None else b'"%s"' % binascii.b2a_base64(data, newline=False)


def _header_json(name: str, value: bytes | None) -> bytes:
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return b"[%s,%s]" % (_json_str(text).encode("ascii"), _b64json(value))


_BATCH_ITEM = (
    b'{"id":%s,"topic":%s,"partition":%d,"offset":%d,"key":%s,"value":%s,"headers":[%s],'
    b'"timestamp":%s,"timestamp_type":%s,"delivery_count":%d,"traceparent":%s,"tracestate":%s}'
)


def _batch_item(record: RecordView, topics: dict[str, bytes]) -> bytes:
    """One record of the batch schema as JSON; `topics` caches the topics' escaped names."""
    topic = topics.get(record.topic)
    if topic is None:
        topic = topics[record.topic] = _jstr(record.topic)
    ts = record.timestamp_ms
    item = _BATCH_ITEM % (
        _jstr(record.delivery_id),
        topic,
        record.partition,
        record.offset,
        _b64json(record.key),
        _b64json(record.value),
        b",".join([_header_json(n, v) for n, v in record.headers]),
        _NULL if ts is None else b"%d" % ts,
        _jstr(record.timestamp_type),
        record.delivery_count,
        _jstr(record.traceparent),
        _jstr(record.tracestate),
    )
    if record.key_schema is None and record.value_schema is None:
        return item
    # Decoded through a Schema Registry: `key` / `value` carry JSON text, and the schema is named.
    extra = b""
    if record.key_schema is not None:
        extra += b',"key_schema":%s' % _schema_json(record.key_schema)
    if record.value_schema is not None:
        extra += b',"value_schema":%s' % _schema_json(record.value_schema)
    return item[:-1] + extra + b"}"


def format_batch_request(
    records: Sequence[RecordView],
    host: str,
    path: str,
    extra_headers: Iterable[tuple[str, str]] = (),
    cloudevents: CloudEventsFormat | None = None,
) -> bytes:
    """The complete HTTP/1.1 request that delivers ``records`` in batch mode (JSON body).

    The body is the JSON document ``{"records": [...]}`` of the batch schema, assembled from
    pre-escaped pieces: ``json.dumps`` over dicts would scan every base64 value for characters to
    escape, and that scan was the largest single cost of a batch. With ``cloudevents`` it is a
    JSON array of CloudEvents instead (:func:`format_cloudevents_batch_body`).
    """
    if cloudevents is not None:
        ce_prefix = _request_prefix(
            host, path, _extra_tuple(extra_headers), CLOUDEVENTS_BATCH_CONTENT_TYPE
        )
        ce_body = format_cloudevents_batch_body(records, cloudevents)
        return b"%sContent-Length: %d\r\n\r\n%s" % (ce_prefix, len(ce_body), ce_body)
    prefix = _request_prefix(host, path, _extra_tuple(extra_headers), "application/json")
    topics: dict[str, bytes] = {}
    items = [_batch_item(record, topics) for record in records]
    body = b'{"records":[%s]}' % b",".join(items)
    return b"%sContent-Length: %d\r\n\r\n%s" % (prefix, len(body), body)


_PULL_LOCK = b',"lock_expires_in_ms":%d,"lock_deadline_ms":%d}'


def format_pull_response(
    records: Sequence[tuple[RecordView, int]], now_epoch_ms: int | None = None
) -> bytes:
    """The ``GET /v1/records`` body (pull mode): ``{"records": [...]}``, each record as in a
    batch request plus its lock: ``lock_expires_in_ms`` (from now) and ``lock_deadline_ms``
    (Unix epoch milliseconds). ``records`` pairs each view with its lock's remaining ms."""
    now_ms = int(time.time() * 1000) if now_epoch_ms is None else now_epoch_ms
    topics: dict[str, bytes] = {}
    items = []
    for record, lock_ms in records:
        item = _batch_item(record, topics)
        items.append(item[:-1] + _PULL_LOCK % (lock_ms, now_ms + lock_ms))
    return b'{"records":[%s]}' % b",".join(items)
