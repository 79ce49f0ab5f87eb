"""The HTTP wire contract between the sidecar and the application (SPEC §5, §6), sans-IO.

This module owns the exact bytes of the requests the sidecar sends to the app (single and batch
mode, in the sidecar's raw format or as CloudEvents: binary mode for one record, the JSON batch
format for many), the interpretation of the app's answers into acks (the same for both formats),
and the parsing of the sidecar's own ``POST /v1/acks`` body. ``openapi.yaml`` at the repository root documents the same contract and
``tests/unit/test_wire.py`` checks the two against each other.

Pure functions and frozen values only: no sockets, no trio, no Kafka, no logging. The one clock
read (an HTTP-date ``Retry-After``) can be pinned by the caller through ``now_epoch_s``. It must
not import any other ``sidecar`` module, so every layer can depend on it.

Errors::

    WireError(ValueError)   malformed input to a parser here (the ack API body, a bad header
                            value handed to a formatter); the app's *answers* never raise —
                            a malformed answer is a release carrying a
                            ``sidecar.MalformedAnswer`` error.

Every string a parser returns that will become bytes later (a DLQ header name or value, an
error's class, message or stack trace, a delivery id) is checked here to have a UTF-8 encoding:
JSON's ``\ud800`` escape is valid JSON but a lone surrogate, which no encoder accepts, and the
DLQ producer must never be handed one.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import email.utils
import functools
import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast
from urllib.parse import quote, quote_from_bytes, unquote_to_bytes

from sidecar.core.errors import SidecarError

__all__ = [
    "ACK_REQUEST_WORDS",
    "ANSWER_ACKS",
    "CLOUDEVENTS_BATCH_CONTENT_TYPE",
    "CLOUDEVENTS_BATCH_EXTENSIONS",
    "CLOUDEVENTS_SPECVERSION",
    "MALFORMED_ANSWER",
    "MAX_RETRY_AFTER_MS",
    "AckItem",
    "AckWord",
    "Answer",
    "AppError",
    "CloudEventsFormat",
    "RecordView",
    "WireError",
    "cloudevent_attributes",
    "cloudevents_time",
    "decode_kafka_header",
    "decode_key",
    "encode_kafka_header",
    "format_ack_response",
    "format_batch_request",
    "format_cloudevents_batch_body",
    "format_pull_response",
    "format_single_request",
    "interpret_batch",
    "interpret_single",
    "is_structured_content_type",
    "parse_ack_request",
    "parse_retry_after_ms",
    "validate_status_mapping",
]

AckWord: TypeAlias = Literal["accept", "release", "reject", "deferred"]
AckRequestWord: TypeAlias = Literal["accept", "release", "reject", "renew"]
HeaderList: TypeAlias = Sequence[tuple[bytes, bytes]]

# The words an app may put in a JSON answer; "deferred" is only reachable through status 202
# (or a status mapping), because a JSON body *is* an answer and so cannot defer one.
ANSWER_ACKS: frozenset[str] = frozenset({"accept", "release", "reject"})
_STATUS_ACKS: frozenset[str] = frozenset({"accept", "release", "reject", "deferred"})
ACK_REQUEST_WORDS: frozenset[str] = frozenset({"accept", "release", "reject", "renew"})

# A Retry-After far in the future is almost always a bug on the app side (a date in the wrong
# zone, ms sent as s); capping keeps one record from stalling its key for hours.
MAX_RETRY_AFTER_MS = 600_000
# The message of a synthesised HttpStatusNNN error: enough to recognise the failure in the DLQ
# headers, small enough that an HTML error page does not bloat them.
_STATUS_MESSAGE_CHARS = 200

MALFORMED_ANSWER = "sidecar.MalformedAnswer"


class WireError(SidecarError, ValueError):
    """Input to this module's parsers or formatters is malformed; the message says where."""


