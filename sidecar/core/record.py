"""One consumed record as the sidecar carries it, and the grammar of delivery ids (sans-IO).

Owns :class:`SourceRecord` (a Kafka message read **once** at intake, :func:`source_record`, and
carried through every attempt and the DLQ record), :class:`Tracked` (what the sidecar learns
about a record while in its care, :class:`Decoded` included, kept with it), and delivery ids
(:func:`new_delivery_id`, whose docstring has the grammar; :func:`is_delivery_id`; :class:`LiveIds`).

Pure: no trio, no Kafka client (a message is read through a small protocol), no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import string
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

from sidecar.core.wire.values import SchemaRef

__all__ = [
    "DELIVERY_ID_BYTES",
    "CustomDeadLetter",
    "Decoded",
    "LiveIds",
    "MessageLike",
    "SourceRecord",
    "TierTrail",
    "Tracked",
    "custom_dead_letter",
    "is_delivery_id",
    "new_delivery_id",
    "source_record",
]

Header = tuple[str, bytes | None]

_TIMESTAMP_TYPES = {0: "none", 1: "create", 2: "log-append"}

#: Random bytes in a delivery id (128 bits: at least 96 make an id unguessable).
DELIVERY_ID_BYTES = 16
_ID_CHARS = len(base64.urlsafe_b64encode(bytes(DELIVERY_ID_BYTES)).rstrip(b"="))
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_ID_ALPHABET = frozenset(string.ascii_letters + string.digits + "-_")
_IDS_PER_FETCH = 256
# How many answered ids are remembered, so a second answer for one says `already` (not `expired`).
ANSWERED_REMEMBERED = 8192


def new_delivery_id(random_bytes: Callable[[int], bytes]) -> str:
    """A fresh delivery id from ``random_bytes(n)`` (``secrets.token_bytes`` in the engine).

    Delivery ids (``Kafka-Delivery-Id``, the ``id`` of ``POST /v1/acks``)::

        delivery-id = 22 * id-char                     ; 128 random bits, base64url without padding
        id-char     = ALPHA / DIGIT / "-" / "_"

    A new id per attempt, drawn from the operating system's random source by the caller: nothing in an
    id (no topic, offset, epoch or sequence number) lets anyone who sees one id guess another.
    """
    raw = random_bytes(DELIVERY_ID_BYTES)
    if len(raw) != DELIVERY_ID_BYTES:
        raise ValueError(f"random_bytes returned {len(raw)} bytes, not {DELIVERY_ID_BYTES}")
    # binascii directly (base64.urlsafe_b64encode is two Python wrappers around it): one id per
    # delivery.
    return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).rstrip(b"=").decode("ascii")


def is_delivery_id(text: str) -> bool:
    """Whether ``text`` has the shape of a delivery id (whoever issued it, whenever)."""
    return len(text) == _ID_CHARS and _ID_ALPHABET.issuperset(text)


T = TypeVar("T")


class LiveIds(Generic[T]):
    """The live attempts by delivery id, and the answer for an id that is not live.

    An id that is not live answers `already` when it was answered (one of the last
    `ANSWERED_REMEMBERED`), `expired` when it has the shape of our ids (lock expired, fenced, issued
    before a restart, answered longer ago — or guessed) and `unknown` otherwise: nothing tells a
    spent id from a guessed one, and `already` needs the id itself (128 random bits), so the
    answers reveal nothing about other ids.
    """

    def __init__(self, random_bytes: Callable[[int], bytes]) -> None:
        self._random_bytes = random_bytes
        self._live: dict[str, T] = {}
        # Random bytes for the next ids, fetched `_IDS_PER_FETCH` ids at a time (one system call
        # per fetch, not per id), and how many of them are used.
        self._pool = b""
        self._used = 0
        # Answered ids (a set to look up, a deque oldest first to forget), at most
        # ANSWERED_REMEMBERED.  Not a dict used as a queue: taking its first key scans the slots its
        # deletions left at the front, which grows with the number remembered.
        self._answered: set[str] = set()
        self._answered_order: deque[str] = deque()

    def _take(self, n: int) -> bytes:
        if self._used + n > len(self._pool):
            self._pool = self._random_bytes(n * _IDS_PER_FETCH)
            self._used = 0
        start = self._used
        self._used = start + n
        return self._pool[start : start + n]

    def issue(self, value_for: Callable[[str], T]) -> T:
        """A fresh id, and the value made for it, live from now on."""
        delivery_id = new_delivery_id(self._take)
        while delivery_id in self._live:  # 2**-128 per pair: only a broken random source repeats
            delivery_id = new_delivery_id(self._take)
        value = value_for(delivery_id)
        self._live[delivery_id] = value
        return value

    def get(self, delivery_id: str) -> T | None:
        return self._live.get(delivery_id)

    def retire(self, delivery_id: str, value: T) -> None:
        """`value`'s attempt is over (only if it is still the one live under the id)."""
        if self._live.get(delivery_id) is value:
            del self._live[delivery_id]

    def answered(self, delivery_id: str) -> None:
        """The app answered `delivery_id`: another answer for it says `already`."""
        answered = self._answered
        if delivery_id in answered:
            return
        answered.add(delivery_id)
        order = self._answered_order
        order.append(delivery_id)
        if len(order) > ANSWERED_REMEMBERED:
            answered.discard(order.popleft())

    def not_live_answer(self, delivery_id: str) -> Literal["already", "expired", "unknown"]:
        if delivery_id in self._answered:
            return "already"
        return "expired" if is_delivery_id(delivery_id) else "unknown"

    def __len__(self) -> int:
        return len(self._live)


