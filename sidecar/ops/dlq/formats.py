"""Which system wrote a DLQ record, and its context headers decoded into the fields every format shares.

Owns `detect_format` and `decode_context` (the four formats, dlq, streams, connect and spring, and their
headers: its docstring), `DlqContext`, and what a replay strips. Anything else is `unknown` and shown
as it is. Pure: no broker calls.

Imports: the standard library, the header names of `sidecar.kafka.dlq` and of `sidecar.core.tiers` only.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.core import tiers  # a retry tier record's header names (`__dlq.retry.*`)
from sidecar.kafka import dlq  # the dlq format's header names: dlq.H_TOPIC, ...
from sidecar.kafka.dlq import DLQ_HEADER_PREFIX, REPLAY_HEADER_PREFIX

Header = tuple[str, bytes | None]

FORMAT_DLQ = "dlq"
FORMAT_STREAMS = "streams"
FORMAT_CONNECT = "connect"
FORMAT_SPRING = "spring"
FORMAT_UNKNOWN = "unknown"
FORMATS = (FORMAT_DLQ, FORMAT_STREAMS, FORMAT_CONNECT, FORMAT_SPRING, FORMAT_UNKNOWN)

WRITERS = {
    FORMAT_DLQ: "dlq-sidecar or a Kafka share group (KIP-1191)",
    FORMAT_STREAMS: "Kafka Streams (KIP-1034)",
    FORMAT_CONNECT: "Kafka Connect (KIP-298)",
    FORMAT_SPRING: "Spring Kafka DeadLetterPublishingRecoverer",
    FORMAT_UNKNOWN: "unknown (no known DLQ context headers)",
}

DLQ_CONTEXT_PREFIX = "__dlq.errors."
STREAMS_PREFIX = "__streams.errors."
CONNECT_PREFIX = "__connect.errors."
SPRING_PREFIX = "kafka_dlt-"

# Which header-name prefix marks which format's context.
_PREFIXES = (
    (DLQ_CONTEXT_PREFIX, FORMAT_DLQ),
    (tiers.RETRY_HEADER_PREFIX, FORMAT_DLQ),  # a retry tier's record (sidecar.core.tiers)
    (STREAMS_PREFIX, FORMAT_STREAMS),
    (CONNECT_PREFIX, FORMAT_CONNECT),
    (SPRING_PREFIX, FORMAT_SPRING),
)

# What a replay drops from a DLQ record's headers before adding its own markers: the writer's context (ours:
# the whole `__dlq.` namespace) and the previous replay markers, which it puts back counted up.
REPLAY_STRIP_PREFIXES = {
    FORMAT_DLQ: (DLQ_HEADER_PREFIX,),
    FORMAT_STREAMS: (STREAMS_PREFIX, REPLAY_HEADER_PREFIX),
    FORMAT_CONNECT: (CONNECT_PREFIX, REPLAY_HEADER_PREFIX),
    FORMAT_SPRING: (SPRING_PREFIX, REPLAY_HEADER_PREFIX),
    FORMAT_UNKNOWN: (REPLAY_HEADER_PREFIX,),
}

# Kafka Streams (org.apache.kafka.streams.errors.internals.ExceptionHandlerUtils).
S_EXCEPTION = STREAMS_PREFIX + "exception"
S_MESSAGE = STREAMS_PREFIX + "message"
S_TOPIC = STREAMS_PREFIX + "topic"
S_PARTITION = STREAMS_PREFIX + "partition"
S_OFFSET = STREAMS_PREFIX + "offset"
# Kafka Connect (org.apache.kafka.connect.runtime.errors.DeadLetterQueueReporter).
C_TOPIC = CONNECT_PREFIX + "topic"
C_PARTITION = CONNECT_PREFIX + "partition"
C_OFFSET = CONNECT_PREFIX + "offset"
C_CONNECTOR = CONNECT_PREFIX + "connector.name"
C_TASK = CONNECT_PREFIX + "task.id"
C_STAGE = CONNECT_PREFIX + "stage"
C_CLASS = CONNECT_PREFIX + "class.name"
C_EXC_CLASS = CONNECT_PREFIX + "exception.class.name"
C_EXC_MESSAGE = CONNECT_PREFIX + "exception.message"
# Spring for Apache Kafka (org.springframework.kafka.support.KafkaHeaders, DeadLetterRecordManager).
SP_TOPIC = SPRING_PREFIX + "original-topic"
SP_PARTITION = SPRING_PREFIX + "original-partition"
SP_OFFSET = SPRING_PREFIX + "original-offset"
SP_TIMESTAMP = SPRING_PREFIX + "original-timestamp"
SP_TIMESTAMP_TYPE = SPRING_PREFIX + "original-timestamp-type"
SP_GROUP = SPRING_PREFIX + "original-consumer-group"
SP_EXC_CLASS = SPRING_PREFIX + "exception-fqcn"
SP_CAUSE_CLASS = SPRING_PREFIX + "exception-cause-fqcn"
SP_EXC_MESSAGE = SPRING_PREFIX + "exception-message"
SP_KEY_EXC_CLASS = SPRING_PREFIX + "key-exception-fqcn"
SP_KEY_EXC_MESSAGE = SPRING_PREFIX + "key-exception-message"


@dataclass(frozen=True, slots=True)
class DlqContext:
    """A DLQ record's context in the fields every format shares; None where the format does not say."""

    format: str = FORMAT_UNKNOWN
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    exception_class: str | None = None
    exception_message: str | None = None
    cause_class: str | None = (
        None  # Spring: the root cause's class; ours: the app's error.cause_class
    )
    cause: str | None = None  # ours: Kafka 4.4's cause text
    group: str | None = None  # consumer group (ours, Spring) or connector name (Connect)
    detail: str | None = None  # Connect: task, stage and executing class
    delivery_count: int | None = None
    source_timestamp_ms: int | None = None  # Spring: the original record's timestamp
    # Why the writer gave up, where it says: ours and share groups' cause text (`__dlq.errors.message`),
    # Connect's stage; None for Streams and Spring, which record only the exception.
    reason: str | None = None

    @property
    def writer(self) -> str:
        return WRITERS[self.format]

    @property
    def names_source(self) -> bool:
        """True when the context says which topic and partition the record came from."""
        return self.source_topic is not None and self.source_partition is not None