@dataclass(frozen=True, slots=True)
class RecordView:
    """What the wire needs of one delivery attempt of one Kafka record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    timestamp_type: str  # "create" | "log-append" | "none"
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int
    delivery_id: str
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class AppError:
    """The app's (or the sidecar's) account of why a record failed; feeds ``__dlq.errors.*``.

    An empty ``class_name`` or ``message`` means the app did not say.
    """

    class_name: str
    message: str
    stacktrace: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """The interpreted answer to one delivery attempt.

    ``retry_after_ms`` matters for a release (the earliest redelivery); ``dlq_*`` for a reject
    (KIP-1034 custom DLQ record: extra headers, and a replacement value when ``dlq_value_set``,
    where ``dlq_value=None`` with ``dlq_value_set`` means a null DLQ value).
    """

    ack: AckWord
    error: AppError | None = None
    retry_after_ms: int | None = None
    dlq_headers: tuple[tuple[str, bytes], ...] = ()
    dlq_value: bytes | None = None
    dlq_value_set: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class AckItem:
    """One entry of a ``POST /v1/acks`` body."""

    delivery_id: str
    ack: AckRequestWord
    error: AppError | None = None
    retry_after_ms: int | None = None
    dlq_headers: tuple[tuple[str, bytes], ...] = ()
    dlq_value: bytes | None = None
    dlq_value_set: bool = False


# ---------------------------------------------------------------------------------------------
# Requests


def _is_header_safe(text: str) -> bool:
    # Visible ASCII plus space, no CR/LF/TAB: anything else could split or smuggle headers.
    return text.isascii() and text.isprintable()


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
    if not path.startswith("/") or " " in path or not _is_header_safe(path):
        raise WireError(f"request path must be an absolute visible-ASCII path, got {path!r}")
    if not _is_header_safe(host) or not host:
        raise WireError(f"Host header value is not visible ASCII: {host!r}")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Type: {content_type}"]
    for name, value in extra_headers:
        if not _TOKEN.fullmatch(name):
            raise WireError(f"extra header name is not a valid token: {name!r}")
        if not _is_header_safe(value):
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
    content_type = "application/octet-stream"
    ce_lines = b""
    if cloudevents is not None:
        content_type, ce_lines = _binary_mode(record, cloudevents)
    prefix = _request_prefix(host, path, _extra_tuple(extra_headers), content_type)
    topic = record.topic
    delivery_id = record.delivery_id
    if not (_is_header_safe(topic) and _is_header_safe(delivery_id)):
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
            parts.append(b"Kafka-Key: %s\r\nKafka-Key-Encoding: base64\r\n" % base64.b64encode(key))
    if value is None:
        parts.append(b"Kafka-Value-Null: true\r\n")
    for name, header_value in record.headers:
        parts.append(b"Kafka-Header: %s\r\n" % encode_kafka_header(name, header_value).encode())
    if ce_lines:
        parts.append(ce_lines)
    # Trace context comes from record headers a producer wrote, so it is untrusted: a value
    # that could break the header block is dropped rather than forwarded.
    if record.traceparent is not None and _is_header_safe(record.traceparent):
        parts.append(b"traceparent: %s\r\n" % record.traceparent.encode("ascii"))
        if record.tracestate is not None and _is_header_safe(record.tracestate):
            parts.append(b"tracestate: %s\r\n" % record.tracestate.encode("ascii"))
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


_NULL = b"null"
_json_str = json.encoder.encode_basestring_ascii  # C-accelerated: a quoted, escaped JSON string


def _jstr(text: str | None) -> bytes:
    return _NULL if text is None else _json_str(text).encode("ascii")


def _b64json(data: bytes | None) -> bytes:
    # Base64 text needs no JSON escaping, so it goes in between quotes as is.
    return _NULL if data is None else b'"%s"' % base64.b64encode(data)


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
    return _BATCH_ITEM % (
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


# ---------------------------------------------------------------------------------------------
# CloudEvents (app.format: cloudevents)
#
# Checked against the CloudEvents 1.0 HTTP protocol binding (binary mode §3.1, batched mode
# §3.3), the Kafka protocol binding (§3.2: ``ce_<attribute>`` headers with UTF-8 values,
# ``content-type`` for datacontenttype, the key as the ``partitionkey`` extension) and the JSON
# event format (``data_base64`` for binary data, §3.1).

CLOUDEVENTS_SPECVERSION = "1.0"
CLOUDEVENTS_BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
# Attribute names: lower-case ASCII letters and digits (core spec, "Attribute Naming Convention").
_CE_ATTRIBUTE = re.compile(r"[a-z0-9]+")
# HTTP binding §3.1.3.2: space, '"', '%' and everything outside U+0021..U+007E are percent-encoded.
_CE_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')
_CE_HEADER_SAFE_BYTES = _CE_HEADER_SAFE.encode("ascii")
# The core type system's String excludes control characters, surrogates and noncharacters.
_CE_NOT_STRING = re.compile(
    "[\x00-\x1f\x7f-\x9f\ufdd0-\ufdef"
    + "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
    + "]"
)
# Years 1..9999, the range RFC 3339 (and datetime) can write: 0001-01-01 .. 9999-12-31T23:59:59.
_FIRST_SECOND = -62_135_596_800
_LAST_SECOND = 253_402_300_799
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
# RFC 3986: the characters of a URI-reference (unreserved, reserved, '%'), as a delete table.
_URI_REFERENCE_CHARS = str.maketrans(
    dict.fromkeys(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;=%"
    )
)
_CE_NOT_FROM_RECORD = frozenset({"specversion", "data"})
# Extension attributes the sidecar sets on every event of a CloudEvents batch, overriding any a
# record carries: the answer names records by ``deliveryid``.
CLOUDEVENTS_BATCH_EXTENSIONS = (
    "deliveryid",
    "deliverycount",
    "kafkatopic",
    "kafkapartition",
    "kafkaoffset",
)


@dataclass(frozen=True, slots=True)
class CloudEventsFormat:
    """How a record becomes a CloudEvent: the ``source`` and ``type`` attributes.

    Both are templates in which ``{topic}`` is replaced by the record's topic; the caller
    (the configuration) has checked that ``source`` is a URI-reference and ``type`` a String.
    """

    source: str
    type: str


def _ce_string(data: bytes) -> str | None:
    """``data`` as a CloudEvents String, or None when it is not one (bad UTF-8, control chars)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _CE_NOT_STRING.search(text) else text


