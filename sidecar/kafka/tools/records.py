"""A record read back by the operator tools, copied out of librdkafka's `Message`.

The tools above `sidecar.kafka` see this frozen value, never a `Message`: what they may read is its
fields, and no librdkafka method is called on it after the read. Pure once built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """One record of a topic as read: coordinates, timestamp (ms), key, value, headers in order."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    @classmethod
    def of(cls, msg: Any) -> ReadRecord:
        """Copy a confluent-kafka `Message` that carries a record (not an error event)."""
        return cls(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            timestamp_ms=msg.timestamp()[1],
            key=msg.key(),
            value=msg.value(),
            headers=tuple(msg.headers() or ()),
        )


__all__ = ["Header", "ReadRecord"]
