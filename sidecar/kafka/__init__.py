"""Kafka adapters (confluent-kafka): the consumer driven from trio, and the DLQ writer.

    source           the consumer: subscribe, the poll loop, commits with metadata, pause/resume,
                     close
    consumer_config  the consumer's properties, the broker errors that make a cluster unusable,
                     the start-up metadata check
    message          the record as the consumers hand it over, and the one filter of a poll's
                     error events
    share/           the share group (engine: share): start-up checks (admin), the share consumers
                     on their threads behind `ShareListener`, their errors
    share_lag        the share group's lag as the sidecar estimates it (high watermarks through the
                     admin client)
    dlq/             the DLQ: records, topics (admin), plain writes (acks=all, idempotent), the
                     transactional protocol (see its `__init__`)
    tools/           the operator tools' blocking clients (`sidecar.ops`): read-only consumer,
                     offset fetch, producer, topic admin
    errors           librdkafka's errors translated, once, for every adapter; `KafkaCallError`

May import `sidecar.core` and `sidecar.config`; never the engines, the HTTP adapters, the service or
`sidecar.ops`.
"""
