"""The consumer's librdkafka properties, the broker errors that mean the cluster is unusable, and the
start-up metadata check (:mod:`sidecar.kafka.source` runs the consumer itself).

Owns which properties the sidecar sets for the user (`consumer_properties`: the byte budget's part,
cooperative-sticky, the owned offset-store settings), which librdkafka errors say why a cluster cannot
be used (`broker_error_reason`), and `check_cluster_sync`, run before anything joins the group, and
`missing_topics_sync` (which source topics the cluster does not have).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from sidecar.config.suggest import closest
from sidecar.core.budget import split_budget
from sidecar.kafka.errors import kafka_error
from sidecar.kafka.logsummary import connection_problem, librdkafka_logger

# librdkafka postpones a partition's next fetch by `fetch.queue.backoff.ms` whenever its prefetch
# queue is over `queued.min.messages` or `queued.max.messages.kbytes`: 1,000 ms unless set
# (librdkafka's CHANGELOG, v2.2.0). The sidecar sizes that queue from `max.buffered.bytes` (a
# quarter: 16 MiB by default), which a backlog fills and the sidecar drains in a fraction of a
# second, so every fill would leave the partition unfetched for the rest of that second: a backlog
# larger than the budget would go at what the queue holds per second (figures in
# docs/benchmarks.md). Re-checked every 10 ms instead, the queue is refilled as it drains; while it
# stays full, a check sends no request.
FETCH_QUEUE_BACKOFF_MS = 10

# Properties the sidecar must own: it stores offsets and commits them itself, with metadata.
OWNED_PROPERTIES = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}


# librdkafka's errors that mean the cluster cannot be used from here, and what to check. An
# authentication or TLS failure is retried by librdkafka like a network one, forever and quietly
# apart from its own log: the reason is kept so readiness can say why, instead of only "down".
_BROKER_ERROR_HINTS = {
    KafkaError._AUTHENTICATION: (
        "authentication failed (check sasl.mechanism, sasl.username and sasl.password)"
    ),
    KafkaError._SSL: (
        "TLS failed (check ssl.ca.location, the broker's certificate and any client certificate)"
    ),
    KafkaError._TRANSPORT: "cannot connect to the broker (check bootstrap.servers and security.protocol)",
}


# Of those, the ones that are not a network blip: librdkafka retries them, but they last.
NOT_TRANSIENT = (KafkaError._AUTHENTICATION, KafkaError._SSL)


def broker_error_reason(err: KafkaError) -> str | None:
    """Why the cluster is unusable, for logs and readiness, or None when `err` does not say so."""
    hint = _BROKER_ERROR_HINTS.get(err.code())
    return f"{hint}: {err.str()}" if hint is not None else None


def consumer_properties(
    kafka: Mapping[str, Any], max_buffered_bytes: int | None = None
) -> dict[str, Any]:
    """The consumer's librdkafka properties: the user's `kafka:`, our defaults, the owned ones.

    Our defaults, each overridden by the user's `kafka:`: `auto.offset.reset: earliest` and
    `fetch.queue.backoff.ms` (`FETCH_QUEUE_BACKOFF_MS`).

    librdkafka prefetches up to 64 MiB by default (`queued.max.messages.kbytes`, one queue for the
    whole consumer) plus a fetch response of up to 50 MiB (`fetch.max.bytes`) on top of what the
    ledgers hold: both are derived from `max.buffered.bytes` instead (a quarter and an eighth, see
    `sidecar.core.budget`), unless the user sets them under `kafka:`. None: no budget (a client
    that fetches no records, such as the start-up metadata check).
    """
    props: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }
    if max_buffered_bytes is not None:
        props.update(split_budget(max_buffered_bytes, kafka).derived)
    props.update(kafka)
    props.update(OWNED_PROPERTIES)
    if str(props.get("group.protocol", "classic")) == "classic":
        # Incremental rebalances keep the partitions that stay put flowing during a rebalance.
        props.setdefault("partition.assignment.strategy", "cooperative-sticky")
    return props


# librdkafka's default `fetch.wait.max.ms` (its CONFIGURATION.md).
FETCH_WAIT_MAX_MS_DEFAULT = 500


def fetch_wait_max_ms(kafka: Mapping[str, Any]) -> int:
    """How long the broker may hold the consumer's fetch when nothing new is there: the user's
    `fetch.wait.max.ms` (an integer in librdkafka's range: the config check refused any other),
    else librdkafka's default."""
    return int(str(kafka.get("fetch.wait.max.ms", FETCH_WAIT_MAX_MS_DEFAULT)))


def check_cluster_sync(
    kafka: Mapping[str, Any], timeout_s: float = 10.0, stop: threading.Event | None = None
) -> str | None:
    """Ask the cluster for its metadata with the sidecar's client settings (blocking).

    `stop`, once set, ends the wait within about a second (a SIGTERM while the cluster cannot be
    used); the answer is then the reason known so far.

    Returns None when it answered, else why not: the authentication or TLS failure librdkafka
    reported, or the connection failure. Run before anything joins the group or writes, so a wrong
    password or CA is reported (and retried) instead of failing a start-up check that exits.
    """
    errors: list[KafkaError] = []
    props = consumer_properties(kafka)
    props["error_cb"] = errors.append
    try:
        consumer = Consumer(props, logger=librdkafka_logger())
    except KafkaException:
        return None  # settings only the real client takes: it reports its own errors
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                consumer.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                return None
            except KafkaException as exc:
                err = kafka_error(exc)
                consumer.poll(0)  # serves the error callbacks, which say why the request failed
                causes = [e for e in errors if e.code() in NOT_TRANSIENT]
                stopping = stop is not None and stop.is_set()
                if not causes and time.monotonic() < deadline and not stopping:
                    continue  # nothing definite yet: the broker may still be starting
                cause = causes[-1] if causes else err
                reason = broker_error_reason(cause) if cause is not None else None
                said = connection_problem()
                if said is not None and (cause is None or cause.code() == KafkaError._TRANSPORT):
                    reason = said  # which broker, and why: its name, a refusal, no answer
                return reason or f"cannot read the cluster's metadata: {exc}"
    finally:
        consumer.close()


__all__ = [
    "FETCH_QUEUE_BACKOFF_MS",
    "NOT_TRANSIENT",
    "OWNED_PROPERTIES",
    "broker_error_reason",
    "check_cluster_sync",
    "consumer_properties",
]


def missing_topics_sync(
    kafka: Mapping[str, Any], topics: Sequence[str], timeout_s: float = 10.0
) -> dict[str, str | None] | None:
    """Which of `topics` the cluster does not have (blocking), each with the cluster's topic it
    most likely misspells (None: none is close); None when the cluster did not answer.

    Asked with the sidecar's client settings, like `check_cluster_sync`; a topic the metadata
    answer lists with an error other than "unknown topic" (e.g. not authorised) counts as present:
    the consumer reports that itself.
    """
    consumer = Consumer(consumer_properties(kafka), logger=librdkafka_logger())
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException:
        return None
    finally:
        consumer.close()
    missing: dict[str, str | None] = {}
    existing = [
        name
        for name, found in metadata.topics.items()
        if found.error is None and not name.startswith("__")  # not Kafka's internal topics
    ]
    for topic in topics:
        found = metadata.topics.get(topic)
        unknown = found is None or (
            found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        if unknown:
            missing[topic] = closest(topic, existing, typos_only=True)
    return missing