def cloudevents_time(timestamp_ms: int) -> str | None:
    """A Kafka timestamp as an RFC 3339 UTC time with milliseconds; None outside years 1..9999."""
    seconds, millis = divmod(timestamp_ms, 1000)
    if not _FIRST_SECOND <= seconds <= _LAST_SECOND:
        return None
    # time.gmtime is several times cheaper than datetime arithmetic, and exact on integers.
    tm = time.gmtime(seconds)
    return (
        f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d}T"
        f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{millis:03d}Z"
    )


def is_structured_content_type(content_type: str) -> bool:
    """True for a CloudEvents event format media type (HTTP binding §3: the receiver's test)."""
    return content_type.strip().lower().startswith("application/cloudevents")


def cloudevent_attributes(record: RecordView, cloudevents: CloudEventsFormat) -> dict[str, str]:
    """The CloudEvents context attributes of ``record``, each as its canonical string.

    Derived first: ``specversion`` 1.0, ``id`` ``<topic>/<partition>/<offset>`` (unique per
    record, since a topic name cannot hold ``/``; the same on every redelivery, as a duplicate
    should be), ``source`` and ``type`` from their templates, ``time`` from the record timestamp
    when it has one, and ``partitionkey`` from a key that is a non-empty String. Then every record
    header ``ce_<name>`` (Kafka binding, names case-insensitive) whose value is a valid value of
    that attribute (:func:`_record_attribute_ok`) adds or replaces attribute ``<name>``, the last
    one winning; never ``specversion``: what the sidecar sends is always a 1.0 event. The record's
    ``content-type`` header (or, failing that, a ``ce_datacontenttype`` header) becomes
    ``datacontenttype`` when it is visible ASCII.
    """
    topic = record.topic
    attributes = {
        "specversion": CLOUDEVENTS_SPECVERSION,
        "id": f"{topic}/{record.partition}/{record.offset}",
        "source": cloudevents.source.replace("{topic}", topic),
        "type": cloudevents.type.replace("{topic}", topic),
    }
    if record.timestamp_ms is not None:
        time_text = cloudevents_time(record.timestamp_ms)
        if time_text is not None:
            attributes["time"] = time_text
    if record.key:
        partition_key = _ce_string(record.key)
        if partition_key is not None:
            attributes["partitionkey"] = partition_key
    content_type: str | None = None
    fallback_content_type: str | None = None
    for name, value in record.headers:
        if value is None:
            continue
        lowered = name.lower()
        if lowered == "content-type":
            text = _ce_string(value)
            if text is not None and text.strip() and _is_header_safe(text):
                content_type = text.strip()
            continue
        if not lowered.startswith("ce_"):
            continue
        attribute = lowered[3:]
        text = _ce_string(value)
        if text is None or not _record_attribute_ok(attribute, text):
            continue
        if attribute == "datacontenttype":
            if text.strip() and _is_header_safe(text):
                fallback_content_type = text.strip()
            continue
        attributes[attribute] = text
    content_type = content_type or fallback_content_type
    if content_type is not None:
        attributes["datacontenttype"] = content_type
    return attributes


