"""The Kafka record as the consumer hands it over: confluent-kafka's `Message`, named here.

The engines annotate what the source gives them (`SourceListener.on_messages`) with this name, so
they need not import confluent-kafka: everything that touches it lives under `sidecar.kafka`.
"""

from __future__ import annotations

from confluent_kafka import Message

__all__ = ["Message"]
