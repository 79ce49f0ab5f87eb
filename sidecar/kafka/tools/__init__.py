"""The Kafka clients of the operator tools (`sidecar.ops`: `dlq inspect`, `dlq replay`, the console, the
demo): blocking calls with timeouts, no trio, every `KafkaException` translated into `KafkaCallError`.

Owns `ReadRecord`, `ReadConsumer`, `OffsetFetcher`, `ToolProducer` and `TopicAdmin` (one module each).

Imports the pure core, the log summary (`sidecar.kafka.logsummary`: an unreachable broker is one line,
not hundreds) and confluent-kafka only, never `sidecar.ops`, the engines or the service.
"""

from __future__ import annotations

from sidecar.kafka.errors import KafkaCallError
from sidecar.kafka.tools.admin import TopicAdmin
from sidecar.kafka.tools.fetch import Fetched, OffsetFetcher, payload_gone
from sidecar.kafka.tools.producer import ToolProducer
from sidecar.kafka.tools.reader import ReadConsumer
from sidecar.kafka.tools.records import Header, ReadRecord

__all__ = [
    "Fetched",
    "Header",
    "KafkaCallError",
    "OffsetFetcher",
    "ReadConsumer",
    "ReadRecord",
    "ToolProducer",
    "TopicAdmin",
    "payload_gone",
]
