"""What both engines share about one delivery: the app client and DLQ writer built from the config, the
`RecordView` of a Kafka message, and the span around an attempt.

Must not import either engine (both import this), the source, or the daemon.
"""

from __future__ import annotations

import dataclasses
from typing import cast

from confluent_kafka import Message
from opentelemetry import trace

from sidecar.appclient import AppClient, AppTarget
from sidecar.config import Config
from sidecar.dlq import DlqWriter
from sidecar.tracing import AttemptContext, Tracing
from sidecar.wire import Answer, RecordView

_TIMESTAMP_TYPES = {0: "none", 1: "create", 2: "log-append"}

AttemptSpans = dict[tuple[str, int, int], trace.SpanContext]


def app_client_for(config: Config) -> AppClient:
    app = config.app
    return AppClient(
        AppTarget(
            host=app.host,
            port=app.port,
            unix_path=app.unix_socket,
            path=app.path,
            extra_headers=tuple(app.headers.items()),
            authority=app.authority if app.unix_socket is None else None,
        ),
        max_connections=app.max_in_flight,
        status_mapping={k: str(v) for k, v in app.status_mapping.items()},
    )


def dlq_writer_for(config: Config) -> DlqWriter:
    dlq = config.errors.dlq
    return DlqWriter(
        config.kafka,
        config.group_id,
        copy_record=dlq.copy_record_enable,
        stacktrace_max_bytes=dlq.stacktrace_max_bytes,
        retries_timeout_ms=dlq.produce_retries_timeout_ms,
        auto_create=dlq.auto_create_enable,
        topic_partitions=dlq.topic_partitions,
        topic_replication_factor=dlq.topic_replication_factor,
    )


def key_bytes(msg: Message) -> bytes | None:
    key = msg.key()
    return key.encode() if isinstance(key, str) else key


def value_bytes(msg: Message) -> bytes | None:
    value = msg.value()
    return value.encode() if isinstance(value, str) else value


def message_headers(msg: Message) -> tuple[tuple[str, bytes | None], ...]:
    raw = msg.headers()
    if not raw:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple(
        (str(name), value.encode() if isinstance(value, str) else value) for name, value in items
    )


def record_view(msg: Message, delivery_count: int, delivery_id: str) -> RecordView:
    """What the wire needs of one attempt of `msg` (the producer's trace context included)."""
    ts_type, ts = msg.timestamp()
    headers = message_headers(msg)
    traceparent = tracestate = None
    for name, value in headers:
        if name == "traceparent" and value is not None:
            traceparent = value.decode("latin-1")
        elif name == "tracestate" and value is not None:
            tracestate = value.decode("latin-1")
    return RecordView(
        topic=cast(str, msg.topic()),
        partition=cast(int, msg.partition()),
        offset=cast(int, msg.offset()),
        key=key_bytes(msg),
        value=value_bytes(msg),
        timestamp_ms=ts if ts_type != 0 else None,
        timestamp_type=_TIMESTAMP_TYPES.get(ts_type, "none"),
        headers=headers,
        delivery_count=delivery_count,
        delivery_id=delivery_id,
        traceparent=traceparent,
        tracestate=tracestate,
    )


def start_attempt_span(
    tracing: Tracing, record: RecordView
) -> tuple[RecordView, AttemptContext | None]:
    """Open the attempt's CONSUMER span; the returned record carries its context to the app."""
    if not tracing.enabled:
        return record, None
    actx = tracing.start_attempt(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value_size=len(record.value or b""),
        delivery_count=record.delivery_count,
        delivery_id=record.delivery_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
    )
    return dataclasses.replace(
        record, traceparent=actx.traceparent, tracestate=actx.tracestate
    ), actx


def end_attempt_span(
    actx: AttemptContext | None, record: RecordView, answer: Answer | None, spans: AttemptSpans
) -> None:
    """Close the span with the outcome; remember it while the record may still be archived."""
    if actx is None:
        return
    if answer is None:
        Tracing.end_attempt(
            actx, "not_attempted", "sidecar.AppNotReachable", "the app is not reachable"
        )
        return
    err = answer.error
    Tracing.end_attempt(
        actx, answer.ack, err.class_name if err else None, err.message if err else None
    )
    key = (record.topic, record.partition, record.offset)
    if answer.ack in ("release", "reject", "deferred"):
        spans[key] = actx.span.get_span_context()
    else:
        spans.pop(key, None)
