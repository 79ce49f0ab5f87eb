"""`app.format: cloudevents`: binary mode for one record, the JSON batch format for many.

Pure functions and frozen values (see `sidecar.core.wire`).
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

from sidecar.core.wire.values import RecordView, is_header_safe

__all__ = [
    "CLOUDEVENTS_BATCH_CONTENT_TYPE",
    "CLOUDEVENTS_BATCH_EXTENSIONS",
    "CLOUDEVENTS_SPECVERSION",
    "CloudEventsFormat",
    "cloudevent_attributes",
    "cloudevents_time",
    "format_cloudevents_batch_body",
    "is_structured_content_type",
]

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
            if text is not None and text.strip() and is_header_safe(text):
                content_type = text.strip()
            continue
        if not lowered.startswith("ce_"):
            continue
        attribute = lowered[3:]
        text = _ce_string(value)
        if text is None or not _record_attribute_ok(attribute, text):
            continue
        if attribute == "datacontenttype":
            if text.strip() and is_header_safe(text):
                fallback_content_type = text.strip()
            continue
        attributes[attribute] = text
    content_type = content_type or fallback_content_type
    if content_type is not None:
        attributes["datacontenttype"] = content_type
    schema = record.value_schema
    if schema is not None:
        # Decoded through a Schema Registry: the data is JSON now, and the schema is named in
        # extension attributes (the registry's URL may carry credentials: no `dataschema`).
        attributes["datacontenttype"] = "application/json"
        attributes["schemaid"] = str(schema.schema_id)
        attributes["schematype"] = schema.schema_type
        if schema.subject:
            attributes["schemasubject"] = schema.subject
            attributes["schemaversion"] = str(schema.version)
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


def binary_mode(record: RecordView, cloudevents: CloudEventsFormat) -> tuple[str, bytes]:
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
        if record.value is not None and record.value_schema is not None:
            event["data"] = json.loads(record.value)  # decoded through a Schema Registry: JSON
        elif record.value is not None:
            # The value is opaque bytes to the sidecar: JSON format §3.1's Binary data.
            event["data_base64"] = base64.b64encode(record.value).decode("ascii")
    if record.traceparent is not None and is_header_safe(record.traceparent):
        # The distributed-tracing extension's attributes, as the JSON format carries them.
        event["traceparent"] = record.traceparent
        if record.tracestate is not None and is_header_safe(record.tracestate):
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
