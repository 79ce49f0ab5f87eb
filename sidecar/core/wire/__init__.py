"""The HTTP wire contract between the sidecar and the application (docs/app-contract.md), sans-IO.

This package owns the exact bytes of the requests the sidecar sends to the app (single and batch
mode, in the sidecar's raw format or as CloudEvents: binary mode for one record, the JSON batch
format for many), the interpretation of the app's answers into acks (the same for both formats),
and the parsing of the sidecar's own ``POST /v1/acks`` body. ``openapi.yaml`` at the repository root documents the same contract and
``tests/unit/test_wire.py`` checks the two against each other.

Pure functions and frozen values only: no sockets, no trio, no Kafka, no logging. The one clock
read (an HTTP-date ``Retry-After``) can be pinned by the caller through ``now_epoch_s``. It imports
nothing of ``sidecar`` outside `sidecar.core`, so every layer can depend on it.

Errors::

    WireError(ValueError)   malformed input to a parser here (the ack API body, a bad header
                            value handed to a formatter); the app's *answers* never raise —
                            a malformed answer is a release carrying a
                            ``sidecar.MalformedAnswer`` error.

Every string a parser returns that will become bytes later (a DLQ header name or value, an
error's class, message or stack trace, a delivery id) is checked here to have a UTF-8 encoding:
JSON's ``\\ud800`` escape is valid JSON but a lone surrogate, which no encoder accepts, and the
DLQ producer must never be handed one.

One module a part of the contract::

    values        words, limits, WireError, RecordView, SchemaRef, AppError, Answer, AckItem
    requests      single and batch request bytes, X-Kafka-* header encodings, the pull response
    cloudevents   app.format: cloudevents (binary mode, the JSON batch format)
    answers       the app's answers interpreted into Answer values
    acks          the sidecar's own POST /v1/acks body and response

Import the public names from here.
"""

from __future__ import annotations

from sidecar.core.wire.acks import (
    format_ack_response,
    parse_ack_request,
)
from sidecar.core.wire.answers import (
    interpret_batch,
    interpret_single,
    parse_retry_after_ms,
    route_missing,
    validate_status_mapping,
)
from sidecar.core.wire.cloudevents import (
    CLOUDEVENTS_BATCH_CONTENT_TYPE,
    CLOUDEVENTS_BATCH_EXTENSIONS,
    CLOUDEVENTS_SPECVERSION,
    CloudEventsFormat,
    cloudevent_attributes,
    cloudevents_time,
    format_cloudevents_batch_body,
    is_structured_content_type,
)
from sidecar.core.wire.requests import (
    decode_kafka_header,
    decode_key,
    encode_kafka_header,
    format_batch_request,
    format_pull_response,
    format_single_request,
)
from sidecar.core.wire.values import (
    ACK_REQUEST_WORDS,
    ANSWER_ACKS,
    MALFORMED_ANSWER,
    MAX_RETRY_AFTER_MS,
    ROUTE_MISSING,
    ROUTE_MISSING_STATUSES,
    AckItem,
    AckWord,
    Answer,
    AppError,
    RecordView,
    SchemaRef,
    WireError,
)

__all__ = [
    "ACK_REQUEST_WORDS",
    "ANSWER_ACKS",
    "CLOUDEVENTS_BATCH_CONTENT_TYPE",
    "CLOUDEVENTS_BATCH_EXTENSIONS",
    "CLOUDEVENTS_SPECVERSION",
    "MALFORMED_ANSWER",
    "MAX_RETRY_AFTER_MS",
    "ROUTE_MISSING",
    "ROUTE_MISSING_STATUSES",
    "AckItem",
    "AckWord",
    "Answer",
    "AppError",
    "CloudEventsFormat",
    "RecordView",
    "SchemaRef",
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
    "route_missing",
    "validate_status_mapping",
]
