"""One attempt on its way to the app: the client that sends it, its wire view and its span.

Owns the translation from a :class:`~sidecar.core.record.Tracked` record in the sidecar's care to what the
HTTP layer sends (:func:`attempt_view`, a ``wire.RecordView`` built from the record read once at
intake), the CONSUMER span around the attempt, and the app client built from the configuration.

Must not import either engine, the pipeline, the source or the daemon (the pipeline imports this).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sidecar.config import AppFormat, Config
from sidecar.core.outcome import APP_NOT_REACHABLE, SHUTDOWN
from sidecar.core.record import Tracked
from sidecar.core.wire import Answer, CloudEventsFormat, RecordView
from sidecar.http.appclient import AppClient, AppTarget
from sidecar.telemetry.tracing import AttemptContext, Tracing

__all__ = [
    "AppClientFactory",
    "abandon_attempt_span",
    "app_client_for",
    "attempt_view",
    "end_attempt_span",
]


class AppClientFactory(Protocol):
    """Builds the app client, given the callbacks of whoever reads its answers."""

    def __call__(
        self,
        config: Config,
        *,
        after_round: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> AppClient: ...


def app_client_for(
    config: Config,
    *,
    after_round: Callable[[], None],
    on_error: Callable[[BaseException], None],
) -> AppClient:
    """The app client the configuration asks for; `after_round` runs after each wake-up of its
    reader that completed requests, `on_error` gets an exception an answer's callback raised."""
    app = config.app
    return AppClient(
        AppTarget(
            host=app.host,
            port=app.port,
            unix_path=app.unix_socket,
            path=app.path,
            extra_headers=tuple(app.headers.items()),
            authority=app.authority if app.unix_socket is None else None,
            cloudevents=CloudEventsFormat(config.cloudevents_source, app.cloudevents_type)
            if app.format is AppFormat.CLOUDEVENTS
            else None,
        ),
        max_connections=app.max_in_flight,
        status_mapping={k: str(v) for k, v in app.status_mapping.items()},
        after_round=after_round,
        on_error=on_error,
    )


def attempt_view(
    tracing: Tracing, tracked: Tracked, delivery_count: int, delivery_id: str
) -> tuple[RecordView, AttemptContext | None]:
    """The wire view of one attempt, and its CONSUMER span (None with tracing off).

    With tracing on, the view carries the attempt span's context to the app instead of the
    producer's (the span is the producer's child). One view per attempt, built once: the span
    comes first so the view is made with the context it carries.
    """
    rec = tracked.record
    actx = tracing.start_attempt(rec, delivery_count, delivery_id) if tracing.enabled else None
    decoded = tracked.decoded  # records with schemas: JSON and the schema, else the bytes
    view = RecordView(
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key if decoded is None else decoded.key,
        value=rec.value if decoded is None else decoded.value,
        timestamp_ms=rec.timestamp_ms,
        timestamp_type=rec.timestamp_type,
        headers=rec.headers,
        delivery_count=delivery_count,
        delivery_id=delivery_id,
        traceparent=rec.traceparent if actx is None else actx.traceparent,
        tracestate=rec.tracestate if actx is None else actx.tracestate,
        key_schema=None if decoded is None else decoded.key_schema,
        value_schema=None if decoded is None else decoded.value_schema,
    )
    return view, actx


def end_attempt_span(actx: AttemptContext | None, tracked: Tracked, answer: Answer | None) -> None:
    """Close the span with the outcome (None: not reachable, not an attempt).

    The span of an attempt that did not end the record is kept on it: the DLQ write links to it.
    """
    if actx is None:
        return
    if answer is None:
        Tracing.end_attempt(actx, "not_attempted", APP_NOT_REACHABLE, "the app is not reachable")
        return
    err = answer.error
    Tracing.end_attempt(
        actx, answer.ack, err.class_name if err else None, err.message if err else None
    )
    if answer.ack in ("release", "reject", "deferred"):
        tracked.last_span = actx.span.get_span_context()
    else:
        tracked.last_span = None


def abandon_attempt_span(actx: AttemptContext | None) -> None:
    """Cancelled (shutdown) or a bug mid-attempt: the span still ends; the lock handles the record."""
    if actx is not None:
        Tracing.end_attempt(actx, "abandoned", SHUTDOWN, "the sidecar stopped mid-attempt")