def _values(headers: Sequence[Header], name: str) -> list[bytes | None]:
    return [v for n, v in headers if n == name]


def _first(headers: Sequence[Header], name: str) -> bytes | None:
    found = _values(headers, name)
    return found[0] if found else None


def _last(headers: Sequence[Header], name: str) -> bytes | None:
    found = _values(headers, name)
    return found[-1] if found else None


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _decimal(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _coordinate(value: int | None) -> int | None:
    """Connect and Streams write -1 when there was no input record (a punctuator): not a coordinate."""
    return value if value is not None and value >= 0 else None


def _nonempty(text: str | None) -> str | None:
    return text if text else None


def _big_endian(value: bytes | None, size: int) -> int | None:
    """Spring's binary int (4 bytes) or long (8 bytes), big-endian and signed; decimal text is accepted too."""
    if value is None:
        return None
    if len(value) == size:
        return int(struct.unpack(">i" if size == 4 else ">q", value)[0])
    return _decimal(value)


def detect_format(headers: Sequence[Header]) -> str:
    """The format of the last context header: each writer appends its context after the copied headers."""
    for name, _value in reversed(headers):
        for prefix, fmt in _PREFIXES:
            if name.startswith(prefix):
                return fmt
    return FORMAT_UNKNOWN


def decode_context(headers: Sequence[Header]) -> DlqContext:
    """The context of a DLQ record from its headers; `unknown` (all None) when no format is recognised.

    Four DLQ formats are recognised per record (one DLQ topic may mix them); the header names and encodings
    are those of the writers' own code (checked against Kafka 4.4.0 and Spring for Apache Kafka 4.1.2, and
    exercised against the real writers by tests/integration/test_dlq_*.py):

        dlq      dlq-sidecar and Kafka share groups (KIP-1191): `__dlq.errors.*`, UTF-8 text, numbers in
                 decimal; the writer overwrites same-named headers, so the last value counts
        streams  Kafka Streams (KIP-1034, `errors.dead.letter.queue.topic.name`): `__streams.errors.exception`
                 (the class name; Kafka 4.2 wrote `Throwable.toString()`, class and message), `.message`,
                 `.stacktrace`, `.topic`, `.partition`, `.offset` as UTF-8 text, appended after the copied
                 original headers (the last value counts); a punctuator's record has no topic and -1/-1
        connect  Kafka Connect sink DLQs (KIP-298, `errors.deadletterqueue.context.headers.enable`):
                 `__connect.errors.topic`, `.partition`, `.offset`, `.connector.name`, `.task.id`, `.stage`,
                 `.class.name`, `.exception.class.name`, `.exception.message`, `.exception.stacktrace` as UTF-8
                 text; Connect never replaces a header already there, so the first value counts
        spring   Spring's DeadLetterPublishingRecoverer: `kafka_dlt-original-topic` (UTF-8),
                 `-original-partition` (4-byte big-endian int), `-original-offset` and `-original-timestamp`
                 (8-byte big-endian longs), `-original-timestamp-type`, `-original-consumer-group`,
                 `kafka_dlt-exception-fqcn`, `-exception-cause-fqcn`, `-exception-message`,
                 `-exception-stacktrace` (and `kafka_dlt-key-exception-*` for a key that failed to
                 deserialize); the original headers are appended again on every further dead-lettering, so
                 the first value is the first source

    The format is that of the last recognised context header: every writer appends its context after the
    original headers it copies. Anything else is `unknown` and shown as it is. Pure: no broker calls.

    A retry tier's record (`__dlq.retry.*`, `sidecar.core.tiers`) reads as the dlq format: its source, count and
    last error, and in `detail` the tiers it went through and its due time; a DLQ record written after tiers
    names them in `detail` too (`__dlq.errors.retry.tiers`).
    """
    fmt = detect_format(headers)
    if fmt == FORMAT_DLQ and _last(headers, tiers.H_DUE) is not None:
        return _tier_context(headers)
    if fmt == FORMAT_DLQ:
        passed = _text(_last(headers, tiers.TIERS_HEADER))
        return DlqContext(
            detail=f"after retry tiers {passed}" if passed else None,
            format=fmt,
            source_topic=_text(_last(headers, dlq.H_TOPIC)),
            source_partition=_decimal(_last(headers, dlq.H_PARTITION)),
            source_offset=_decimal(_last(headers, dlq.H_OFFSET)),
            exception_class=_text(_last(headers, dlq.H_EXC_CLASS)),
            exception_message=_text(_last(headers, dlq.H_EXC_MESSAGE)),
            cause_class=_text(_last(headers, dlq.H_EXC_CAUSE_CLASS)),
            cause=_text(_last(headers, dlq.H_MESSAGE)),
            reason=_text(_last(headers, dlq.H_MESSAGE)),
            group=_text(_last(headers, dlq.H_GROUP)),
            delivery_count=_decimal(_last(headers, dlq.H_DELIVERY_COUNT)),
        )
    if fmt == FORMAT_STREAMS:
        exception = _text(_last(headers, S_EXCEPTION))
        # Kafka 4.2 wrote `Throwable.toString()` ("class: message"); later versions the class name alone.
        exc_class = exception.partition(":")[0].strip() if exception else None
        return DlqContext(
            format=fmt,
            source_topic=_nonempty(_text(_last(headers, S_TOPIC))),
            source_partition=_coordinate(_decimal(_last(headers, S_PARTITION))),
            source_offset=_coordinate(_decimal(_last(headers, S_OFFSET))),
            exception_class=exc_class or None,
            exception_message=_text(_last(headers, S_MESSAGE)),
        )
    if fmt == FORMAT_CONNECT:
        task = _text(_first(headers, C_TASK))
        stage = _text(_first(headers, C_STAGE))
        executing = _text(_first(headers, C_CLASS))
        detail = ", ".join(
            part
            for part in (
                f"task {task}" if task is not None else None,
                f"stage {stage}" if stage is not None else None,
                executing,
            )
            if part
        )
        return DlqContext(
            format=fmt,
            source_topic=_nonempty(_text(_first(headers, C_TOPIC))),
            source_partition=_coordinate(_decimal(_first(headers, C_PARTITION))),
            source_offset=_coordinate(_decimal(_first(headers, C_OFFSET))),
            exception_class=_text(_first(headers, C_EXC_CLASS)),
            exception_message=_text(_first(headers, C_EXC_MESSAGE)),
            group=_text(_first(headers, C_CONNECTOR)),
            detail=detail or None,
            reason=f"stage {stage}" if stage else None,
        )
    if fmt == FORMAT_SPRING:
        exc_class = _text(_last(headers, SP_EXC_CLASS)) or _text(_last(headers, SP_KEY_EXC_CLASS))
        message = _text(_last(headers, SP_EXC_MESSAGE)) or _text(_last(headers, SP_KEY_EXC_MESSAGE))
        ts_type = _text(_first(headers, SP_TIMESTAMP_TYPE))
        return DlqContext(
            format=fmt,
            source_topic=_text(_first(headers, SP_TOPIC)),
            source_partition=_big_endian(_first(headers, SP_PARTITION), 4),
            source_offset=_big_endian(_first(headers, SP_OFFSET), 8),
            exception_class=exc_class,
            exception_message=message,
            cause_class=_text(_last(headers, SP_CAUSE_CLASS)),
            group=_text(_first(headers, SP_GROUP)),
            detail=f"source timestamp type {ts_type}" if ts_type else None,
            source_timestamp_ms=_big_endian(_first(headers, SP_TIMESTAMP), 8),
        )
    return DlqContext()


def _tier_context(headers: Sequence[Header]) -> DlqContext:
    """A retry tier's record: where it comes from, its count so far, the tiers and its due time."""
    due = _decimal(_last(headers, tiers.H_DUE))
    when = (
        datetime.datetime.fromtimestamp(due / 1000, datetime.UTC).isoformat(timespec="milliseconds")
        if due is not None
        else "?"
    )
    return DlqContext(
        format=FORMAT_DLQ,
        source_topic=_text(_last(headers, tiers.H_TOPIC)),
        source_partition=_decimal(_last(headers, tiers.H_PARTITION)),
        source_offset=_decimal(_last(headers, tiers.H_OFFSET)),
        exception_class=_text(_last(headers, tiers.H_EXC_CLASS)),
        exception_message=_text(_last(headers, tiers.H_EXC_MESSAGE)),
        group=_text(_last(headers, tiers.H_GROUP)),
        delivery_count=_decimal(_last(headers, tiers.H_COUNT)),
        source_timestamp_ms=_decimal(_last(headers, tiers.H_TIMESTAMP)),
        reason="retry tier",
        detail=f"retry tier record: tiers {_text(_last(headers, tiers.H_TIERS))}, due {when}",
    )


# Spring's binary numbers: header name -> size (4: int, 8: long), big-endian and signed.
_SPRING_BINARY = {SP_PARTITION: 4, SP_OFFSET: 8, SP_TIMESTAMP: 8}


def header_display(name: str, value: bytes | None, fmt: str) -> tuple[str, str]:
    """One header's value as a person reads it, and how it was decoded: ("42", "int32") for Spring's
    binary partition, ("...", "text") for printable UTF-8, ("0a ff", "hex") otherwise, ("", "null")."""
    if value is None:
        return "", "null"
    size = _SPRING_BINARY.get(name) if fmt == FORMAT_SPRING else None
    if size is not None and len(value) == size:
        return str(_big_endian(value, size)), "int32" if size == 4 else "int64"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return value.hex(" "), "hex"
    if all(ch.isprintable() or ch in "\t\n\r" for ch in text):
        return text, "text"
    return value.hex(" "), "hex"  # valid UTF-8 but control bytes: a binary value


def strip_context(headers: Sequence[Header], fmt: str) -> list[Header]:
    """The headers a replay restores: all but the writer's context and the old replay markers, in order."""
    prefixes = REPLAY_STRIP_PREFIXES[fmt]
    return [(n, v) for n, v in headers if not n.startswith(prefixes)]
