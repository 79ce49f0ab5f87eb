"""The operator tools' producer: idempotent, acks=all, each delivery reported back as a text.

`send` hands a record to librdkafka (waiting while its queue is full) and calls `on_done(None)` when
the broker confirmed it, or `on_done(reason)` with librdkafka's name and text when it failed; a record
librdkafka refuses outright returns its reason from `send`. Callbacks run inside `poll`, `wait_s` and
`flush`, on the calling thread. Blocking.

Imports confluent-kafka, the pure core and `sidecar.kafka.errors` only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from sidecar.kafka.errors import KafkaCallError, translate
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.tools.records import Header

DeliveryHook = Callable[[str | None], None]


class ToolProducer:
    """An idempotent acks=all producer for `dlq replay`, the console's redrive and the demo."""

    def __init__(
        self,
        props: Mapping[str, Any],
        *,
        linger_ms: int = 5,
        message_timeout_ms: int | None = 30000,
    ) -> None:
        settings: dict[str, Any] = {
            **props,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
        }
        if message_timeout_ms is not None:
            settings["message.timeout.ms"] = message_timeout_ms
        try:
            self._producer = Producer(settings, logger=librdkafka_logger())
        except KafkaException as exc:
            raise translate("cannot create a Kafka producer", exc, KafkaCallError) from exc

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        on_done: DeliveryHook,
    ) -> str | None:
        """Queue one record; None when queued (`on_done` follows), else why librdkafka refused it."""

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            on_done(None if err is None else f"{err.name()}: {err.str()}")

        kwargs: dict[str, Any] = {
            "key": key,
            "value": value,
            "headers": list(headers),
            "on_delivery": on_delivery,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                return str(exc)
        self._producer.poll(0)
        return None

    def poll(self, timeout_s: float = 0) -> None:
        """Serve delivery reports for up to `timeout_s`."""
        self._producer.poll(timeout_s)

    def wait_s(self, seconds: float) -> None:
        """Wait `seconds` (pacing) while serving delivery reports."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._producer.poll(min(left, 0.05))

    def flush(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every queued record; how many are still unconfirmed."""
        return int(self._producer.flush(timeout_s))


__all__ = ["DeliveryHook", "ToolProducer"]