def _is_rfc3339(text: str) -> bool:
    if not _RFC3339.fullmatch(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.upper())
    except ValueError:
        return False  # a well-shaped but impossible date or time (month 13, second 60)
    return True


def _record_attribute_ok(attribute: str, text: str) -> bool:
    """Whether a record's ``ce_<attribute>`` header may become that attribute.

    A header that would make the event invalid is left out (the derived value stands): an empty
    value, a name that is not an attribute name, the reserved ``data`` and ``specversion``, a
    ``time`` that is not RFC 3339, a ``source``/``dataschema`` that is not a URI-reference.
    """
    if not text or not _CE_ATTRIBUTE.fullmatch(attribute) or attribute in _CE_NOT_FROM_RECORD:
        return False
    if attribute == "time":
        return _is_rfc3339(text)
    if attribute in ("source", "dataschema"):
        return not text.translate(_URI_REFERENCE_CHARS)
    return True


def _ce_header_value(value: str) -> str:
    if value.isascii() and not value.encode("ascii").translate(None, _CE_HEADER_SAFE_BYTES):
        return value  # the common case: nothing to percent-encode
    return quote(value, safe=_CE_HEADER_SAFE)


def _binary_mode(record: RecordView, cloudevents: CloudEventsFormat) -> tuple[str, bytes]:
    """The Content-Type and ``ce-*`` header lines of one record in binary mode.

    A record that already is a structured-mode CloudEvent (its content type is an event format)
    goes through as it is: its Content-Type, and no ``ce-*`` headers to contradict its body.
    """
    attributes = cloudevent_attributes(record, cloudevents)
    content_type = attributes.pop("datacontenttype", None)
    if content_type is not None and is_structured_content_type(content_type):
        if record.value is not None:
            return content_type, b""
        # A null value is no event to pass through; declaring an event format over the empty
        # body would make the receiver parse it as one.
        content_type = None
    lines = [f"ce-{name}: {_ce_header_value(value)}\r\n" for name, value in attributes.items()]
    return content_type or "application/octet-stream", "".join(lines).encode("ascii")


def _structured_event(value: bytes) -> dict[str, object] | None:
    try:
        event = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return cast(dict[str, object], event) if isinstance(event, dict) else None