class MessageLike(Protocol):
    """The slice of confluent-kafka's ``Message`` a record is read from."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> Any: ...
    def value(self) -> Any: ...
    def headers(self) -> Any: ...
    def timestamp(self) -> tuple[int, int]: ...


class SourceRecord(NamedTuple):
    """A consumed record, read once: everything an attempt, a DLQ record or a log line needs.

    Immutable; a named tuple because one is built per consumed record (on the hot path), several
    times faster than a frozen dataclass of ten fields.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int | None
    timestamp_type: str  # "create" | "log-append" | "none"
    traceparent: str | None = None
    tracestate: str | None = None

    @property
    def coordinates(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset


def _as_bytes(data: Any) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _headers(raw: Any) -> tuple[Header, ...]:
    if not raw:
        return ()
    items: Sequence[tuple[Any, Any]] = list(raw.items()) if isinstance(raw, dict) else raw
    return tuple((str(name), _as_bytes(value)) for name, value in items)


def source_record(msg: MessageLike) -> SourceRecord:
    """Read a Kafka message once (the producer's W3C trace context included)."""
    ts_type, ts = msg.timestamp()
    headers = _headers(msg.headers())
    traceparent = tracestate = None
    for name, value in headers:
        if name == "traceparent" and value is not None:
            traceparent = value.decode("latin-1")
        elif name == "tracestate" and value is not None:
            tracestate = value.decode("latin-1")
    return SourceRecord(
        topic=str(msg.topic()),
        partition=int(msg.partition() or 0),
        offset=int(msg.offset() or 0),
        key=_as_bytes(msg.key()),
        value=_as_bytes(msg.value()),
        headers=headers,
        timestamp_ms=ts if ts_type != 0 else None,
        timestamp_type=_TIMESTAMP_TYPES.get(ts_type, "none"),
        traceparent=traceparent,
        tracestate=tracestate,
    )


@dataclass(frozen=True, slots=True)
class CustomDeadLetter:
    """A reject's KIP-1034 custom DLQ record parts: extra headers, and maybe a replacement value."""

    headers: tuple[tuple[str, bytes], ...] = ()
    value: bytes | None = None
    value_set: bool = False  # with value None: a null DLQ value
    topic: str | None = None  # the DLQ topic the app named (the routes' allow-list decides)


class _CustomParts(Protocol):
    @property
    def dlq_headers(self) -> tuple[tuple[str, bytes], ...]: ...
    @property
    def dlq_value(self) -> bytes | None: ...
    @property
    def dlq_value_set(self) -> bool: ...
    @property
    def dlq_topic(self) -> str | None: ...


def custom_dead_letter(answer: _CustomParts) -> CustomDeadLetter | None:
    """The custom DLQ parts of an answer (``wire.Answer`` or ``wire.AckItem``), None without any."""
    if not answer.dlq_headers and not answer.dlq_value_set and answer.dlq_topic is None:
        return None
    return CustomDeadLetter(
        answer.dlq_headers, answer.dlq_value, answer.dlq_value_set, answer.dlq_topic
    )


@dataclass(frozen=True, slots=True)
class TierTrail:
    """A record read back from a retry tier: the tiers it went through (their labels, in order),
    the tier record's own coordinates and its due time (epoch ms)."""

    tiers: tuple[str, ...]
    topic: str
    partition: int
    offset: int
    due_ms: int


class Decoded(NamedTuple):
    """A record's key and value decoded through a Schema Registry: JSON text and the schema read
    with, or the record's own bytes and None for a field that is not decoded."""

    key: bytes | None
    key_schema: SchemaRef | None
    value: bytes | None
    value_schema: SchemaRef | None


@dataclass(slots=True, eq=False)
class Tracked:
    """A record in the sidecar's care, with what was learnt about it on the way.

    ``last_span`` is the OpenTelemetry span context of the latest attempt that did not end the
    record (the DLQ write's span links to it); typed loosely so this module needs no tracing import.
    """

    record: SourceRecord
    custom: CustomDeadLetter | None = None
    last_span: Any = field(default=None)
    # Read from a retry tier (`sidecar.core.tiers`): the tiers it went through, where it was read.
    tier: TierTrail | None = None
    # Records with schemas: the key and value as the app gets them (JSON text, the schema named),
    # decoded once, before the first attempt. The DLQ record still carries `record`'s bytes.
    decoded: Decoded | None = None
