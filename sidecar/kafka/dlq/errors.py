"""The DLQ's errors (under `sidecar.core.errors.DlqError`) and which librdkafka errors a DLQ write retries.

Owns which `KafkaError` codes count as retriable for a DLQ write; no state. A `KafkaException` is
unpacked by `sidecar.kafka.errors.kafka_error`, the adapters' one translator. Imports only the pure core
and confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError

from sidecar.core.errors import DlqError


class DlqFatalError(DlqError):
    """A DLQ record could not be written and retrying cannot help: the sidecar must stop."""


class DlqTxnAbortable(DlqError):
    """Transactional mode: the open transaction cannot commit. After `txn_abort()` it may be redone."""


class DlqTxnStuck(DlqTxnAbortable):
    """A transaction call overstayed its watchdog; `txn_abort()` replaces the producer."""


class DlqStartupError(DlqError):
    """A DLQ topic is missing, cannot be created, or cannot be described at start-up."""


def names(parts: Sequence[tuple[str, int]]) -> str:
    """`topic[partition]` for log lines and error texts."""
    return ", ".join(f"{t}[{p}]" for t, p in parts)


RETRIABLE_CODES = {
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
}