def _batch_event(record: RecordView, cloudevents: CloudEventsFormat) -> dict[str, object]:
    attributes = cloudevent_attributes(record, cloudevents)
    content_type = attributes.get("datacontenttype")
    event: dict[str, object] | None = None
    if content_type is not None and is_structured_content_type(content_type):
        event = None if record.value is None else _structured_event(record.value)
    if event is None:
        event = dict(attributes)
        if record.value is not None:
            # The value is opaque bytes to the sidecar: JSON format §3.1's Binary data.
            event["data_base64"] = base64.b64encode(record.value).decode("ascii")
    if record.traceparent is not None and _is_header_safe(record.traceparent):
        # The distributed-tracing extension's attributes, as the JSON format carries them.
        event["traceparent"] = record.traceparent
        if record.tracestate is not None and _is_header_safe(record.tracestate):
            event["tracestate"] = record.tracestate
    event["deliveryid"] = record.delivery_id
    event["deliverycount"] = record.delivery_count
    event["kafkatopic"] = record.topic
    event["kafkapartition"] = record.partition
    # An offset may pass the 32-bit range of the CloudEvents Integer type: a String.
    event["kafkaoffset"] = str(record.offset)
    return event


def format_cloudevents_batch_body(
    records: Sequence[RecordView], cloudevents: CloudEventsFormat
) -> bytes:
    """A CloudEvents JSON batch (``application/cloudevents-batch+json``), one event per record.

    Each event has the attributes of :func:`cloudevent_attributes`, the value as ``data_base64``
    (absent for a null value), ``traceparent``/``tracestate``, and the sidecar's extensions
    ``deliveryid`` (what the answer's ``results[].id`` names), ``deliverycount``, ``kafkatopic``,
    ``kafkapartition`` and ``kafkaoffset``. A record that is a structured-mode CloudEvent whose
    value is a JSON object is that event, with the same extensions added.
    """
    events = [_batch_event(record, cloudevents) for record in records]
    return json.dumps(events, separators=(",", ":")).encode("ascii")


# ---------------------------------------------------------------------------------------------
# Answers


def validate_status_mapping(mapping: Mapping[int, str]) -> dict[int, AckWord]:
    """Check a configured status → ack mapping; raise :class:`WireError` on a bad entry."""
    checked: dict[int, AckWord] = {}
    for status, ack in mapping.items():
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise WireError(f"status mapping key must be an HTTP status 100..599, got {status!r}")
        if ack not in _STATUS_ACKS:
            raise WireError(
                f"status mapping for {status}: expected one of "
                f"{', '.join(sorted(_STATUS_ACKS))}, got {ack!r}"
            )
        checked[status] = cast(AckWord, ack)
    return checked


