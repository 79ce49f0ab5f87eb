"""The share engine's Kafka errors: the two start-up refusals, and librdkafka's errors translated.

Owns which `KafkaError` codes mean that share groups cannot work here (`refusal_from_error`) and what
a share consumer's `KafkaException` becomes (`share_error`: a refusal, else a `SourceError` through
`sidecar.kafka.errors.translate`, the adapters' one translator); no state.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from sidecar.kafka.errors import kafka_error, translate
from sidecar.kafka.source import SourceError

# Errors a share consumer reports when the broker or the group cannot serve a share group.
_REFUSAL_CODES = {
    KafkaError.GROUP_ID_NOT_FOUND,
    KafkaError.INCONSISTENT_GROUP_PROTOCOL,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_REQUEST,
}


class ShareGroupsUnavailable(SourceError):
    """The cluster (or this group id) cannot run a share group: the sidecar must not start."""


class ShareGroupLimitUnsafe(SourceError):
    """The group's delivery count limit is unknown, or too low and cannot be raised.

    The broker archives a record on its own once its delivery count reaches the group's limit, with no
    DLQ record; the sidecar must be able to dead-letter before that, so it does not start (exit 1).
    """


def _suggest(reason: str, group: str) -> str:
    return (
        f"share groups are not available for group {group!r}: {reason}. The share engine needs Kafka 4.2+ "
        "with share groups enabled (feature share.version >= 1) and a group.id that is not already a "
        "consumer group; use a fresh group.id, enable share groups, or set engine: consumer"
    )


def refusal_from_error(err: KafkaError) -> str | None:
    """The reason to give when a share consumer error means share groups cannot work here."""
    if err.code() in _REFUSAL_CODES:
        return f"the broker refused the share group ({err.name()}: {err.str()})"
    return None


def share_error(exc: KafkaException, group: str) -> SourceError:
    """A share consumer's error, translated: `ShareGroupsUnavailable` when the broker refused the
    group, else a `SourceError` with librdkafka's name and text."""
    reason = refusal_from_error(kafka_error(exc))
    if reason is not None:
        return ShareGroupsUnavailable(_suggest(reason, group))
    return translate("share consumer error", exc, SourceError, named=True)


__all__ = ["ShareGroupLimitUnsafe", "ShareGroupsUnavailable", "refusal_from_error", "share_error"]
