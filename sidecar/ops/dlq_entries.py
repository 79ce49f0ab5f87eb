"""One record read back from a DLQ topic, with its `__dlq.*` context decoded (SPEC §10).

Owns `DlqEntry` (source coordinates, delivery count, exception, cause, replay markers, whether the
original record is held or only its headers), its JSON form for `dlq inspect --json` (bytes as UTF-8
text or base64), and the names of the `__dlq.replay.*` markers a replay adds. Pure: no broker calls.

Imports: the standard library and the header names of `sidecar.kafka.dlq` only.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sidecar.kafka.dlq import (
    DLQ_HEADER_PREFIX,
    H_COPY_DROPPED,
    H_DELIVERY_COUNT,
    H_EXC_CLASS,
    H_EXC_MESSAGE,
    H_GROUP,
    H_MESSAGE,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    REPLAY_HEADER_PREFIX,
)

H_REPLAY_NAME = REPLAY_HEADER_PREFIX + "name"
H_REPLAY_FROM = REPLAY_HEADER_PREFIX + "from"
H_REPLAY_COUNT = REPLAY_HEADER_PREFIX + "count"


Header = tuple[str, bytes | None]


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _int(value: bytes | None) -> int | None:
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
    """One record read from a DLQ topic, with its `__dlq.*` context decoded."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    def header(self, name: str) -> bytes | None:
        """The last value of a header (the DLQ writer's context headers come last)."""
        found: bytes | None = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    @property
    def source_topic(self) -> str | None:
        return _text(self.header(H_TOPIC))

    @property
    def source_partition(self) -> int | None:
        return _int(self.header(H_PARTITION))

    @property
    def source_offset(self) -> int | None:
        return _int(self.header(H_OFFSET))

    @property
    def delivery_count(self) -> int | None:
        return _int(self.header(H_DELIVERY_COUNT))

    @property
    def exception_class(self) -> str | None:
        return _text(self.header(H_EXC_CLASS))

    @property
    def exception_message(self) -> str | None:
        return _text(self.header(H_EXC_MESSAGE))

    @property
    def cause(self) -> str | None:
        return _text(self.header(H_MESSAGE))

    @property
    def replay_count(self) -> int:
        return _int(self.header(H_REPLAY_COUNT)) or 0

    @property
    def is_dlq_record(self) -> bool:
        return self.source_topic is not None and self.source_partition is not None

    @property
    def headers_only(self) -> bool:
        """True when the DLQ record does not hold the original record (copy off, or dropped as too large).

        A copied record always has a key or a value unless the original was a keyless tombstone; that
        one reads back the same from the source topic, so treating it as headers-only loses nothing.
        """
        return self.header(H_COPY_DROPPED) is not None or (self.key is None and self.value is None)

    def original_headers(self) -> list[Header]:
        """The copied original headers: everything but our own `__dlq.*` namespace, order and repeats kept."""
        return [(n, v) for n, v in self.headers if not n.startswith(DLQ_HEADER_PREFIX)]

    def coordinates(self) -> str:
        return f"{self.dlq_topic}/{self.dlq_partition}/{self.dlq_offset}"

    def to_json(self) -> dict[str, Any]:
        return {
            "dlq_topic": self.dlq_topic,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "timestamp_ms": self.timestamp_ms,
            "timestamp": _iso(self.timestamp_ms),
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "group": _text(self.header(H_GROUP)),
            "delivery_count": self.delivery_count,
            "exception_class": self.exception_class,
            "exception_message": self.exception_message,
            "cause": self.cause,
            "headers_only": self.headers_only,
            "replay_count": self.replay_count,
            "replay_name": _text(self.header(H_REPLAY_NAME)),
            "key": encode_bytes(self.key),
            "value": encode_bytes(self.value),
            "headers": [{"name": n, "value": encode_bytes(v)} for n, v in self.headers],
        }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def entry_from_message(msg: Any) -> DlqEntry:
    return DlqEntry(
        dlq_topic=msg.topic(),
        dlq_partition=msg.partition(),
        dlq_offset=msg.offset(),
        timestamp_ms=msg.timestamp()[1],
        key=msg.key(),
        value=msg.value(),
        headers=tuple(msg.headers() or ()),
    )
