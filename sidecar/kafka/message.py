"""The Kafka record as the consumers hand it over: confluent-kafka's `Message`, named here, and the
one filter that takes a poll's error events out of its records.

The engines annotate what the sources give them (`SourceListener.on_messages`, `ShareListener.on_batch`)
with this name, so they need not import confluent-kafka: everything that touches it lives under
`sidecar.kafka`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, Message


def records_of(
    messages: Iterable[Message],
    refuse: Callable[[KafkaError], BaseException | None],
    log: logging.Logger,
    what: str,
) -> list[Message]:
    """The records of a poll, in order. An error event is skipped (end of a partition) or logged as
    `what` error, unless `refuse` turns it into an exception, which is raised (the poll loop ends)."""
    good: list[Message] = []
    for msg in messages:
        err = msg.error()
        if err is None:
            good.append(msg)
            continue
        if err.code() == KafkaError._PARTITION_EOF:
            continue
        if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            # A subscribed topic the cluster does not have: said once, in the sidecar's words and
            # with a likely spelling, by sidecar.engines.source_topics (and /readyz), not here.
            continue
        exc = refuse(err)
        if exc is not None:
            raise exc
        log.warning("%s error: %s", what, err)
    return good


__all__ = ["Message", "records_of"]
