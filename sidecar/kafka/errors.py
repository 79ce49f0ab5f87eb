"""librdkafka's errors, translated in one place for every Kafka adapter.

Owns `kafka_error` (the `KafkaError` a `KafkaException` carries), `error_text`, `translate` (the one way
a `KafkaException` becomes one of the sidecar's errors) and `KafkaCallError`. The adapters decide what
an error means for them and translate with these; no other module unpacks a `KafkaException`.

Imports the pure core and confluent-kafka only.
"""

from __future__ import annotations

from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from sidecar.core.errors import KafkaClientError, SidecarError

E = TypeVar("E", bound=SidecarError)


class KafkaCallError(KafkaClientError):
    """A broker call of an operator tool failed (cannot reach, refused, stalled): `dlq` exits 1."""


def kafka_error(exc: KafkaException) -> KafkaError:
    """The `KafkaError` a `KafkaException` carries (librdkafka's), or a generic one."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))


def error_text(exc: KafkaException, *, named: bool = False) -> str:
    """librdkafka's text of `exc` (`NAME: text` when `named`); the exception's own text when it
    carries no `KafkaError`."""
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        return str(exc)
    return f"{err.name()}: {err.str()}" if named else err.str()


def translate(what: str, exc: KafkaException, error: type[E], *, named: bool = False) -> E:
    """`exc` as `error`, its text `what: librdkafka's text` (raise it `from exc`)."""
    return error(f"{what}: {error_text(exc, named=named)}")


__all__ = ["KafkaCallError", "error_text", "kafka_error", "translate"]
