"""The HTTP wire contract between the sidecar and the application (docs/app-contract.md), sans-IO.

Owns the exact bytes of the requests sent to the app (single and batch, raw or CloudEvents), the
app's answers read into acks, and the sidecar's own ``POST /v1/acks`` body; every string a parser
returns that will become bytes later is checked for UTF-8 (`sidecar.core.text`). ``openapi.yaml``
documents the same contract (``tests/unit/test_wire.py`` checks the two against each other).

Pure functions and frozen values only: no sockets, no trio, no Kafka, no logging; the one clock read
(an HTTP-date ``Retry-After``) can be pinned. Imports only `sidecar.core`; import names from here.
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
    route_missing_statuses,
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
    "route_missing_statuses",
    "validate_status_mapping",
]
