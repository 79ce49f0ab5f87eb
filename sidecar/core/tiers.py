"""Retry tiers, sans-IO: the headers a tier record carries, and the original read back from them.

Owns `TierWrite` (the ``__dlq.retry.*`` headers, listed in its docstring) and
:func:`read_tier_record` (a tier record back to its original, count, trail and last error).

Pure: no Kafka, no clock; imports only `sidecar.core`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.outcome import ErrorInfo
from sidecar.core.record import Header, SourceRecord, TierTrail

__all__ = [
    "RETRY_HEADER_PREFIX",
    "TIERS_HEADER",
    "TierRead",
    "TierWrite",
    "read_tier_record",
    "tier_headers",
]

RETRY_HEADER_PREFIX = "__dlq.retry."
H_TOPIC = RETRY_HEADER_PREFIX + "topic"
H_PARTITION = RETRY_HEADER_PREFIX + "partition"
H_OFFSET = RETRY_HEADER_PREFIX + "offset"
H_TIMESTAMP = RETRY_HEADER_PREFIX + "timestamp"
H_TIMESTAMP_TYPE = RETRY_HEADER_PREFIX + "timestamp.type"
H_COUNT = RETRY_HEADER_PREFIX + "delivery.count"
H_DUE = RETRY_HEADER_PREFIX + "due"
H_TIERS = RETRY_HEADER_PREFIX + "tiers"
H_GROUP = RETRY_HEADER_PREFIX + "group"
H_EXC_CLASS = RETRY_HEADER_PREFIX + "exception.class.name"
H_EXC_MESSAGE = RETRY_HEADER_PREFIX + "exception.message"
#: On a DLQ record: the tiers the record went through before it was dead-lettered.
TIERS_HEADER = "__dlq.errors.retry.tiers"

_MESSAGE_MAX_BYTES = 16384


@dataclass(frozen=True, slots=True)
class TierWrite:
    """What makes a write a tier write (`FailedRecord.tier`): its due time and trail.

    A release whose delay is above `errors.retry.tier.threshold.ms` is written to a tier topic (the
    smallest fixed delay that covers it). The tier record is the original's key, value and headers,
    plus the `__dlq.retry.*` headers below (UTF-8 strings, numbers in decimal) that say where it comes
    from and when it is due::

        __dlq.retry.topic / .partition / .offset     the original's coordinates
        __dlq.retry.timestamp / .timestamp.type      the original's timestamp (epoch ms; create, log-append, none)
        __dlq.retry.delivery.count                   deliveries so far
        __dlq.retry.due                              epoch ms: not delivered before (write time + the tier's delay)
        __dlq.retry.tiers                            the tiers passed, comma-separated labels (1m,10m)
        __dlq.retry.group                            the consumer or share group that wrote it
        __dlq.retry.exception.class.name / .message  the last release's error, when it gave one
    """

    due_ms: int
    tiers: tuple[str, ...]  # the tiers passed, this one last
    timestamp_ms: int | None
    timestamp_type: str


@dataclass(frozen=True, slots=True)
class TierRead:
    """A tier record read back: the original, its count so far, the trail, the last error."""

    record: SourceRecord
    delivery_count: int
    trail: TierTrail
    error: ErrorInfo | None
    group: str | None  # the group that wrote it


def tier_headers(
    *,
    topic: str,
    partition: int,
    offset: int,
    headers: tuple[Header, ...],
    group: str,
    delivery_count: int,
    tier: TierWrite,
    error_class: str | None,
    error_message: str | None,
) -> tuple[Header, ...]:
    """The tier record's headers: the original's (without an earlier tier's), then ours."""
    out: list[Header] = [(n, v) for n, v in headers if not n.startswith(RETRY_HEADER_PREFIX)]
    out += [
        (H_TOPIC, topic.encode("utf-8", "replace")),
        (H_PARTITION, str(partition).encode()),
        (H_OFFSET, str(offset).encode()),
        (H_COUNT, str(delivery_count).encode()),
        (H_DUE, str(tier.due_ms).encode()),
        (H_TIERS, ",".join(tier.tiers).encode()),
        (H_GROUP, group.encode("utf-8", "replace")),
        (H_TIMESTAMP_TYPE, tier.timestamp_type.encode()),
    ]
    if tier.timestamp_ms is not None:
        out.append((H_TIMESTAMP, str(tier.timestamp_ms).encode()))
    if error_class:
        out.append((H_EXC_CLASS, error_class.encode("utf-8", "replace")))
    if error_message:
        data = error_message.encode("utf-8", "replace")[:_MESSAGE_MAX_BYTES]
        out.append((H_EXC_MESSAGE, data.decode("utf-8", "ignore").encode()))
    return tuple(out)


def _int(value: bytes | None) -> int | None:
    if value is None or not value.isdigit() or len(value) > 19:
        return None
    return int(value)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def read_tier_record(tier_record: SourceRecord) -> TierRead | None:
    """The original behind a tier record, or None when it lacks our headers (not one of ours)."""
    ours: dict[str, bytes | None] = {}
    own: list[Header] = []
    for name, value in tier_record.headers:
        if name.startswith(RETRY_HEADER_PREFIX):
            ours[name] = value
        else:
            own.append((name, value))
    topic = _text(ours.get(H_TOPIC))
    partition = _int(ours.get(H_PARTITION))
    offset = _int(ours.get(H_OFFSET))
    count = _int(ours.get(H_COUNT))
    due = _int(ours.get(H_DUE))
    if not topic or partition is None or offset is None or count is None or due is None:
        return None
    tiers_text = _text(ours.get(H_TIERS)) or ""
    traceparent = tracestate = None
    for name, value in own:
        if name == "traceparent" and value is not None:
            traceparent = value.decode("latin-1")
        elif name == "tracestate" and value is not None:
            tracestate = value.decode("latin-1")
    original = SourceRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        key=tier_record.key,
        value=tier_record.value,
        headers=tuple(own),
        timestamp_ms=_int(ours.get(H_TIMESTAMP)),
        timestamp_type=_text(ours.get(H_TIMESTAMP_TYPE)) or "none",
        traceparent=traceparent,
        tracestate=tracestate,
    )
    error_class = _text(ours.get(H_EXC_CLASS))
    error_message = _text(ours.get(H_EXC_MESSAGE))
    error = ErrorInfo(error_class, error_message) if error_class or error_message else None
    trail = TierTrail(
        tuple(t for t in tiers_text.split(",") if t),
        tier_record.topic,
        tier_record.partition,
        tier_record.offset,
        due,
    )
    return TierRead(original, count, trail, error, _text(ours.get(H_GROUP)))
