"""Kafka adapters (confluent-kafka): the consumer driven from trio, the DLQ writer, the share consumers,
the Schema Registry and the operator tools' clients.

Owns every use of confluent-kafka (docs/architecture.md lists the modules); librdkafka's errors are
translated once, in `sidecar.kafka.errors`.

May import `sidecar.core` and `sidecar.config`; never the engines, the HTTP adapters, the service or
`sidecar.ops`.
"""
