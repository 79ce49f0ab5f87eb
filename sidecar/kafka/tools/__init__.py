"""The Kafka clients of the operator tools (`sidecar.ops`: `dlq inspect`, `dlq replay`, the console, the
demo): blocking calls with timeouts, no trio, every `KafkaException` translated into `KafkaCallError`.

    records   `ReadRecord`: a record read back, copied out of librdkafka's `Message`
    reader    `ReadConsumer`: the read-only consumer (assign, never commits on its own,
              read_committed), partitions, watermarks, a group's committed offsets and commits, and
              a read bounded by the watermarks seen at start
    fetch     `OffsetFetcher`: one record read back from a topic at an offset, telling "found",
              "gone for good" and "not readable now" apart
    producer  `ToolProducer`: an idempotent acks=all producer whose deliveries come back as texts
    admin     `TopicAdmin`: topic names and partition counts, delete, create (the demo, the console)

The tools above may import these; these import the pure core, the log summary
(`sidecar.kafka.logsummary`: an unreachable broker is one line, not hundreds) and confluent-kafka
only, never `sidecar.ops`, the engines or the service.
"""

from __future__ import annotations

from sidecar.kafka.errors import KafkaCallError
from sidecar.kafka.tools.admin import TopicAdmin
from sidecar.kafka.tools.fetch import Fetched, OffsetFetcher
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
]
