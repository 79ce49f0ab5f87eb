"""One record read back from a DLQ topic, with its context decoded whichever system wrote it (docs/dlq-operations.md).

Owns `DlqEntry` (the writer's format and the fields every format shares, decoded by
`sidecar.ops.dlq.formats`), its JSON form for `dlq inspect --json`, and the names of the
`__dlq.replay.*` markers a replay adds. Pure: no broker calls.

Imports: the standard library, the header names of `sidecar.kafka.dlq`, the record type of
`sidecar.kafka.tools` and `sidecar.ops.dlq.formats`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sidecar.kafka.dlq import H_COPY_DROPPED, REPLAY_HEADER_PREFIX
from sidecar.kafka.tools.records import ReadRecord
from sidecar.ops.dlq.formats import (
    FORMAT_DLQ,
    FORMAT_UNKNOWN,
    DlqContext,
    decode_context,
    strip_context,
)

H_REPLAY_NAME = REPLAY_HEADER_PREFIX + "name"
H_REPLAY_FROM = REPLAY_HEADER_PREFIX + "from"
H_REPLAY_COUNT = REPLAY_HEADER_PREFIX + "count"
# Who asked for the replay and when (the console's redrive sets them; `dlq replay --by` too).
H_REPLAY_BY = REPLAY_HEADER_PREFIX + "by"
H_REPLAY_AT = REPLAY_HEADER_PREFIX + "at"


Header = tuple[str, bytes | None]


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def int_or_none(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def encode_bytes(value: bytes | None) -> dict[str, Any] | None:
    """Bytes for JSON output: UTF-8 text when it is valid UTF-8, else base64; None stays null."""
    if value is None:
        return None
    try:
        return {"text": value.decode("utf-8"), "size": len(value)}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode(), "size": len(value)}


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One record read from a DLQ topic, with its context decoded (`context`, from its headers)."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    # The value decoded through a Schema Registry (`sidecar.ops.dlq.payloads.Payload`), when the
    # command reads schemas; set by the reader that decoded it.
    payload: Any = field(default=None, repr=False, compare=False)
    # Why a headers-only record's payload is gone from its source topic (`sidecar.ops.dlq.originals`),
    # set by the reader that checked; None: not checked, or still there.
    payload_gone: str | None = field(default=None, repr=False, compare=False)
    context: DlqContext = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "context", decode_context(self.headers))

    def header(self, name: str) -> bytes | None:
        """The last value of a header (the DLQ writer's context headers come last)."""
        found: bytes | None = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    @property
    def format(self) -> str:
        """Which system wrote the record: `dlq`, `streams`, `connect`, `spring` or `unknown`."""
        return self.context.format

    @property
    def source_topic(self) -> str | None:
        return self.context.source_topic

    @property
    def source_partition(self) -> int | None:
        return self.context.source_partition

    @property
    def source_offset(self) -> int | None:
        return self.context.source_offset

    @property
    def delivery_count(self) -> int | None:
        return self.context.delivery_count

    @property
    def exception_class(self) -> str | None:
        return self.context.exception_class

    @property
    def exception_message(self) -> str | None:
        return self.context.exception_message

    @property
    def cause(self) -> str | None:
        return self.context.cause

    @property
    def group(self) -> str | None:
        return self.context.group

    @property
    def reason(self) -> str | None:
        return self.context.reason

    @property
    def replay_count(self) -> int:
        return int_or_none(self.header(H_REPLAY_COUNT)) or 0

    @property
    def is_dlq_record(self) -> bool:
        """True when a known writer's context headers are there (the source may still be unnamed)."""
        return self.context.format != FORMAT_UNKNOWN

    @property
    def headers_only(self) -> bool:
        """True when the DLQ record does not hold the original record (copy off, or dropped as too large).

        A copied record always has a key or a value unless the original was a keyless tombstone; that
        one reads back the same from the source topic, so treating it as headers-only loses nothing.
        (Kafka Streams writes null key and value for a failure with no input record, a punctuator's.)
        """
        dropped = self.context.format == FORMAT_DLQ and self.header(H_COPY_DROPPED) is not None
        return dropped or (self.key is None and self.value is None)

    def original_headers(self) -> list[Header]:
        """The copied original headers: all but the writer's context headers (ours: the whole `__dlq.*`
        namespace) and the old replay markers, order and repeats kept."""
        return strip_context(self.headers, self.context.format)

    def coordinates(self) -> str:
        return f"{self.dlq_topic}/{self.dlq_partition}/{self.dlq_offset}"

    def to_json(self) -> dict[str, Any]:
        out = self._json()
        payload = self.payload
        if payload is not None:
            out.update(payload.to_json())
            if payload.hide_bytes:
                # Redacted fields would still be readable in the raw bytes.
                out["value"] = {"redacted": True, "size": len(self.value or b"")}
        return out

    def _json(self) -> dict[str, Any]:
        return {
            "dlq_topic": self.dlq_topic,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "timestamp_ms": self.timestamp_ms,
            "timestamp": _iso(self.timestamp_ms),
            "format": self.format,
            "writer": self.context.writer,
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "group": self.group,
            "delivery_count": self.delivery_count,
            "exception_class": self.exception_class,
            "exception_message": self.exception_message,
            "cause_class": self.context.cause_class,
            "cause": self.cause,
            "detail": self.context.detail,
            "source_timestamp_ms": self.context.source_timestamp_ms,
            "headers_only": self.headers_only,
            "payload_gone": self.payload_gone,
            "replay_count": self.replay_count,
            "replay_name": _text(self.header(H_REPLAY_NAME)),
            "key": encode_bytes(self.key),
            "value": encode_bytes(self.value),
            "headers": [{"name": n, "value": encode_bytes(v)} for n, v in self.headers],
        }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def entry_from_record(record: ReadRecord) -> DlqEntry:
    return DlqEntry(
        dlq_topic=record.topic,
        dlq_partition=record.partition,
        dlq_offset=record.offset,
        timestamp_ms=record.timestamp_ms,
        key=record.key,
        value=record.value,
        headers=record.headers,
    )
