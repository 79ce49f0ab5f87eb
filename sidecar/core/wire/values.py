"""The wire's vocabulary: answer and ack words, limits, `WireError`, and the frozen values the
parsers and formatters take and return (`RecordView`, `AppError`, `Answer`, `AckItem`).

Pure functions and frozen values (see `sidecar.core.wire`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias

from sidecar.core.errors import SidecarError
from sidecar.core.outcome import MALFORMED_ANSWER  # the error class's one home, re-exported

__all__ = [
    "ACK_REQUEST_WORDS",
    "ANSWER_ACKS",
    "MALFORMED_ANSWER",
    "MAX_RETRY_AFTER_MS",
    "ROUTE_MISSING",
    "ROUTE_MISSING_STATUSES",
    "AckItem",
    "AckRequestWord",
    "AckWord",
    "Answer",
    "AppError",
    "HeaderList",
    "RecordView",
    "SchemaRef",
    "WireError",
]

AckWord: TypeAlias = Literal["accept", "release", "reject", "deferred"]
AckRequestWord: TypeAlias = Literal["accept", "release", "reject", "renew"]
HeaderList: TypeAlias = Sequence[tuple[bytes, bytes]]

# The words an app may put in a JSON answer; "deferred" is only reachable through status 202
# (or a status mapping), because a JSON body *is* an answer and so cannot defer one.
ANSWER_ACKS: frozenset[str] = frozenset({"accept", "release", "reject"})
STATUS_ACKS: frozenset[str] = frozenset({"accept", "release", "reject", "deferred"})
# A status mapping's word for "the app has no such route" (the URL is wrong, not the record), and
# the statuses that mean it by default when the body carries no JSON answer: what web frameworks
# answer for a path (404), a method (405) or a content type (415) they do not serve.
ROUTE_MISSING = "route-missing"
ROUTE_MISSING_STATUSES: frozenset[int] = frozenset({404, 405, 415})
ACK_REQUEST_WORDS: frozenset[str] = frozenset({"accept", "release", "reject", "renew"})

# A Retry-After far in the future is almost always a bug on the app side (a date in the wrong
# zone, ms sent as s); capping keeps one record from stalling its key for hours.
MAX_RETRY_AFTER_MS = 600_000
# The message of a synthesised HttpStatusNNN error: enough to recognise the failure in the DLQ
# headers, small enough that an HTML error page does not bloat them.
STATUS_MESSAGE_CHARS = 200


class WireError(SidecarError, ValueError):
    """Input to a wire parser or formatter is malformed; the message says where.

    The app's *answers* never raise: a malformed answer is a release carrying a
    ``sidecar.MalformedAnswer`` error.
    """


class SchemaRef(NamedTuple):
    """The schema a key or value was decoded with (records with schemas): it is JSON text now."""

    subject: str
    version: int
    schema_id: int
    schema_type: str  # AVRO | PROTOBUF | JSON


class RecordView(NamedTuple):
    """What the wire needs of one delivery attempt of one Kafka record.

    A named tuple, not a dataclass: one is built per attempt, and a tuple is built about four
    times faster (it is as immutable).
    """

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
    # Set when the key / value was decoded through a Schema Registry: `key` / `value` are JSON text.
    key_schema: SchemaRef | None = None
    value_schema: SchemaRef | None = None


@dataclass(frozen=True, slots=True)
class AppError:
    """The app's (or the sidecar's) account of why a record failed; feeds ``__dlq.errors.*``.

    An empty ``class_name`` or ``message`` means the app did not say.
    """

    class_name: str
    message: str
    stacktrace: str | None = None
    cause_class: str | None = None  # the class of the error's cause (``error.cause_class``)


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
    dlq_topic: str | None = None  # the DLQ topic a reject names (allowed only from a list)


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
    dlq_topic: str | None = None


def is_header_safe(text: str) -> bool:
    # Visible ASCII plus space, no CR/LF/TAB: anything else could split or smuggle headers.
    return text.isascii() and text.isprintable()