def _header(headers: HeaderList, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def _is_text(content_type: bytes | None) -> bool:
    if content_type is None:
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media.startswith(b"text/") or media.endswith((b"json", b"xml"))


def parse_retry_after_ms(value: bytes | None, now_epoch_s: float | None = None) -> int | None:
    """``Retry-After`` (delay-seconds or HTTP-date) as capped milliseconds; None if unusable."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    # Only ASCII digits: str.isdigit() is also true for '²', which int() refuses.
    if text.isascii() and text.isdigit():
        delay_ms = int(text) * 1000 if len(text) < 10 else MAX_RETRY_AFTER_MS
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        now = time.time() if now_epoch_s is None else now_epoch_s
        try:
            # A naive datetime (zone "-0000") is read as local time, which can overflow.
            delay_s = when.timestamp() - now
        except (OverflowError, OSError, ValueError):
            return None
        delay_ms = max(0, math.ceil(delay_s * 1000))
    return min(delay_ms, MAX_RETRY_AFTER_MS)


def _status_error(status: int, content_type: bytes | None, body: bytes) -> AppError:
    if _is_text(content_type):
        message = body[: _STATUS_MESSAGE_CHARS * 4].decode("utf-8", "replace")
        message = message[:_STATUS_MESSAGE_CHARS].strip()
    else:
        kind = content_type.split(b";", 1)[0].strip().decode("latin-1") if content_type else ""
        message = f"{len(body)} bytes of {kind}"
    return AppError(f"sidecar.HttpStatus{status}", message or f"HTTP status {status}")


def _status_ack(status: int, mapping: Mapping[int, str]) -> AckWord:
    mapped = mapping.get(status)
    if mapped is not None:
        if mapped not in _STATUS_ACKS:
            raise WireError(f"status mapping for {status} names unknown ack {mapped!r}")
        return cast(AckWord, mapped)
    if status == 202:
        return "deferred"
    if 200 <= status < 300:
        return "accept"
    if status in (400, 422):
        return "reject"
    return "release"


class _Malformed(Exception):
    """A JSON answer that does not follow the contract; the message names the field."""


def _malformed_answer(reason: str) -> Answer:
    return Answer("release", AppError(MALFORMED_ANSWER, reason), reason=reason)


def _is_encodable(text: str) -> bool:
    """True when `text` has a UTF-8 encoding (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked_text(text: str, where: str) -> str:
    if not _is_encodable(text):
        raise _Malformed(f"{where} is not valid Unicode text (a lone surrogate)")
    return text


def _parse_error(obj: object, where: str) -> AppError | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise _Malformed(f"{where}.error must be an object")
    fields: list[str] = []
    for field in ("class", "message"):
        text = obj.get(field, "")
        if not isinstance(text, str):
            raise _Malformed(f"{where}.error.{field} must be a string")
        fields.append(_checked_text(text, f"{where}.error.{field}"))
    stacktrace = obj.get("stacktrace")
    if stacktrace is not None:
        if not isinstance(stacktrace, str):
            raise _Malformed(f"{where}.error.stacktrace must be a string or null")
        _checked_text(stacktrace, f"{where}.error.stacktrace")
    return AppError(fields[0], fields[1], stacktrace)


def _parse_retry_after(obj: object, where: str) -> int | None:
    if obj is None:
        return None
    if isinstance(obj, bool) or not isinstance(obj, int | float) or not math.isfinite(obj):
        raise _Malformed(f"{where}.retry_after_ms must be a number")
    if obj < 0:
        raise _Malformed(f"{where}.retry_after_ms must not be negative")
    return min(math.ceil(obj), MAX_RETRY_AFTER_MS)


def _parse_dlq(obj: object, where: str) -> tuple[tuple[tuple[str, bytes], ...], bytes | None, bool]:
    if obj is None:
        return (), None, False
    if not isinstance(obj, dict):
        raise _Malformed(f"{where}.dlq must be an object")
    raw_headers = obj.get("headers", {})
    if not isinstance(raw_headers, dict):
        raise _Malformed(f"{where}.dlq.headers must be an object of strings")
    headers: list[tuple[str, bytes]] = []
    for name, value in raw_headers.items():
        # repr() escapes a lone surrogate, so the reason itself stays encodable.
        field = f"{where}.dlq.headers[{name!r}]"
        if not isinstance(value, str):
            raise _Malformed(f"{field} must be a string")
        _checked_text(name, f"{field} (the name)")
        try:
            headers.append((name, value.encode("utf-8")))
        except UnicodeEncodeError:
            raise _Malformed(f"{field} is not valid Unicode text (a lone surrogate)") from None
    if "value_b64" not in obj:
        return tuple(headers), None, False
    encoded = obj["value_b64"]
    if encoded is None:
        return tuple(headers), None, True
    if not isinstance(encoded, str):
        raise _Malformed(f"{where}.dlq.value_b64 must be a base64 string or null")
    try:
        value = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _Malformed(f"{where}.dlq.value_b64 is not valid base64") from exc
    return tuple(headers), value, True


def _answer_from_object(
    obj: dict[str, object], where: str, fallback: AckWord, fallback_error: AppError | None
) -> Answer:
    """An Answer from one JSON answer object; ``fallback`` applies when it has no ``ack``."""
    error = _parse_error(obj.get("error"), where)
    retry_after_ms = _parse_retry_after(obj.get("retry_after_ms"), where)
    ack_word = obj.get("ack")
    if ack_word is None:
        ack: AckWord = fallback
        reason = f"status ({fallback})"
    elif not isinstance(ack_word, str) or ack_word not in ANSWER_ACKS:
        raise _Malformed(f"{where}.ack names an unknown ack {ack_word!r}")
    else:
        ack = cast(AckWord, ack_word)
        reason = f"JSON ack {ack}"
    dlq_headers, dlq_value, dlq_value_set = _parse_dlq(obj.get("dlq"), where)
    if error is None and ack != "accept":
        # A JSON release under a 5xx without its own error still says what went wrong.
        error = fallback_error
    return Answer(
        ack,
        error,
        retry_after_ms,
        dlq_headers,
        dlq_value,
        dlq_value_set,
        reason,
    )


def _load_json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _Malformed(f"invalid JSON: {exc}") from exc


def interpret_single(
    status: int,
    headers: HeaderList,
    body: bytes,
    mapping: Mapping[int, str] | None = None,
    *,
    now_epoch_s: float | None = None,
) -> Answer:
    """Turn the app's HTTP answer to a single-mode delivery into an :class:`Answer`.

    Precedence (SPEC §5): a JSON body's ``ack`` wins; else the status (after ``mapping``).
    A body declared as JSON that does not parse, is not an object, or names an unknown ack is
    a release with a ``sidecar.MalformedAnswer`` error — never an accept, whatever the status.
    An empty body is no body, whatever its Content-Type.
    """
    status_ack = _status_ack(status, mapping or {})
    content_type = _header(headers, b"content-type")
    status_error = None if 200 <= status < 300 else _status_error(status, content_type, body)
    retry_after_ms = None
    if status in (429, 503) and status_ack == "release":
        retry_after_ms = parse_retry_after_ms(_header(headers, b"retry-after"), now_epoch_s)
    if _is_json(content_type) and body.strip():
        try:
            obj = _load_json(body)
            if not isinstance(obj, dict):
                raise _Malformed(f"answer must be a JSON object, got {type(obj).__name__}")
            answer = _answer_from_object(obj, "answer", status_ack, status_error)
        except _Malformed as exc:
            return _malformed_answer(f"{exc} under status {status}")
        if answer.retry_after_ms is None and retry_after_ms is not None:
            answer = _with_retry_after(answer, retry_after_ms)
        return answer
    reason = f"status {status}"
    if mapping and status in mapping:
        reason = f"status {status} mapped to {status_ack}"
    return Answer(status_ack, status_error, retry_after_ms, reason=reason)


def _with_retry_after(answer: Answer, retry_after_ms: int) -> Answer:
    return Answer(
        answer.ack,
        answer.error,
        retry_after_ms,
        answer.dlq_headers,
        answer.dlq_value,
        answer.dlq_value_set,
        answer.reason,
    )


def interpret_batch(
    status: int,
    headers: HeaderList,
    body: bytes,
    ids: Iterable[str],
    mapping: Mapping[int, str] | None = None,
    *,
    now_epoch_s: float | None = None,
) -> dict[str, Answer]:
    """Turn the app's answer to a batch delivery into one :class:`Answer` per delivery id.

    A 2xx JSON body ``{"results": [...]}`` answers per record; a record it does not list is
    released; an entry with a bad ack releases only that record; an unknown id is ignored and
    the first entry for a repeated id wins. Without a JSON body the status answers for all
    (2xx accept, 202 deferred, 400/422 reject, else release). A malformed body releases all.
    """
    wanted = list(ids)
    whole = interpret_single(status, headers, b"", mapping, now_epoch_s=now_epoch_s)
    content_type = _header(headers, b"content-type")
    if not (200 <= status < 300 and _is_json(content_type) and body.strip()):
        if not 200 <= status < 300:
            whole = Answer(
                whole.ack,
                _status_error(status, content_type, body),
                whole.retry_after_ms,
                reason=whole.reason,
            )
        return dict.fromkeys(wanted, whole)
    try:
        obj = _load_json(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("results"), list):
            raise _Malformed("batch answer must be an object with a 'results' list")
        results = cast(list[object], obj["results"])
    except _Malformed as exc:
        return dict.fromkeys(wanted, _malformed_answer(f"{exc} under status {status}"))
    wanted_set = set(wanted)
    answers: dict[str, Answer] = {}
    for index, entry in enumerate(results):
        where = f"results[{index}]"
        if not isinstance(entry, dict):
            continue
        delivery_id = entry.get("id")
        if not isinstance(delivery_id, str) or delivery_id not in wanted_set:
            continue
        if delivery_id in answers:
            continue
        try:
            if "ack" not in entry:
                raise _Malformed(f"{where}.ack is missing")
            answers[delivery_id] = _answer_from_object(entry, where, "release", None)
        except _Malformed as exc:
            answers[delivery_id] = _malformed_answer(str(exc))
    missing = Answer("release", reason="missing from the batch answer")
    return {delivery_id: answers.get(delivery_id, missing) for delivery_id in wanted}


# ---------------------------------------------------------------------------------------------
# The sidecar's own ack API


def parse_ack_request(body: bytes) -> list[AckItem]:
    """Parse a ``POST /v1/acks`` body: ``{"acks": [item, ...]}`` or a bare ``[item, ...]``.

    Each item is ``{"id", "ack": accept|release|reject|renew, "error"?, "retry_after_ms"?,
    "dlq"?}``. Raises :class:`WireError` naming the first bad field.
    """
    try:
        obj = _load_json(body)
    except _Malformed as exc:
        raise WireError(str(exc)) from None
    if isinstance(obj, dict):
        if "acks" not in obj:
            raise WireError("ack request must be an object with an 'acks' list, or a list")
        obj = obj["acks"]
        prefix = "acks"
    else:
        prefix = ""
    if not isinstance(obj, list):
        raise WireError("'acks' must be a list")
    items: list[AckItem] = []
    for index, entry in enumerate(obj):
        where = f"{prefix}[{index}]"
        if not isinstance(entry, dict):
            raise WireError(f"{where} must be an object")
        delivery_id = entry.get("id")
        if not isinstance(delivery_id, str) or not delivery_id:
            raise WireError(f"{where}.id must be a non-empty string")
        if not _is_encodable(delivery_id):
            raise WireError(f"{where}.id is not valid Unicode text (a lone surrogate)")
        ack = entry.get("ack")
        if not isinstance(ack, str) or ack not in ACK_REQUEST_WORDS:
            raise WireError(
                f"{where}.ack must be one of {', '.join(sorted(ACK_REQUEST_WORDS))}, got {ack!r}"
            )
        try:
            error = _parse_error(entry.get("error"), where)
            retry_after_ms = _parse_retry_after(entry.get("retry_after_ms"), where)
            dlq_headers, dlq_value, dlq_value_set = _parse_dlq(entry.get("dlq"), where)
        except _Malformed as exc:
            raise WireError(str(exc)) from None
        items.append(
            AckItem(
                delivery_id,
                cast(AckRequestWord, ack),
                error,
                retry_after_ms,
                dlq_headers,
                dlq_value,
                dlq_value_set,
            )
        )
    return items


def format_ack_response(results: Iterable[tuple[str, str]]) -> bytes:
    """The ``POST /v1/acks`` response body: one ``{"id", "result": ok|unknown|expired}`` each."""
    return json.dumps(
        {"results": [{"id": delivery_id, "result": result} for delivery_id, result in results]},
        separators=(",", ":"),
    ).encode("utf-8")
